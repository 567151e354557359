// The only file that includes c10d (see tandem/dist/process_group.h).
//
// Note [gloo headers]: c10d's ProcessGroupGloo.hpp includes five of Gloo's
// headers, which the torch wheel does not ship. They come from Debian's
// libgloo-dev (a 2022 snapshot, older than the Gloo compiled into libtorch).
// That is sound because this file only calls out-of-line functions of
// libtorch (constructors, createDeviceForHostname, the virtual collectives)
// and never instantiates Gloo code itself: the headers must compile, their
// inline contents are not used. We do not link Debian's libgloo; every Gloo
// symbol resolves in libtorch_cpu. docs/BUILD.md has the check.
#include "tandem/dist/process_group.h"

#include <algorithm>
#include <atomic>
#include <future>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include <sys/mman.h>

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <torch/cuda.h>

#include "group_impl.h"
#include "internal.h"
#include "tandem/cuda/parts.h"
#include "tandem/util/check.h"

namespace tandem::dist {

using namespace internal;

namespace {

c10d::ReduceOp to_c10d(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:  // Gloo has no AVG: a sum, divided when it completes
      return c10d::ReduceOp::SUM;
    case ReduceOp::kMin:
      return c10d::ReduceOp::MIN;
    case ReduceOp::kMax:
      return c10d::ReduceOp::MAX;
  }
  TANDEM_FAIL("unknown reduce op");
}

int64_t bytes_of(const torch::Tensor& t) { return t.defined() ? static_cast<int64_t>(t.nbytes()) : 0; }

int64_t bytes_of(const std::vector<torch::Tensor>& tensors) {
  int64_t total = 0;
  for (const auto& t : tensors) total += bytes_of(t);
  return total;
}

// Starts `count` threads at once while holding kThreadReserve of address
// space, joins them and gives the reserve back (Note [gloo's threads]);
// returns why a thread could not start, or "" when all did.
constexpr size_t kThreadReserve = size_t{64} << 20;

std::string probe_threads(size_t count) {
  void* reserve = mmap(nullptr, kThreadReserve, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (reserve == MAP_FAILED) return "no room for a 64 MiB reserve of address space";
  std::vector<std::thread> probes;
  std::promise<void> go;
  std::shared_future<void> started = go.get_future().share();
  std::string failed;
  for (size_t i = 0; i < count && failed.empty(); ++i) {
    try {
      probes.emplace_back([started] { started.wait(); });
    } catch (const std::system_error& e) {
      failed = e.what();
    }
  }
  go.set_value();
  for (auto& t : probes) t.join();  // each one joined before anything unwinds
  munmap(reserve, kThreadReserve);
  return failed;
}

// The inputs of a reduce-scatter, each like `output`, as one flat buffer:
// a view where they lie one after another in one storage, else a copy.
torch::Tensor one_buffer(const std::vector<torch::Tensor>& inputs, const torch::Tensor& output) {
  const int64_t n = output.numel();
  bool tiled = true;
  for (size_t i = 0; i < inputs.size() && tiled; ++i) {
    const auto& t = inputs[i];
    tiled = t.numel() == n && t.is_contiguous() && t.scalar_type() == output.scalar_type() &&
            t.is_cpu() && t.storage().is_alias_of(inputs[0].storage()) &&
            t.storage_offset() == inputs[0].storage_offset() + static_cast<int64_t>(i) * n;
  }
  if (tiled) return inputs[0].as_strided({n * static_cast<int64_t>(inputs.size())}, {1});
  std::vector<torch::Tensor> flat;
  flat.reserve(inputs.size());
  for (const auto& t : inputs) flat.push_back(t.reshape({-1}));
  return torch::cat(flat);
}

}  // namespace

// ---- ProcessGroup -------------------------------------------------------------

// Note [one launch at a time]: c10d records every collective it launches in
// a process-wide flight recorder (on by default: TORCH_FR_BUFFER_SIZE). On a
// group's first launch it adds the group to the recorder's table of groups,
// a std::map written outside the recorder's lock (FlightRecorder::
// recordWithResetEnabled, libtorch 2.11). Two groups of one process
// launching at the same moment, from two threads, could corrupt that map
// and crash the process, or leave threads looping in it for ever (seen
// here: three threads spinning in recordWithResetEnabled for 85 minutes,
// without the lock). Ranks as threads in one process do exactly that (a
// DDP test crashed so in CI), and so may a program that drives several
// groups from several threads. So every Gloo launch through tandem holds one
// process-wide mutex. A Gloo launch only queues the work for the group's own
// threads (it never waits for a peer), so the lock is held for microseconds
// and cannot deadlock; the waits happen outside it. NCCL launches do not
// take it: the first one may block while the communicator forms, which
// waits for the other ranks, and NCCL ranks are processes, one per device.
// Test: ProcessGroupTest.GlooLaunchesTakeTheProcesssLaunchLock.
std::mutex& gloo_launch_mutex() {
  static std::mutex mutex;
  return mutex;
}


ProcessGroup::ProcessGroup(const Rendezvous& r, const GroupOptions& options)
    : impl_(std::make_unique<Impl>()) {
  impl_->rendezvous = r;
  impl_->options = options;
  TANDEM_CHECK(r.world_size >= 1 && r.rank >= 0 && r.rank < r.world_size,
               "process group: rank ", r.rank, " of world size ", r.world_size, " is impossible");
  TANDEM_CHECK(options.timeout.count() > 0, "--dist-timeout: expected a positive time");
  std::string backend = options.backend;
  if (backend == "auto") backend = options.device.rfind("cuda", 0) == 0 ? "nccl" : "gloo";
  TANDEM_CHECK(backend == "gloo" || backend == "nccl", "--dist-backend: expected auto, gloo or nccl, got '",
               options.backend, "'");
  if (backend == "nccl") {
    // A driver without the CUDA module is CUDA missing for libtorch too
    // (Note [CUDA as a module]): the module's reason is the one to give.
    const std::string why = cuda::load_error();
    TANDEM_CHECK(torch::cuda::is_available() && torch::cuda::device_count() > 0,
                 "--dist-backend nccl: no CUDA device is visible to rank ", r.rank,
                 " (NCCL reduces CUDA tensors; use --dist-backend gloo on CPU)", why.empty() ? "" : ": ", why);
    TANDEM_CHECK(built_with_nccl(), "--dist-backend nccl: this build has no NCCL support (it was "
                 "compiled without nccl.h; see docs/BUILD.md); use --dist-backend gloo");
  }
  impl_->backend = backend;

  // Rendezvous: rank 0 serves the store, everyone connects (retrying until
  // the timeout, so ranks may start in any order); under torchrun its agent
  // serves it, and every rank connects (Note [agent store]).
  const bool serves = r.rank == 0 && !r.agent_store;
  c10d::TCPStoreOptions store_options;
  store_options.port = static_cast<std::uint16_t>(r.port);
  store_options.isServer = serves;
  store_options.numWorkers = static_cast<size_t>(r.world_size);
  store_options.waitWorkers = false;
  store_options.timeout = options.timeout;
  if (serves) store_options.masterListenFd = bound_listener(r.host, r.port);  // Note [store address]
  try {
    if (serves) {
      impl_->store = c10::make_intrusive<c10d::TCPStore>(r.host, store_options);
    } else if (r.agent_store) {
      impl_->store = c10::make_intrusive<c10d::PrefixStore>("tandem/attempt-" + std::to_string(r.attempt),
                                                            connect_to_store(r, store_options));
    } else {
      impl_->store = connect_to_store(r, store_options);
    }
    // Note [job token]: rank 0 posts the job's token; the others compare
    // theirs before they join the group, so a stray process leaves nothing
    // behind in the store. (A guard against mistakes, not an attacker: the
    // store is open to anyone who reaches the port; docs/DISTRIBUTED.md.)
    if (r.rank == 0) {
      impl_->store->set(kTokenKey, std::vector<uint8_t>(r.job_token.begin(), r.job_token.end()));
    } else {
      auto posted = impl_->store->get(kTokenKey);
      if (std::string(posted.begin(), posted.end()) != r.job_token) {
        throw TokenRefused(r.job_token.empty() ? "the job has a job token and this process none"
                                               : "this process's job token does not match the job's");
      }
    }
  } catch (const TokenRefused& e) {
    TANDEM_FAIL("rendezvous at ", r.host, ":", r.port, " refused rank ", r.rank, ": ", e.what(),
                " (TANDEM_JOB_TOKEN / --job-token): it belongs to another job, or was started "
                "with the wrong token");
  } catch (const Error&) {
    throw;  // already names the rendezvous (Note [store deadline])
  } catch (const std::exception& e) {
    std::string why = first_line(e.what());
    if (serves && why.find("EADDRINUSE") != std::string::npos) {
      TANDEM_FAIL("rendezvous: port ", r.port, " on ", r.host,
                  " is already in use (pick another MASTER_PORT / --master-port)");
    }
    TANDEM_FAIL("rendezvous at ", r.host, ":", r.port, " (", r.source, ") failed on rank ", r.rank,
                ": ", why);
  }

  wait_for_every_rank(r, *impl_->store, options.timeout);
  impl_->connect();
  // Rank 0's process serves the job's store (Note [who did not come]),
  // unless a launcher's agent does.
  impl_->count = counted_group(impl_->store, impl_->store, r.rank, r.world_size,
                               /*store_host=*/r.agent_store ? -1 : 0);
}

// The backend over `store` (NCCL, or Gloo with one device bound to this
// host's address on the route to rank 0's store: loopback for a local job,
// so ranks talk over the job's network).
void ProcessGroup::Impl::connect() {
  const auto& r = rendezvous;
  if (backend == "nccl") {
    try {
      group = cuda::parts()->nccl_group(store, static_cast<int>(r.rank), static_cast<int>(r.world_size),
                                        options.timeout);
    } catch (const std::exception& e) {
      TANDEM_FAIL("process group (nccl) of ", r.world_size, " ranks at ", r.host, ":", r.port,
                  " failed on rank ", r.rank, ": ", first_line(e.what()));
    }
    return;
  }
  try {
    auto gloo_options = c10d::ProcessGroupGloo::Options::create(options.timeout);
    // The device starts its own event-loop thread.
    gloo_options->devices.push_back(
        c10d::ProcessGroupGloo::createDeviceForHostname(local_address_towards(r.host)));
    // Note [gloo's threads]: ProcessGroupGloo starts its worker threads in
    // its constructor, and when one cannot be started (the address-space or
    // thread limit reached: ulimit -v, -u) the exception leaves the first
    // waiting on a condition variable that the unwinding then destroys: the
    // rank blocks for ever in pthread_cond_destroy (libtorch 2.11), and its
    // peers wait out --dist-timeout. So its threads are started here first,
    // all at once, while a reserve of address space is held that is given
    // back just before the constructor: what the constructor allocates
    // besides its threads comes out of the reserve, and a process too close
    // to its limits gets an error naming them instead of a hang.
    std::string failed = probe_threads(static_cast<size_t>(std::max(gloo_options->threads, 2)));
    TANDEM_CHECK(failed.empty(), "process group (gloo) of ", r.world_size, " ranks on rank ", r.rank,
                 ": cannot start its threads (", failed, "): the process reached its memory or thread limit "
                 "(ulimit -v, ulimit -u)");
    group = c10::make_intrusive<c10d::ProcessGroupGloo>(
        store, static_cast<int>(r.rank), static_cast<int>(r.world_size), gloo_options);
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    TANDEM_FAIL("process group (gloo) of ", r.world_size, " ranks at ", r.host, ":", r.port,
                " failed on rank ", r.rank, ": ", first_line(e.what()));
  }
}

ProcessGroup::ProcessGroup(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

ProcessGroup::~ProcessGroup() = default;
ProcessGroup::ProcessGroup(ProcessGroup&&) noexcept = default;
ProcessGroup& ProcessGroup::operator=(ProcessGroup&&) noexcept = default;

int64_t ProcessGroup::rank() const { return impl_->rendezvous.rank; }
int64_t ProcessGroup::size() const { return impl_->rendezvous.world_size; }
const std::string& ProcessGroup::backend() const { return impl_->backend; }
std::chrono::milliseconds ProcessGroup::timeout() const { return impl_->options.timeout; }
torch::Device ProcessGroup::wire_device() const {
  return impl_->backend == "nccl" ? torch::Device(impl_->options.device) : torch::Device(torch::kCPU);
}

Work ProcessGroup::all_reduce(torch::Tensor& tensor, ReduceOp op) {
  impl_->carried("all_reduce", size() == 1 ? 0 : bytes_of(tensor));
  if (size() == 1) return impl_->local();
  std::vector<torch::Tensor> tensors{tensor};
  c10d::AllreduceOptions o;
  o.reduceOp = to_c10d(op);
  o.timeout = impl_->options.timeout;
  return impl_->call("all_reduce", [&] { return impl_->group->allreduce(tensors, o); },
                     impl_->divide_if_avg(op, tensors));
}

// c10d's allreduce takes a list of copies of one tensor (one per device);
// different tensors in one operation are allreduce_coalesced.
Work ProcessGroup::all_reduce(std::vector<torch::Tensor>& tensors, ReduceOp op) {
  impl_->carried("all_reduce", size() == 1 ? 0 : bytes_of(tensors));
  if (size() == 1) return impl_->local();
  c10d::AllreduceCoalescedOptions o;
  o.reduceOp = to_c10d(op);
  o.timeout = impl_->options.timeout;
  return impl_->call("all_reduce", [&] { return impl_->group->allreduce_coalesced(tensors, o); },
                     impl_->divide_if_avg(op, tensors));
}

Work ProcessGroup::broadcast(torch::Tensor& tensor, int64_t root) {
  impl_->carried("broadcast", size() == 1 ? 0 : bytes_of(tensor));
  if (size() == 1 && root == 0) return impl_->local();
  std::vector<torch::Tensor> tensors{tensor};
  c10d::BroadcastOptions o;
  o.rootRank = root;
  o.timeout = impl_->options.timeout;
  return impl_->call("broadcast", [&] { return impl_->group->broadcast(tensors, o); });
}

Work ProcessGroup::reduce(torch::Tensor& tensor, int64_t root, ReduceOp op) {
  impl_->carried("reduce", size() == 1 ? 0 : bytes_of(tensor));
  std::vector<torch::Tensor> tensors{tensor};
  c10d::ReduceOptions o;
  o.reduceOp = to_c10d(op);
  o.rootRank = root;
  o.timeout = impl_->options.timeout;
  return impl_->call("reduce", [&] { return impl_->group->reduce(tensors, o); },
                     rank() == root ? impl_->divide_if_avg(op, tensors) : nullptr);
}

Work ProcessGroup::all_gather(std::vector<torch::Tensor>& outputs, const torch::Tensor& input) {
  impl_->carried("all_gather", size() == 1 ? 0 : bytes_of(input));
  std::vector<std::vector<torch::Tensor>> out{outputs};
  std::vector<torch::Tensor> in{input};
  c10d::AllgatherOptions o;
  o.timeout = impl_->options.timeout;
  return impl_->call("all_gather", [&] { return impl_->group->allgather(out, in, o); });
}

Work ProcessGroup::gather(std::vector<torch::Tensor>& outputs, const torch::Tensor& input,
                          int64_t root) {
  impl_->carried("gather", size() == 1 ? 0 : bytes_of(input));
  std::vector<std::vector<torch::Tensor>> out;
  if (rank() == root) out.push_back(outputs);
  std::vector<torch::Tensor> in{input};
  c10d::GatherOptions o;
  o.rootRank = root;
  o.timeout = impl_->options.timeout;
  return impl_->call("gather", [&] { return impl_->group->gather(out, in, o); });
}

Work ProcessGroup::scatter(torch::Tensor& output, const std::vector<torch::Tensor>& inputs,
                           int64_t root) {
  impl_->carried("scatter", size() == 1 || rank() != root ? 0 : bytes_of(inputs));
  std::vector<torch::Tensor> out{output};
  std::vector<std::vector<torch::Tensor>> in;
  if (rank() == root) in.push_back(inputs);
  c10d::ScatterOptions o;
  o.rootRank = root;
  o.timeout = impl_->options.timeout;
  return impl_->call("scatter", [&] { return impl_->group->scatter(out, in, o); });
}

Work ProcessGroup::reduce_scatter(torch::Tensor& output, const std::vector<torch::Tensor>& inputs,
                                  ReduceOp op) {
  impl_->carried("reduce_scatter", size() == 1 ? 0 : bytes_of(inputs));
  std::vector<torch::Tensor> out{output};
  c10d::ReduceScatterOptions o;
  o.reduceOp = to_c10d(op);
  o.timeout = impl_->options.timeout;
  if (output.is_cpu() && output.is_contiguous() && static_cast<int64_t>(inputs.size()) == size()) {
    // Note [reduce-scatter over Gloo]: Gloo has no reduce-scatter of its
    // own. c10d's list form runs one all-reduce of a rank's chunk after
    // another (n calls of 2 (n - 1) ring steps each); its flat form, one
    // all-reduce of the whole buffer, the rank's chunk then copied out.
    // Over 4 processes of this machine a reduce-scatter of 64 KiB chunks
    // took 25 ms in the list form and 11 ms in the flat one. The inputs go
    // as one buffer: the views they are of where they tile one, a copy
    // where not. The sums are the same but for their order.
    auto flat = one_buffer(inputs, output);
    auto whole = output.view({-1});
    return impl_->call("reduce_scatter", [&] { return impl_->group->_reduce_scatter_base(whole, flat, o); },
                       impl_->divide_if_avg(op, out));
  }
  std::vector<std::vector<torch::Tensor>> in{inputs};
  return impl_->call("reduce_scatter", [&] { return impl_->group->reduce_scatter(out, in, o); },
                     impl_->divide_if_avg(op, out));
}

Work ProcessGroup::all_to_all(torch::Tensor& output, const torch::Tensor& input,
                              const std::vector<int64_t>& output_splits, const std::vector<int64_t>& input_splits) {
  TANDEM_CHECK(static_cast<int64_t>(output_splits.size()) == size() &&
                   static_cast<int64_t>(input_splits.size()) == size(),
               "all_to_all: one split per rank of ", size(), ", got ", input_splits.size(), " and ",
               output_splits.size());
  // What leaves this rank: the rows for the others.
  const int64_t rows = input.dim() > 0 ? input.size(0) : 0, own = input_splits[static_cast<size_t>(rank())];
  impl_->carried("all_to_all", rows == 0 ? 0 : bytes_of(input) / rows * (rows - own));
  if (size() == 1) {
    output.copy_(input);
    return impl_->local();
  }
  std::vector<int64_t> out_splits = output_splits, in_splits = input_splits;
  c10d::AllToAllOptions o;
  o.timeout = impl_->options.timeout;
  return impl_->call("all_to_all", [&] {
    auto in = input;  // c10d takes it by reference
    return impl_->group->alltoall_base(output, in, out_splits, in_splits, o);
  });
}

Work ProcessGroup::barrier() {
  c10d::BarrierOptions o;
  o.timeout = impl_->options.timeout;
  return impl_->call("barrier", [&] { return impl_->group->barrier(o); });
}

Work ProcessGroup::send(const torch::Tensor& tensor, int64_t dst, int tag) {
  impl_->carried("send", bytes_of(tensor));
  std::vector<torch::Tensor> tensors{tensor};
  return impl_->call("send", [&] { return impl_->group->send(tensors, static_cast<int>(dst), tag); }, nullptr, dst);
}

Work ProcessGroup::recv(torch::Tensor& tensor, int64_t src, int tag) {
  impl_->carried("recv", bytes_of(tensor));
  std::vector<torch::Tensor> tensors{tensor};
  return impl_->call("recv", [&] { return impl_->group->recv(tensors, static_cast<int>(src), tag); }, nullptr,
                     src);
}

std::map<std::string, Traffic> ProcessGroup::traffic() const {
  std::lock_guard<std::mutex> lock(impl_->tally->mutex);
  return impl_->tally->by_collective;
}

void ProcessGroup::reset_traffic() {
  std::lock_guard<std::mutex> lock(impl_->tally->mutex);
  impl_->tally->by_collective.clear();
}

bool built_with_nccl() {
  const auto* parts = cuda::parts();
  return parts != nullptr && parts->nccl;
}

}  // namespace tandem::dist
