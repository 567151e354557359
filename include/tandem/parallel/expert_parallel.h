// tandem/parallel/expert_parallel.h: expert parallelism, a mixture of
// experts' experts spread over the ranks of a group, each token sent to
// the rank holding its expert and its result sent back (models/moe.h,
// Note [expert split]).
//
//   parallel::spread_experts(*layer->moe, ep_group);  // this rank's experts only
//   auto y = layer->forward(x);                        // all-to-alls inside
//
// Note [expert dispatch]: with E experts over G ranks, rank r holds experts
// [r E/G, (r+1) E/G) (their slices of the 3-D weights; G must divide E).
// Each rank routes its own tokens; its (token, expert) rows arrive sorted
// by expert, so the rows for rank j are one run. A step of a layer:
//  1. the counts per expert go to the ranks holding them (an all-to-all of
//     E/G counts per pair of ranks), so each rank learns how many rows each
//     source sends for each of its experts;
//  2. the rows go to their experts' ranks (an all-to-all of uneven splits,
//     c10d's alltoall_base); they arrive by source, then expert;
//  3. they are regrouped by expert (each expert's rows from every source
//     together, sources in rank order) and each held expert runs one
//     product per projection over them;
//  4. the results go back the same way, in reverse.
// Backward is the same exchanges reversed (each all-to-all's gradient is
// the all-to-all of the gradients with the splits swapped). An expert's
// gradient sums over every token it served, from every rank of the group,
// so the expert weights need no reduction inside the group; over ranks
// that hold the same experts (data parallelism beyond ep) they are averaged
// as the data's other parameters are. The router and everything outside
// the layer stay whole on each rank.
#pragma once

#include <memory>
#include <vector>

#include <torch/types.h>

#include "tandem/dist/process_group.h"
#include "tandem/models/moe.h"

namespace tandem::parallel {

// `input`'s rows to the ranks of `group` (input_splits[j] to rank j) and
// theirs back (output_splits[j] from rank j), differentiable: backward
// sends the gradients the other way.
torch::Tensor all_to_all_rows(const torch::Tensor& input, const std::vector<int64_t>& output_splits,
                              const std::vector<int64_t>& input_splits, std::shared_ptr<dist::ProcessGroup> group);

// Keeps this rank's experts of `moe` (their slices of the weights, in
// place) and sets its dispatch over `group` (Note [expert dispatch]).
// Throws tandem::Error when the group's size does not divide the experts.
void spread_experts(models::SparseMoeImpl& moe, std::shared_ptr<dist::ProcessGroup> group);

}  // namespace tandem::parallel
