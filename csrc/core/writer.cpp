// The native writer (writer.h): push_done, its thread, its syncer, and writer_* of the module.
#include "writer.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include "attrs_json.h"

namespace maxinstr MAXINSTR_HIDDEN {

NativeWriter writer;

void push_done(const Record& r, PyObject* attrs) {
  completed.records++;
  const bool locked = writer.running;  // the writer takes completed.done concurrently
  if (locked) pthread_mutex_lock(&writer.mu);
  if (UNLIKELY(done_count() >= completed.capacity)) {
    completed.dropped_records++;
    if (locked) pthread_mutex_unlock(&writer.mu);
    return;
  }
  if (attrs && PyDict_GET_SIZE(attrs) > 0) {
    if (UNLIKELY(locked && completed.attrs.size() - completed.attrs_head >= completed.capacity)) {
      writer.counts.dropped_attrs++;  // the Python flusher has not taken attrs for a whole buffer's worth
    } else {
      Py_INCREF(attrs);
      completed.attrs.push_back(AttrEntry{completed.done_pushed, r.id, attrs});
    }
  }
  completed.done.push_back(r);
  completed.done_pushed++;
  if (locked) {
    // A syscall only when the writer sleeps without a timeout (nothing completed for a whole
    // interval) or the threshold is crossed: a busy program pays none.
    if (UNLIKELY(writer.idle)) {
      writer.idle = false;
      writer.counts.wakes++;
      pthread_cond_signal(&writer.cv);
    } else if (!writer.signalled && done_count() >= writer.threshold) {
      writer.signalled = true;
      writer.counts.signals++;
      pthread_cond_signal(&writer.cv);
    }
    pthread_mutex_unlock(&writer.mu);
  }
}

size_t writer_done_count() {
  if (!writer.running) return done_count();
  pthread_mutex_lock(&writer.mu);
  size_t n = done_count();
  pthread_mutex_unlock(&writer.mu);
  return n;
}

namespace {

struct timespec at_ns(int64_t t) { return {(time_t)(t / 1000000000LL), (long)(t % 1000000000LL)}; }

// Appends n bytes (`size` advances), else cuts the file back to `size` and returns errno.
int append_all(int fd, const char* p, size_t n, int64_t& size) {
  size_t off = 0;
  while (off < n) {
    ssize_t k = ::write(fd, p + off, n - off);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) {
      int e = k < 0 ? errno : EIO;
      if (off) (void)!ftruncate(fd, size);
      return e;
    }
    off += (size_t)k;
  }
  size += (int64_t)n;
  return 0;
}

void* writer_main(void*) {
  std::vector<Record> batch;
  std::vector<std::string> new_names;
  std::string lines;
  bool took = true;       // the last round took records
  pthread_mutex_lock(&writer.mu);
  for (;;) {
    if (!writer.stop && !writer.signalled && writer.flush_req == writer.flush_done) {
      if (!took) {
        // Nothing completed for a whole interval: sleep until the next record (push_done
        // signals an idle writer), a flush or the stop. An idle session costs no wake-ups.
        writer.idle = true;
        while (writer.idle && !writer.stop && !writer.signalled && writer.flush_req == writer.flush_done)
          pthread_cond_wait(&writer.cv, &writer.mu);
        writer.idle = false;
      } else {
        const struct timespec ts = at_ns(now_ns() + writer.interval_ns);
        pthread_cond_timedwait(&writer.cv, &writer.mu, &ts);  // spurious wakes are harmless
      }
    }
    // take every completed record (the two vectors swap: no copy, no allocation)
    batch.clear();
    size_t n = done_count();
    if (n) {
      if (completed.done_head == 0) {
        std::swap(completed.done, batch);
      } else {
        batch.assign(completed.done.begin() + (ptrdiff_t)completed.done_head, completed.done.end());
        completed.done.clear();
        completed.done_head = 0;
      }
      completed.done_drained += n;
      writer.counts.taken += n;
    }
    writer.signalled = false;
    size_t names_from = writer.names_written, names_to = writer.names.size();
    new_names.assign(writer.names.begin() + (ptrdiff_t)names_from, writer.names.end());
    uint64_t req = writer.flush_req;
    bool stopping = writer.stop;
    bool failed = writer.err != 0;
    pthread_mutex_unlock(&writer.mu);

    // write, without the lock: names first, so every row on disk has its name
    int err = 0;
    const char* err_file = nullptr;
    uint64_t written = 0, dropped = 0;
    if (failed) {
      dropped = n;
    } else {
      if (!new_names.empty()) {
        lines.clear();
        for (size_t i = 0; i < new_names.size(); i++) {
          lines += "{\"id\":";
          lines += std::to_string(names_from + i);
          lines += ",\"s\":\"";
          json_escape_into(lines, new_names[i].data(), new_names[i].size());
          lines += "\"}\n";
        }
        err = append_all(writer.fd_strings, lines.data(), lines.size(), writer.strings_size);
        if (err) err_file = "strings";
      }
      if (!err && n) {
        err = append_all(writer.fd_stages, (const char*)batch.data(), n * sizeof(Record), writer.stages_size);
        if (err) err_file = "stages";
      }
      (err ? dropped : written) = n;
    }
    took = n != 0;
    pthread_mutex_lock(&writer.mu);
    if ((written || !new_names.empty()) && writer.syncing && !writer.dirty) {
      writer.dirty = true;
      pthread_cond_signal(&writer.sync_cv);
    }
    if (err && !writer.err) {
      writer.err = err;
      writer.err_file = (strcmp(err_file, "strings") == 0) ? writer.strings_path : writer.stages_path;
    }
    if (!err && !failed) writer.names_written = names_to;
    writer.counts.rows_written += written;
    writer.counts.rows_dropped += dropped;
    if (n) writer.counts.batches++;
    if ((int64_t)n > writer.counts.max_batch) writer.counts.max_batch = (int64_t)n;
    writer.flush_done = req;
    pthread_cond_broadcast(&writer.done_cv);
    if (stopping) break;
  }
  pthread_mutex_unlock(&writer.mu);
  return nullptr;
}

// The syncer: fsyncs the part's files at most every fsync interval while the writer writes, and
// once more after it stopped (a closed part is on disk).
void* syncer_main(void*) {
  pthread_mutex_lock(&writer.mu);
  int64_t last = now_ns();
  for (;;) {
    while (!writer.dirty && !writer.sync_stop) pthread_cond_wait(&writer.sync_cv, &writer.mu);
    if (!writer.sync_stop) {
      const int64_t due = last + writer.fsync_ns;  // written since: wait until the interval is up
      const struct timespec ts = at_ns(due);
      while (!writer.sync_stop && now_ns() < due) pthread_cond_timedwait(&writer.sync_cv, &writer.mu, &ts);
    }
    const bool work = writer.dirty && writer.err == 0;
    const bool last_round = writer.sync_stop;
    writer.dirty = false;
    const int fs = writer.fd_strings, fd = writer.fd_stages;  // open until the syncer is joined
    pthread_mutex_unlock(&writer.mu);
    if (work) {
      fsync(fs);  // best effort (some file systems cannot); write errors show in the writer
      fsync(fd);
    }
    pthread_mutex_lock(&writer.mu);
    if (work) {
      writer.counts.fsyncs++;
      last = now_ns();
    }
    if (last_round) break;
  }
  pthread_mutex_unlock(&writer.mu);
  return nullptr;
}

void writer_close_fds() {
  if (writer.fd_stages >= 0) close(writer.fd_stages);
  if (writer.fd_strings >= 0) close(writer.fd_strings);
  writer.fd_stages = writer.fd_strings = -1;
}

// Sets *flag under writer.mu, wakes the thread waiting on cv, joins it. `release_gil`: called from Python.
void stop_and_join(bool* flag, pthread_cond_t* cv, pthread_t thread, bool release_gil) {
  pthread_mutex_lock(&writer.mu);
  *flag = true;
  pthread_cond_signal(cv);
  pthread_mutex_unlock(&writer.mu);
  if (release_gil) {
    Py_BEGIN_ALLOW_THREADS pthread_join(thread, nullptr);
    Py_END_ALLOW_THREADS
  } else {
    pthread_join(thread, nullptr);
  }
}

// Stops the thread after a final take-and-write; joins it, then the syncer after its last fsync.
void writer_join(bool release_gil) {
  if (!writer.running) return;
  stop_and_join(&writer.stop, &writer.cv, writer.thread, release_gil);
  writer.running = false;  // from here push_done/drain() no longer lock: the GIL is the lock again
  if (writer.syncing) {  // the last fsync of what the writer wrote, then the files can close
    stop_and_join(&writer.sync_stop, &writer.sync_cv, writer.syncer, release_gil);
    writer.syncing = false;
  }
  writer_close_fds();
}

void writer_at_exit() {  // C atexit: never leave the thread running into static destructors
  writer_join(false);
}

// A new run's requests, flags and counters (writer_start; the child after fork: trivial work only).
void reset_run() {
  writer.stop = writer.sync_stop = writer.dirty = writer.signalled = writer.idle = false;
  writer.flush_req = writer.flush_done = 0;
  writer.names_written = 0;
  writer.counts = {};
  writer.err = 0;
  writer.err_file.clear();
}

void writer_atfork_prepare() { pthread_mutex_lock(&writer.mu); }
// The writer's condition variables; cv waits with CLOCK_MONOTONIC deadlines.
void writer_init_conds() {
  pthread_condattr_t a;
  pthread_condattr_init(&a);
  pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
  pthread_cond_init(&writer.cv, &a);
  pthread_cond_init(&writer.sync_cv, &a);
  pthread_cond_init(&writer.done_cv, nullptr);
  pthread_condattr_destroy(&a);
}

void writer_atfork_parent() { pthread_mutex_unlock(&writer.mu); }
void writer_atfork_child() {
  // Only trivial work: we are inside fork(). The thread did not follow; the files are the parent's.
  pthread_mutex_init(&writer.mu, nullptr);
  writer_init_conds();
  writer.running = false;
  writer.syncing = false;
  reset_run();
  writer_close_fds();
}

int open_append(const std::string& path, int64_t& size) {
  // O_NOFOLLOW: a link planted in a run directory (stages.bin -> ~/.bashrc) is refused;
  // O_NONBLOCK: a FIFO with no reader there fails at once instead of blocking.
  int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, 0644);
  if (fd < 0) return -1;
  int fl = fcntl(fd, F_GETFL);
  if (fl >= 0) fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
  struct stat st;
  size = (fstat(fd, &st) == 0) ? (int64_t)st.st_size : 0;
  return fd;
}

PyObject* py_writer_start(PyObject*, PyObject* args, PyObject* kwargs) {
  static const char* kw[] = {"stages_path", "strings_path", "interval_ms", "threshold", "fsync_interval_s", nullptr};
  const char *sp = nullptr, *np = nullptr;
  double interval_ms = 2.0, fsync_s = 1.0;
  long long threshold = 8192;
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "ss|dLd", (char**)kw, &sp, &np, &interval_ms, &threshold, &fsync_s))
    return nullptr;
  if (writer.running) {
    PyErr_SetString(PyExc_RuntimeError, "the native writer is already running");
    return nullptr;
  }
  if (!(interval_ms > 0) || threshold < 1) {
    PyErr_SetString(PyExc_ValueError, "interval_ms must be > 0 and threshold >= 1");
    return nullptr;
  }
  int64_t ssz = 0, nsz = 0;
  int fs = open_append(sp, ssz);
  if (fs < 0) return PyErr_SetFromErrnoWithFilename(PyExc_OSError, sp);
  int fn = open_append(np, nsz);
  if (fn < 0) {
    close(fs);
    return PyErr_SetFromErrnoWithFilename(PyExc_OSError, np);
  }
  pthread_mutex_lock(&writer.mu);
  writer.fd_stages = fs;
  writer.fd_strings = fn;
  writer.stages_size = ssz;
  writer.strings_size = nsz;
  writer.stages_path = sp;
  writer.strings_path = np;
  writer.interval_ns = (int64_t)(interval_ms * 1e6);
  writer.fsync_ns = fsync_s < 0 ? -1 : (int64_t)(fsync_s * 1e9);
  writer.threshold = (size_t)threshold;
  reset_run();
  pthread_mutex_unlock(&writer.mu);
  // Signals go to the program's threads, never to ours: block them all around the create.
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_BLOCK, &all, &old);
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setstacksize(&attr, 256 * 1024);
  // The syncer first, so the writer finds writer.syncing set. Without one the writer still writes
  // (the SIGKILL bound holds) and only fsync is skipped: not worth failing the session for.
  writer.syncing = writer.fsync_ns >= 0 && pthread_create(&writer.syncer, &attr, syncer_main, nullptr) == 0;
  int rc = pthread_create(&writer.thread, &attr, writer_main, nullptr);
  pthread_attr_destroy(&attr);
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
  if (rc != 0) {
    if (writer.syncing) {
      stop_and_join(&writer.sync_stop, &writer.sync_cv, writer.syncer, false);
      writer.syncing = false;
    }
    writer_close_fds();
    errno = rc;
    return PyErr_SetFromErrno(PyExc_OSError);
  }
  writer.running = true;  // records completed from now on are taken by the writer, not drain()
  Py_RETURN_TRUE;
}

// True: every record completed before the call is written (or dropped after a write error).
PyObject* py_writer_flush(PyObject*, PyObject* args) {
  double timeout_s = 5.0;
  if (!PyArg_ParseTuple(args, "|d", &timeout_s)) return nullptr;
  if (!writer.running) Py_RETURN_FALSE;
  bool ok = true;
  Py_BEGIN_ALLOW_THREADS pthread_mutex_lock(&writer.mu);
  uint64_t req = ++writer.flush_req;
  pthread_cond_signal(&writer.cv);
  struct timespec now;
  clock_gettime(CLOCK_REALTIME, &now);  // done_cv uses the default (realtime) clock
  const struct timespec dl = at_ns((int64_t)now.tv_sec * 1000000000LL + now.tv_nsec + (int64_t)(timeout_s * 1e9));
  while (writer.flush_done < req && !writer.stop) {
    if (pthread_cond_timedwait(&writer.done_cv, &writer.mu, &dl) == ETIMEDOUT) {
      ok = writer.flush_done >= req;
      break;
    }
  }
  pthread_mutex_unlock(&writer.mu);
  Py_END_ALLOW_THREADS if (ok) Py_RETURN_TRUE;
  Py_RETURN_FALSE;
}

PyObject* writer_status_dict(PyObject* = nullptr, PyObject* = nullptr) {
  pthread_mutex_lock(&writer.mu);
  const NativeWriter::Counts c = writer.counts;
  const int e = writer.err;
  const std::string ef = writer.err_file;
  const size_t nw = writer.names_written, pending = writer.running ? done_count() : 0, th = writer.threshold;
  const int64_t iv = writer.interval_ns;
  pthread_mutex_unlock(&writer.mu);
  PyObject* err = e ? Py_BuildValue("(iss)", e, strerror(e), ef.c_str()) : Py_NewRef(Py_None);
  if (!err) return nullptr;
  return Py_BuildValue("{sOsKsKsnsKsKsKsKsKsKsnsLsdsnsN}", "running", writer.running ? Py_True : Py_False, "rows_written",
                       (unsigned long long)c.rows_written, "rows_dropped", (unsigned long long)c.rows_dropped,
                       "names_written", (Py_ssize_t)nw, "batches", (unsigned long long)c.batches, "taken",
                       (unsigned long long)c.taken, "signals", (unsigned long long)c.signals, "wakes",
                       (unsigned long long)c.wakes, "fsyncs", (unsigned long long)c.fsyncs, "dropped_attrs",
                       (unsigned long long)c.dropped_attrs, "pending_records", (Py_ssize_t)pending, "max_batch",
                       (long long)c.max_batch, "interval_ms", (double)iv / 1e6, "threshold", (Py_ssize_t)th, "error", err);
}

PyObject* py_writer_stop(PyObject*, PyObject*) {
  writer_join(true);
  return writer_status_dict();
}

}  // namespace

void writer_init() {  // module init
  writer_init_conds();
  pthread_atfork(writer_atfork_prepare, writer_atfork_parent, writer_atfork_child);
  atexit(writer_at_exit);
}

PyMethodDef writer_methods[] = {
    {"writer_start", (PyCFunction)(void (*)(void))py_writer_start, METH_VARARGS | METH_KEYWORDS,
     "writer_start(stages_path, strings_path, interval_ms=2.0, threshold=8192, fsync_interval_s=1.0) -> True: a "
     "native thread appends completed records (and new names) to these files, without the GIL, until writer_stop()"},
    {"writer_flush", py_writer_flush, METH_VARARGS,
     "writer_flush(timeout_s=5.0) -> bool: wait (GIL released) until every record completed so far is written"},
    {"writer_stop", py_writer_stop, METH_NOARGS, "writer_stop() -> status: final write, join the thread"},
    {"writer_status", writer_status_dict, METH_NOARGS, "writer_status() -> dict of the native writer's counters"},
    {nullptr, nullptr, 0, nullptr}};

}  // namespace maxinstr
