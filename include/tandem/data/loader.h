// tandem/data/loader.h: batches of a dataset in sampler order.
//
// With workers == 0 each batch is built on the calling thread when asked for.
// With workers > 0, that many threads build batches ahead into a bounded
// queue (prefetch_factor batches per worker); batches still come out in
// sampler order. A batch that fails to build is rethrown by next() in its
// place, after the batches before it, whichever worker finished first (as
// PyTorch's DataLoader does); no batch after it is built. Destroying an
// EpochIterator (finished or not) stops and joins its workers.
//
// Worker threads run libtorch operations with intra-op parallelism off (Note
// [serial loader threads]): the workers themselves are the parallelism, and
// the training thread keeps torch's thread pool to itself.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "tandem/data/dataset.h"
#include "tandem/data/sampler.h"

namespace tandem::data {

// The calling thread's libtorch operations run on it alone: its own
// OpenMP team and MKL's of one thread (Note [serial loader threads] in
// src/data/loader.cpp). For threads that are already the parallelism: the
// loader's workers, ranks that are threads of one process.
void make_this_thread_serial();

struct LoaderOptions {
  int64_t batch_size = 256;
  bool drop_last = false;     // drop a final batch smaller than batch_size
  int64_t workers = 0;        // threads building batches ahead
  int64_t prefetch_factor = 2;
  bool pin_memory = false;    // page-lock batches (for fast, asynchronous copies to CUDA)
};

class EpochIterator;

class DataLoader {
 public:
  DataLoader(std::shared_ptr<const Dataset> dataset, std::shared_ptr<const Sampler> sampler,
             LoaderOptions options);

  int64_t num_batches() const;
  const LoaderOptions& options() const { return options_; }
  const Dataset& dataset() const { return *dataset_; }

  // Iterates `epoch`, starting after the first `skip` batches (for resuming
  // mid-epoch).
  std::unique_ptr<EpochIterator> epoch(int64_t epoch, int64_t skip = 0) const;

 private:
  std::shared_ptr<const Dataset> dataset_;
  std::shared_ptr<const Sampler> sampler_;
  LoaderOptions options_;
};

class EpochIterator {
 public:
  EpochIterator(std::shared_ptr<const Dataset> dataset, std::vector<std::vector<int64_t>> batches,
                int64_t epoch, const LoaderOptions& options);
  ~EpochIterator();
  EpochIterator(const EpochIterator&) = delete;
  EpochIterator& operator=(const EpochIterator&) = delete;

  // The next batch, or nullopt at the end of the epoch.
  std::optional<Batch> next();

 private:
  void work();
  void stop_threads();  // stops and joins the worker threads
  Batch build(size_t position) const;

  std::shared_ptr<const Dataset> dataset_;
  std::vector<std::vector<int64_t>> batches_;
  int64_t epoch_;
  int64_t capacity_;
  bool pin_memory_;
  size_t next_out_ = 0;  // next batch to hand out

  // Guarded by mutex_: the next batch a worker should build, finished batches
  // by position, the first worker error, and the stop flag.
  std::mutex mutex_;
  std::condition_variable ready_, space_;
  size_t next_claim_ = 0;
  std::map<size_t, Batch> done_;
  std::exception_ptr error_;   // the failed batch first in order...
  size_t error_position_ = 0;  // ...and its position
  bool stop_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace tandem::data
