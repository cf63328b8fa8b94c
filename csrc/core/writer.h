// The native writer (docs/sessions.md "The native writer").
//
// While a session is open, a thread of ours (not a Python thread: it never takes the GIL) takes
// the completed records out of completed.done (records.h) and appends them to the part's
// stages.bin with write(2), every `interval` (default 2 ms) or as soon as the buffer passes
// `threshold` records (the record-completion path signals a condition variable once per
// crossing; it makes no syscall otherwise). Names new since its last write go to strings.jsonl
// first, in the reader's format ({"id":N,"s":"..."} lines), so a row on disk always has its name.
// Recording threads that starve the Python flusher of the GIL therefore no longer fill the
// buffer, and a SIGKILL loses only the records completed since the last write.
//
// Locking: writer.mu guards completed.done/done_head/done_drained while the writer runs
// (push_done and drain() take it only then: `writer.running` is read and written with the GIL
// held), and writer.names, the writer's counters and requests always. The writer holds writer.mu
// only to swap buffers and copy new names; the write(2) calls happen without it. Attrs stay
// Python objects: the Python flusher takes them through drain(), which returns no records while
// the writer runs (a record is written once).
//
// fsync happens on a second thread of ours (the syncer), never on the writer's: a SIGKILL loses
// only what was not yet handed to the kernel with write(2) (the page cache survives the process),
// so the loss bound is the writer's write() cadence, and an fsync of a large file (270 ms for
// 72 MB measured) must not stall it. fsync only narrows what a machine crash can lose.
//
// fork: the prepare handler takes writer.mu (so the child never inherits it held mid-swap); the
// child gets fresh primitives, no threads, no descriptors (closed: they are the parent's files)
// and writes its own part once its session starts a writer again.
#pragma once

#include "base.h"

#include <pthread.h>

#include <string>
#include <vector>

#include "records.h"

namespace maxinstr MAXINSTR_HIDDEN {

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
};
extern NativeWriter writer;

// Records in the buffer that wake the writer before its interval is up. Not clamped to the
// capacity: a buffer set smaller than this fills between two timed writes when records come
// faster than capacity / interval (the overflow is counted, as always).
inline size_t writer_threshold() { return writer.threshold; }

// Completed records not yet taken (stats()): under writer.mu while the writer swaps buffers.
size_t writer_done_count();

// Called by push_done with writer.mu held, after the record was added. A syscall only when the
// writer sleeps without a timeout (nothing completed for a whole interval) or the threshold is
// crossed: a busy program pays none, an idle session costs no timer wake-ups.
inline void writer_after_push() {
  if (UNLIKELY(writer.idle)) {
    writer.idle = false;
    writer.wakes++;
    pthread_cond_signal(&writer.cv);
  } else if (!writer.signalled && done_count() >= writer_threshold()) {
    writer.signalled = true;
    writer.signals++;
    pthread_cond_signal(&writer.cv);
  }
}

// The name of a new id, for the writer (intern_name calls it with the GIL held).
inline void writer_add_name(const std::string& utf8) {
  pthread_mutex_lock(&writer.mu);
  writer.names.push_back(utf8);
  pthread_mutex_unlock(&writer.mu);
}

// Module init: the writer's condition variables, fork handlers and exit hook.
void writer_init();

// writer_start, writer_flush, writer_stop, writer_status (module.cpp adds them).
extern PyMethodDef writer_methods[];

}  // namespace maxinstr
