// An image classifier's layout cost (layout_cost.h's layout_cost hands
// image models here): its dp ranks under DDP, --strategy allreduce,
// ZeRO-1, FSDP or HSDP, with gradient accumulation's micro-batches. The
// states and traffic are counted from the model's parameters and FSDP's
// padded shards; the activations and FLOPs are measured (Note [measured
// image models] in plan/image_shape.h). Pipelines of image models are
// not planned yet.
#pragma once

#include "tandem/plan/layout_cost.h"

namespace tandem::plan::internal {

LayoutCost image_layout_cost(const Job& job, const Layout& layout);

}  // namespace tandem::plan::internal
