#include "tandem/data/loader.h"

#include <algorithm>
#include <system_error>

#include <dlfcn.h>

#include <ATen/Parallel.h>
#include <c10/util/ParallelGuard.h>

#include "tandem/util/arith.h"
#include "tandem/util/check.h"

namespace tandem::data {

// Note [serial loader threads]: a loader thread must not fan its libtorch
// operations out over torch's intra-op pool: the loader threads are already
// the parallelism, and N threads each starting an OpenMP team of all cores
// spend their time waking each other (measured: a third of the CPU in futex
// calls). The pinned wheel runs intra-op work on OpenMP, whose
// at::in_parallel_region() ignores c10::ParallelGuard, so we also set this
// thread's own OpenMP team size to 1 (omp_set_num_threads changes only the
// calling thread's setting), and MKL's, which torch sets process-wide and
// which otherwise runs even a 50,000 x 3 by 3 x 2 product (an affine grid) on
// every core (MKL_Set_Num_Threads_Local, the by-value C entry point, changes
// only this thread's). Both
// libraries come inside libtorch; their functions are looked up at run time
// so that a libtorch built without them still works.
void make_this_thread_serial() {
  (void)at::get_num_threads();  // lets ATen initialise this thread's settings first
  using SetThreads = int (*)(int);  // omp_set_num_threads returns void; the int is ignored
  static auto omp = reinterpret_cast<SetThreads>(dlsym(RTLD_DEFAULT, "omp_set_num_threads"));
  static auto mkl = reinterpret_cast<SetThreads>(dlsym(RTLD_DEFAULT, "MKL_Set_Num_Threads_Local"));
  if (omp != nullptr) omp(1);
  if (mkl != nullptr) mkl(1);
}

DataLoader::DataLoader(std::shared_ptr<const Dataset> dataset,
                       std::shared_ptr<const Sampler> sampler, LoaderOptions options)
    : dataset_(std::move(dataset)), sampler_(std::move(sampler)), options_(options) {
  TANDEM_CHECK(options_.batch_size > 0, "batch size must be positive, got ", options_.batch_size);
  TANDEM_CHECK(options_.workers >= 0, "workers must be >= 0, got ", options_.workers);
  TANDEM_CHECK(options_.prefetch_factor > 0, "prefetch factor must be positive");
}

int64_t DataLoader::num_batches() const {
  int64_t n = sampler_->size();
  return options_.drop_last ? n / options_.batch_size
                            : ceil_div(n, options_.batch_size);
}

std::unique_ptr<EpochIterator> DataLoader::epoch(int64_t epoch, int64_t skip) const {
  auto order = sampler_->indices(epoch);
  std::vector<std::vector<int64_t>> batches;
  int64_t total = num_batches();
  for (int64_t b = std::max<int64_t>(skip, 0); b < total; ++b) {
    auto begin = order.begin() + b * options_.batch_size;
    auto end = order.begin() + std::min<int64_t>((b + 1) * options_.batch_size, order.size());
    batches.emplace_back(begin, end);
  }
  return std::make_unique<EpochIterator>(dataset_, std::move(batches), epoch, options_);
}

EpochIterator::EpochIterator(std::shared_ptr<const Dataset> dataset,
                             std::vector<std::vector<int64_t>> batches, int64_t epoch,
                             const LoaderOptions& options)
    : dataset_(std::move(dataset)),
      batches_(std::move(batches)),
      epoch_(epoch),
      capacity_(std::max<int64_t>(options.workers * options.prefetch_factor, 1)),
      pin_memory_(options.pin_memory) {
  for (int64_t w = 0; w < options.workers; ++w) {
    try {
      threads_.emplace_back([this] {
        c10::ParallelGuard serial(true);  // Note [serial loader threads]
        make_this_thread_serial();
        work();
      });
    } catch (const std::system_error& e) {  // a thread or process limit
      stop_threads();  // the destructor will not run: stop the ones started
      TANDEM_FAIL("--workers ", options.workers, ": could not start loader thread ", w + 1, " (",
                  e.what(), ")");
    }
  }
}

void EpochIterator::stop_threads() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  space_.notify_all();
  for (auto& thread : threads_) thread.join();
  threads_.clear();
}


Batch EpochIterator::build(size_t position) const {
  Batch batch = dataset_->get_batch(batches_[position], epoch_);
  if (pin_memory_ && batch.size() > 0) {
    batch.inputs = batch.inputs.pin_memory();
    batch.targets = batch.targets.pin_memory();
  }
  return batch;
}

EpochIterator::~EpochIterator() { stop_threads(); }

// Note [loader order]: workers claim batch positions in increasing order but
// may finish out of order; a worker only claims position p when p is within
// `capacity_` of the next batch to hand out, which bounds memory, and next()
// waits for exactly position next_out_. A failed batch is an error in its
// place: the batches before it still come out (they were claimed earlier, so
// they are built), no position after it is claimed, and next() throws when
// it reaches the failed position; with several failures, the first in order.
void EpochIterator::work() {
  while (true) {
    size_t position;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      space_.wait(lock, [&] {
        return stop_ || next_claim_ >= batches_.size() ||
               next_claim_ < next_out_ + static_cast<size_t>(capacity_);
      });
      if (stop_ || next_claim_ >= batches_.size() || (error_ && next_claim_ > error_position_)) return;
      position = next_claim_++;
    }
    try {
      Batch batch = build(position);
      std::lock_guard<std::mutex> lock(mutex_);
      done_.emplace(position, std::move(batch));
    } catch (...) {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!error_ || position < error_position_) {
        error_ = std::current_exception();
        error_position_ = position;
      }
    }
    ready_.notify_all();
    space_.notify_all();
  }
}

std::optional<Batch> EpochIterator::next() {
  if (next_out_ >= batches_.size()) return std::nullopt;
  if (threads_.empty()) {
    return build(next_out_++);
  }
  std::unique_lock<std::mutex> lock(mutex_);
  ready_.wait(lock, [&] { return done_.count(next_out_) > 0 || (error_ && error_position_ == next_out_); });
  if (done_.count(next_out_) == 0) std::rethrow_exception(error_);  // this batch's own error
  auto node = done_.extract(next_out_);
  ++next_out_;
  lock.unlock();
  space_.notify_all();
  return std::move(node.mapped());
}

}  // namespace tandem::data
