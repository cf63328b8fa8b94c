// The native writer of maxinstr._native (included by native.cpp inside its anonymous namespace,
// after Globals and Record; docs/sessions.md "The native writer").
//
// While a session is open, a thread of ours (not a Python thread: it never takes the GIL) takes
// the completed records out of g.done and appends them to the part's stages.bin with write(2),
// every `interval` (default 2 ms) or as soon as the buffer passes `threshold` records (the
// record-completion path signals a condition variable once per crossing; it makes no syscall
// otherwise). Names new since its last write go to strings.jsonl first, in the reader's format
// ({"id":N,"s":"..."} lines), so a row on disk always has its name. Recording threads that starve
// the Python flusher of the GIL therefore no longer fill the buffer, and a SIGKILL loses only the
// records completed since the last write.
//
// Locking: w.mu guards g.done/g.done_head/g.done_drained while the writer runs (push_done and
// drain() take it only then: `w.running` is read and written with the GIL held), and w.names,
// w's counters and requests always. The writer holds w.mu only to swap buffers and copy new names;
// the write(2) calls happen without it. Attrs stay Python objects: the Python flusher takes them
// through drain(), which returns no records while the writer runs (a record is written once).
//
// fsync happens on a second thread of ours (the syncer), never on the writer's: a SIGKILL loses
// only what was not yet handed to the kernel with write(2) (the page cache survives the process),
// so the loss bound is the writer's write() cadence, and an fsync of a large file (270 ms for
// 72 MB measured) must not stall it. fsync only narrows what a machine crash can lose.
//
// fork: the prepare handler takes w.mu (so the child never inherits it held mid-swap); the child
// gets fresh primitives, no threads, no descriptors (closed: they are the parent's files) and
// writes its own part once its session starts a writer again.

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>

struct NativeWriter {
  pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
  pthread_cond_t cv;       // wakes the writer: threshold crossed, flush asked, stop
  pthread_cond_t done_cv;  // wakes writer_flush() waiters
  pthread_cond_t sync_cv;  // wakes the syncer: something was written while it slept, or stop
  pthread_t thread{};
  pthread_t syncer{};
  bool running = false;    // a writer thread exists (read/written with the GIL held, or at exit)
  bool syncing = false;    // a syncer thread exists (fsync_ns >= 0)
  bool stop = false;
  bool sync_stop = false;  // the writer has stopped: the syncer makes its last fsync and ends
  bool dirty = false;      // written since the syncer's last fsync
  bool signalled = false;  // the completion path signalled since the writer last took a batch
  bool idle = false;       // the writer waits with no timeout: its last round found nothing
  uint64_t flush_req = 0, flush_done = 0;
  int fd_stages = -1, fd_strings = -1;
  int64_t stages_size = 0, strings_size = 0;
  std::string stages_path, strings_path;
  int64_t interval_ns = 2000000;
  int64_t fsync_ns = 1000000000;
  size_t threshold = 8192;
  std::vector<std::string> names;  // UTF-8 of every interned name, by id (appended under mu)
  size_t names_written = 0;        // names [0, names_written) are in this part's strings.jsonl
  uint64_t rows_written = 0, rows_dropped = 0, batches = 0, taken = 0, signals = 0, fsyncs = 0, wakes = 0;
  uint64_t dropped_attrs = 0;      // attrs not kept: the Python flusher had not taken them for `capacity` records
  int64_t max_batch = 0;
  int err = 0;                     // first write error (errno), 0 when none; writing stops then
  std::string err_file;
  int64_t watch = -1;              // steady-state watch: count top-level stages per name up to `watch`
  uint64_t watch_gen = 0;          // bumped by writer_watch(): the writer thread restarts its counts
  int32_t steady_name = -1;
  int64_t steady_ns = 0;
};
NativeWriter w;

// Records in the buffer that wake the writer before its interval is up. Not clamped to the
// capacity: a buffer set smaller than this fills between two timed writes when records come
// faster than capacity / interval (the overflow is counted, as always).
inline size_t writer_threshold() { return w.threshold; }

// Completed records not yet taken (stats()): under w.mu while the writer swaps buffers.
size_t writer_done_count() {
  if (!w.running) return g.done.size() - g.done_head;
  pthread_mutex_lock(&w.mu);
  size_t n = g.done.size() - g.done_head;
  pthread_mutex_unlock(&w.mu);
  return n;
}

// Called by push_done with w.mu held, after the record was added. A syscall only when the
// writer sleeps without a timeout (nothing completed for a whole interval) or the threshold is
// crossed: a busy program pays none, an idle session costs no timer wake-ups.
inline void writer_after_push() {
  if (UNLIKELY(w.idle)) {
    w.idle = false;
    w.wakes++;
    pthread_cond_signal(&w.cv);
  } else if (!w.signalled && g.done.size() - g.done_head >= writer_threshold()) {
    w.signalled = true;
    w.signals++;
    pthread_cond_signal(&w.cv);
  }
}

// The name of a new id, for the writer (intern_name calls it with the GIL held).
inline void writer_add_name(const std::string& utf8) {
  pthread_mutex_lock(&w.mu);
  w.names.push_back(utf8);
  pthread_mutex_unlock(&w.mu);
}

void json_escape_into(std::string& out, const std::string& s) {
  static const char hex[] = "0123456789abcdef";
  for (unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (c < 0x20) {
          out += "\\u00";
          out += hex[c >> 4];
          out += hex[c & 15];
        } else {
          out += (char)c;  // UTF-8 as is (the Python writer's ensure_ascii=False)
        }
    }
  }
}

// Appends n bytes; on any failure cuts the file back to `size` (whole records only) and
// returns errno. `size` advances on success.
int append_all(int fd, const char* p, size_t n, int64_t& size) {
  size_t off = 0;
  while (off < n) {
    ssize_t k = ::write(fd, p + off, n - off);
    if (k < 0) {
      if (errno == EINTR) continue;
      int e = errno;
      if (off) (void)!ftruncate(fd, size);
      return e;
    }
    if (k == 0) {
      if (off) (void)!ftruncate(fd, size);
      return EIO;
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
  std::vector<uint32_t> watch_counts;  // the writer thread's own (see writer_watch)
  uint64_t watch_gen = 0;
  bool took = true;       // the last round took records
  pthread_mutex_lock(&w.mu);
  for (;;) {
    if (!w.stop && !w.signalled && w.flush_req == w.flush_done) {
      if (!took) {
        // Nothing completed for a whole interval: sleep until the next record (push_done
        // signals an idle writer), a flush or the stop. An idle session costs no wake-ups.
        w.idle = true;
        while (w.idle && !w.stop && !w.signalled && w.flush_req == w.flush_done) pthread_cond_wait(&w.cv, &w.mu);
        w.idle = false;
      } else {
        int64_t t = now_ns() + w.interval_ns;
        struct timespec ts;
        ts.tv_sec = (time_t)(t / 1000000000LL);
        ts.tv_nsec = (long)(t % 1000000000LL);
        pthread_cond_timedwait(&w.cv, &w.mu, &ts);  // spurious wakes are harmless
      }
    }
    // take every completed record (the two vectors swap: no copy, no allocation)
    batch.clear();
    size_t n = g.done.size() - g.done_head;
    if (n) {
      if (g.done_head == 0) {
        std::swap(g.done, batch);
      } else {
        batch.assign(g.done.begin() + (ptrdiff_t)g.done_head, g.done.end());
        g.done.clear();
        g.done_head = 0;
      }
      g.done_drained += n;
      w.taken += n;
    }
    w.signalled = false;
    size_t names_from = w.names_written, names_to = w.names.size();
    new_names.assign(w.names.begin() + (ptrdiff_t)names_from, w.names.end());
    uint64_t req = w.flush_req;
    bool stopping = w.stop;
    int64_t watch = w.watch;
    if (w.watch_gen != watch_gen) {
      watch_gen = w.watch_gen;
      watch_counts.clear();
    }
    bool failed = w.err != 0;
    pthread_mutex_unlock(&w.mu);

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
          json_escape_into(lines, new_names[i]);
          lines += "\"}\n";
        }
        err = append_all(w.fd_strings, lines.data(), lines.size(), w.strings_size);
        if (err) err_file = "strings";
      }
      if (!err && n) {
        err = append_all(w.fd_stages, (const char*)batch.data(), n * sizeof(Record), w.stages_size);
        if (err) err_file = "stages";
      }
      if (err) {
        dropped = n;
      } else {
        written = n;
      }
    }
    took = n != 0;
    // steady state (only during the warm-up): the first name with `watch` completed top-level
    // stages (not marks), in the order they were completed
    int32_t hit_name = -1;
    int64_t hit_ns = 0;
    if (watch > 0 && n) {
      for (size_t i = 0; i < n; i++) {
        const Record& r = batch[i];
        if (r.depth != 0 || (r.flags & F_MARK) || r.name_id < 0) continue;
        if ((size_t)r.name_id >= watch_counts.size()) watch_counts.resize((size_t)r.name_id + 1, 0);
        if (++watch_counts[(size_t)r.name_id] >= (uint64_t)watch) {
          hit_name = r.name_id;
          hit_ns = r.host_end_ns;
          break;
        }
      }
    }
    pthread_mutex_lock(&w.mu);
    if ((written || !new_names.empty()) && w.syncing && !w.dirty) {
      w.dirty = true;
      pthread_cond_signal(&w.sync_cv);
    }
    if (err && !w.err) {
      w.err = err;
      w.err_file = (strcmp(err_file, "strings") == 0) ? w.strings_path : w.stages_path;
    }
    if (!err && !failed) w.names_written = names_to;
    w.rows_written += written;
    w.rows_dropped += dropped;
    if (n) w.batches++;
    if ((int64_t)n > w.max_batch) w.max_batch = (int64_t)n;
    if (hit_name >= 0 && w.watch_gen == watch_gen && w.watch == watch) {
      w.steady_name = hit_name;
      w.steady_ns = hit_ns;
      w.watch = -1;
    }
    w.flush_done = req;
    pthread_cond_broadcast(&w.done_cv);
    if (stopping) break;
  }
  pthread_mutex_unlock(&w.mu);
  return nullptr;
}

// The syncer: fsyncs the part's files at most every fsync interval while the writer writes,
// and once more after it stopped (so a closed part is on disk), off the writer's thread.
void* syncer_main(void*) {
  pthread_mutex_lock(&w.mu);
  int64_t last = now_ns();
  for (;;) {
    while (!w.dirty && !w.sync_stop) pthread_cond_wait(&w.sync_cv, &w.mu);
    if (!w.sync_stop) {
      const int64_t due = last + w.fsync_ns;  // written since: wait until the interval is up
      struct timespec ts;
      ts.tv_sec = (time_t)(due / 1000000000LL);
      ts.tv_nsec = (long)(due % 1000000000LL);
      while (!w.sync_stop && now_ns() < due) pthread_cond_timedwait(&w.sync_cv, &w.mu, &ts);
    }
    const bool work = w.dirty && w.err == 0;
    const bool last_round = w.sync_stop;
    w.dirty = false;
    const int fs = w.fd_strings, fd = w.fd_stages;  // open until the syncer is joined
    pthread_mutex_unlock(&w.mu);
    if (work) {
      fsync(fs);  // best effort (some file systems cannot); write errors show in the writer
      fsync(fd);
    }
    pthread_mutex_lock(&w.mu);
    if (work) {
      w.fsyncs++;
      last = now_ns();
    }
    if (last_round) break;
  }
  pthread_mutex_unlock(&w.mu);
  return nullptr;
}

void writer_close_fds() {
  if (w.fd_stages >= 0) close(w.fd_stages);
  if (w.fd_strings >= 0) close(w.fd_strings);
  w.fd_stages = w.fd_strings = -1;
}

// Sets *flag under w.mu, wakes the thread waiting on cv, joins it. `release_gil`: called from Python.
void stop_and_join(bool* flag, pthread_cond_t* cv, pthread_t thread, bool release_gil) {
  pthread_mutex_lock(&w.mu);
  *flag = true;
  pthread_cond_signal(cv);
  pthread_mutex_unlock(&w.mu);
  if (release_gil) {
    Py_BEGIN_ALLOW_THREADS pthread_join(thread, nullptr);
    Py_END_ALLOW_THREADS
  } else {
    pthread_join(thread, nullptr);
  }
}

// Stops the thread after a final take-and-write; joins it, then the syncer after its last fsync.
void writer_join(bool release_gil) {
  if (!w.running) return;
  stop_and_join(&w.stop, &w.cv, w.thread, release_gil);
  w.running = false;  // from here push_done/drain() no longer lock: the GIL is the lock again
  if (w.syncing) {  // the last fsync of what the writer wrote, then the files can close
    stop_and_join(&w.sync_stop, &w.sync_cv, w.syncer, release_gil);
    w.syncing = false;
  }
  writer_close_fds();
}

void writer_at_exit() {  // C atexit: never leave the thread running into static destructors
  writer_join(false);
}

void writer_atfork_prepare() { pthread_mutex_lock(&w.mu); }
// The writer's condition variables; cv waits with CLOCK_MONOTONIC deadlines.
void writer_init_conds() {
  pthread_condattr_t a;
  pthread_condattr_init(&a);
  pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
  pthread_cond_init(&w.cv, &a);
  pthread_cond_init(&w.sync_cv, &a);
  pthread_cond_init(&w.done_cv, nullptr);
  pthread_condattr_destroy(&a);
}

void writer_atfork_parent() { pthread_mutex_unlock(&w.mu); }
void writer_atfork_child() {
  // Only trivial work: we are inside fork(). The thread did not follow; the files are the parent's.
  pthread_mutex_init(&w.mu, nullptr);
  writer_init_conds();
  w.running = false;
  w.syncing = false;
  w.stop = false;
  w.sync_stop = false;
  w.dirty = false;
  w.signalled = false;
  w.idle = false;
  w.flush_req = w.flush_done = 0;
  writer_close_fds();
  w.names_written = 0;
  w.rows_written = w.rows_dropped = w.batches = w.taken = w.signals = w.fsyncs = w.wakes = w.dropped_attrs = 0;
  w.max_batch = 0;
  w.err = 0;
  w.watch = -1;
  w.steady_name = -1;
}

void writer_init() {  // module init
  writer_init_conds();
  pthread_atfork(writer_atfork_prepare, writer_atfork_parent, writer_atfork_child);
  atexit(writer_at_exit);
}

int open_append(const std::string& path, int64_t& size) {
  int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) return -1;
  struct stat st;
  size = (fstat(fd, &st) == 0) ? (int64_t)st.st_size : 0;
  return fd;
}

// writer_start(stages_path, strings_path, interval_ms=2.0, threshold=8192, fsync_interval_s=1.0)
PyObject* py_writer_start(PyObject*, PyObject* args, PyObject* kwargs) {
  static const char* kw[] = {"stages_path", "strings_path", "interval_ms", "threshold", "fsync_interval_s", nullptr};
  const char *sp = nullptr, *np = nullptr;
  double interval_ms = 2.0, fsync_s = 1.0;
  long long threshold = 8192;
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "ss|dLd", (char**)kw, &sp, &np, &interval_ms, &threshold, &fsync_s))
    return nullptr;
  if (w.running) {
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
  pthread_mutex_lock(&w.mu);
  w.fd_stages = fs;
  w.fd_strings = fn;
  w.stages_size = ssz;
  w.strings_size = nsz;
  w.stages_path = sp;
  w.strings_path = np;
  w.interval_ns = (int64_t)(interval_ms * 1e6);
  w.fsync_ns = fsync_s < 0 ? -1 : (int64_t)(fsync_s * 1e9);
  w.threshold = (size_t)threshold;
  w.stop = false;
  w.sync_stop = false;
  w.dirty = false;
  w.signalled = false;
  w.idle = false;
  w.flush_req = w.flush_done = 0;
  w.names_written = 0;
  w.rows_written = w.rows_dropped = w.batches = w.taken = w.signals = w.fsyncs = w.wakes = w.dropped_attrs = 0;
  w.max_batch = 0;
  w.err = 0;
  w.err_file.clear();
  w.watch = -1;
  w.steady_name = -1;
  pthread_mutex_unlock(&w.mu);
  // Signals go to the program's threads, never to ours: block them all around the create.
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_BLOCK, &all, &old);
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setstacksize(&attr, 256 * 1024);
  // The syncer first, so the writer finds w.syncing set. Without one the writer still writes
  // (the SIGKILL bound holds) and only fsync is skipped: not worth failing the session for.
  w.syncing = w.fsync_ns >= 0 && pthread_create(&w.syncer, &attr, syncer_main, nullptr) == 0;
  int rc = pthread_create(&w.thread, &attr, writer_main, nullptr);
  pthread_attr_destroy(&attr);
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
  if (rc != 0) {
    if (w.syncing) {
      stop_and_join(&w.sync_stop, &w.sync_cv, w.syncer, false);
      w.syncing = false;
    }
    writer_close_fds();
    errno = rc;
    return PyErr_SetFromErrno(PyExc_OSError);
  }
  w.running = true;  // records completed from now on are taken by the writer, not drain()
  Py_RETURN_TRUE;
}

// writer_flush(timeout_s=5.0) -> bool: every record completed before the call is written (or
// dropped after a write error) when it returns True. GIL released while waiting.
PyObject* py_writer_flush(PyObject*, PyObject* args) {
  double timeout_s = 5.0;
  if (!PyArg_ParseTuple(args, "|d", &timeout_s)) return nullptr;
  if (!w.running) Py_RETURN_FALSE;
  bool ok = true;
  Py_BEGIN_ALLOW_THREADS pthread_mutex_lock(&w.mu);
  uint64_t req = ++w.flush_req;
  pthread_cond_signal(&w.cv);
  struct timespec dl;
  clock_gettime(CLOCK_REALTIME, &dl);  // done_cv uses the default (realtime) clock
  int64_t t = (int64_t)dl.tv_sec * 1000000000LL + dl.tv_nsec + (int64_t)(timeout_s * 1e9);
  dl.tv_sec = (time_t)(t / 1000000000LL);
  dl.tv_nsec = (long)(t % 1000000000LL);
  while (w.flush_done < req && !w.stop) {
    if (pthread_cond_timedwait(&w.done_cv, &w.mu, &dl) == ETIMEDOUT) {
      ok = w.flush_done >= req;
      break;
    }
  }
  pthread_mutex_unlock(&w.mu);
  Py_END_ALLOW_THREADS if (ok) Py_RETURN_TRUE;
  Py_RETURN_FALSE;
}

PyObject* writer_status_dict() {
  pthread_mutex_lock(&w.mu);
  PyObject* err = Py_None;
  Py_INCREF(Py_None);
  int e = w.err;
  std::string ef = w.err_file;
  PyObject* steady = Py_None;
  Py_INCREF(Py_None);
  int32_t sn = w.steady_name;
  int64_t sns = w.steady_ns;
  uint64_t rw = w.rows_written, rd = w.rows_dropped, bt = w.batches, tk = w.taken, sg = w.signals, fy = w.fsyncs,
           da = w.dropped_attrs, wk = w.wakes;
  size_t nw = w.names_written, pending = w.running ? g.done.size() - g.done_head : 0;
  int64_t mb = w.max_batch, iv = w.interval_ns;
  size_t th = writer_threshold();
  pthread_mutex_unlock(&w.mu);
  if (e) {
    Py_DECREF(err);
    err = Py_BuildValue("(iss)", e, strerror(e), ef.c_str());
    if (!err) return nullptr;
  }
  if (sn >= 0) {
    Py_DECREF(steady);
    steady = Py_BuildValue("(iL)", (int)sn, (long long)sns);
    if (!steady) {
      Py_DECREF(err);
      return nullptr;
    }
  }
  return Py_BuildValue("{sOsKsKsnsKsKsKsKsKsKsnsLsdsnsNsN}", "running", w.running ? Py_True : Py_False, "rows_written",
                       (unsigned long long)rw, "rows_dropped", (unsigned long long)rd, "names_written", (Py_ssize_t)nw,
                       "batches", (unsigned long long)bt, "taken", (unsigned long long)tk, "signals",
                       (unsigned long long)sg, "wakes", (unsigned long long)wk, "fsyncs", (unsigned long long)fy, "dropped_attrs",
                       (unsigned long long)da, "pending_records", (Py_ssize_t)pending, "max_batch", (long long)mb,
                       "interval_ms", (double)iv / 1e6, "threshold", (Py_ssize_t)th, "error", err, "steady", steady);
}

PyObject* py_writer_status(PyObject*, PyObject*) { return writer_status_dict(); }

// writer_stop() -> status dict: final take-and-write, join, close the files.
PyObject* py_writer_stop(PyObject*, PyObject*) {
  writer_join(true);
  return writer_status_dict();
}

// writer_watch(n): count completed top-level stages (not marks) per name from now on; the first
// name to reach n shows in writer_status()["steady"] as (name_id, host_end_ns of its n-th). n <= 0: off.
PyObject* py_writer_watch(PyObject*, PyObject* v) {
  long long n = PyLong_AsLongLong(v);
  if (n == -1 && PyErr_Occurred()) return nullptr;
  pthread_mutex_lock(&w.mu);
  w.watch = n > 0 ? n : -1;
  w.watch_gen++;
  w.steady_name = -1;
  w.steady_ns = 0;
  pthread_mutex_unlock(&w.mu);
  Py_RETURN_NONE;
}

#define MAXINSTR_WRITER_METHODS                                                                                       \
  {"writer_start", (PyCFunction)(void (*)(void))py_writer_start, METH_VARARGS | METH_KEYWORDS,                        \
   "writer_start(stages_path, strings_path, interval_ms=2.0, threshold=8192, fsync_interval_s=1.0) -> True: a "       \
   "native thread appends completed records (and new names) to these files, without the GIL, until writer_stop()"},  \
      {"writer_flush", py_writer_flush, METH_VARARGS,                                                                 \
       "writer_flush(timeout_s=5.0) -> bool: wait (GIL released) until every record completed so far is written"},    \
      {"writer_stop", py_writer_stop, METH_NOARGS, "writer_stop() -> status: final write, join the thread"},            \
      {"writer_status", py_writer_status, METH_NOARGS, "writer_status() -> dict of the native writer's counters"},     \
      {"writer_watch", py_writer_watch, METH_O,                                                                       \
       "writer_watch(n): report the first name with n completed top-level stages in writer_status()['steady']"},
