// Groups made from a group: duplicates (the same ranks; their traffic
// counted in their origin's too) and splits (a subset of the ranks, as a
// device mesh's slices).
#include <algorithm>
#include <numeric>

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include "group_impl.h"
#include "tandem/util/check.h"

namespace tandem::dist {

using namespace internal;

std::shared_ptr<ProcessGroup> ProcessGroup::duplicate(const std::string& name) {
  auto impl = std::make_unique<Impl>();
  impl->rendezvous = impl_->rendezvous;
  impl->options = impl_->options;
  impl->backend = impl_->backend;
  impl->members = impl_->members;
  impl->label = impl_->label;
  impl->origins = impl_->origins;  // Note [traffic]: counted where the origin's is
  impl->origins.push_back(impl_->tally);
  // Numbered, so that a second duplicate of the same name never meets the
  // first one's keys in the store (every rank counts the same way).
  impl->store = c10::make_intrusive<c10d::PrefixStore>(
      "duplicate/" + std::to_string(impl_->duplicates++) + "/" + name, impl_->store);
  impl->connect();
  impl->count = counted_group(impl->store, impl_->count ? impl_->count->root : impl_->store,
                              impl->rendezvous.rank, impl->rendezvous.world_size,
                              impl_->count ? impl_->count->store_host : 0, impl->members,
                              impl_->count ? impl_->count->job_world : 0);
  return std::shared_ptr<ProcessGroup>(new ProcessGroup(std::move(impl)));
}

// Note [splits]: a split is a group of some of a group's ranks over the
// same store, under a prefix of its own: "split/<n>/<label>/<its ranks>".
// Every rank of the group calls split() in the same order (so n agrees),
// each with the ranks of its own slice; the slices of one call do not
// meet, since their prefixes differ. Each split forms its own Gloo (or NCCL)
// group, with the parent's backend and timeout. Its ranks count from 0 as
// c10d's do, but messages and the ranks a timeout names are the job's
// (group_impl.h, Note [who did not come]): a user and the launcher know
// the job's ranks only. Rank 0's process serves the store of every split,
// whether or not rank 0 is in it.
std::shared_ptr<ProcessGroup> ProcessGroup::split(const std::string& label, const std::vector<int64_t>& ranks) {
  TANDEM_CHECK(!ranks.empty() && std::is_sorted(ranks.begin(), ranks.end()) &&
                   std::adjacent_find(ranks.begin(), ranks.end()) == ranks.end(),
               "split '", label, "': expected this group's ranks in increasing order, each once");
  TANDEM_CHECK(ranks.front() >= 0 && ranks.back() < size(), "split '", label, "': ", rank_list(ranks),
               " are not all ranks of this group of ", size());
  const auto mine = std::find(ranks.begin(), ranks.end(), rank());
  TANDEM_CHECK(mine != ranks.end(), "split '", label, "': rank ", rank(), " is not in ", rank_list(ranks),
               ", the ranks it was asked to join");
  auto impl = std::make_unique<Impl>();
  impl->rendezvous = impl_->rendezvous;
  impl->rendezvous.rank = mine - ranks.begin();
  impl->rendezvous.world_size = static_cast<int64_t>(ranks.size());
  impl->options = impl_->options;
  impl->backend = impl_->backend;
  impl->label = label;
  for (int64_t r : ranks) impl->members.push_back(impl_->job_rank(r));
  std::string name;
  for (int64_t r : impl->members) name += (name.empty() ? "" : ",") + std::to_string(r);
  impl->store = c10::make_intrusive<c10d::PrefixStore>(
      "split/" + std::to_string(impl_->splits++) + "/" + label + "/" + name, impl_->store);
  impl->connect();
  impl->count = counted_group(impl->store, impl_->count ? impl_->count->root : impl_->store,
                              impl->rendezvous.rank, impl->rendezvous.world_size,
                              impl_->count ? impl_->count->store_host : 0, impl->members,
                              impl_->count ? impl_->count->job_world : impl_->rendezvous.world_size);
  return std::shared_ptr<ProcessGroup>(new ProcessGroup(std::move(impl)));
}

std::vector<int64_t> ProcessGroup::job_ranks() const {
  if (!impl_->members.empty()) return impl_->members;
  std::vector<int64_t> all(static_cast<size_t>(size()));
  std::iota(all.begin(), all.end(), 0);
  return all;
}

}  // namespace tandem::dist
