// The native writer (docs/sessions.md "The native writer"): a thread of ours, never taking the
// GIL, appends completed records to stages.bin (new names to strings.jsonl first); fsync runs on a
// second thread. writer.mu guards the completed records while the writer runs (`running` is
// read and written with the GIL held), and the names, counters and requests always. fork: the
// prepare handler takes writer.mu, so the child never inherits it held mid-swap.
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
  size_t threshold = 8192;          // records that wake the writer early (not clamped to the capacity)
  std::vector<std::string> names;  // UTF-8 of every interned name, by id (appended under mu)
  size_t names_written = 0;        // names [0, names_written) are in this part's strings.jsonl
  struct Counts {                  // writer_status(); zero at each writer_start
    uint64_t rows_written, rows_dropped, batches, taken, signals, fsyncs, wakes;
    uint64_t dropped_attrs;        // attrs not kept: the Python flusher had not taken them for `capacity` records
    int64_t max_batch;
  } counts{};
  int err = 0;                     // first write error (errno), 0 when none; writing stops then
  std::string err_file;
};
extern NativeWriter writer;

// Completed records not yet taken (stats()): under writer.mu while the writer swaps buffers.
size_t writer_done_count();

// Appends a completed record (and its attrs, a new reference taken) to the queue; while the
// writer runs, under its lock, waking it when it sleeps or the buffer crossed `threshold`.
void push_done(const Record& r, PyObject* attrs);

// The name of a new id, for the writer (stage.cpp's intern_name calls it with the GIL held).
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
