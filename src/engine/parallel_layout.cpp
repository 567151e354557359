// The run's layout from its flags (parallel_layout.h).
#include "tandem/engine/parallel_layout.h"

#include "tandem/models/registry.h"
#include "tandem/util/check.h"

namespace tandem::engine {

using dist::MeshDim;

void check_context_seq_len(int64_t seq_len, int64_t cp, const std::string& mesh) {
  TANDEM_CHECK_USAGE(cp <= 1 || seq_len % (2 * cp) == 0, "--seq-len ", seq_len, ": context parallelism over cp=", cp,
                     " (--mesh ", mesh, ") cuts each sequence into ", 2 * cp, " equal chunks; give a length that ",
                     2 * cp, " divides");
}

bool pipelined(const ParallelSection& o) {
  return o.strategy == Strategy::kPipeline || o.mesh[MeshDim::kPipeline] > 1;
}

ParallelLayout parallel_layout(const TrainOptions& o, int64_t ranks) {
  TANDEM_CHECK_USAGE(!o.mesh.is_auto(), "--mesh auto is chosen by tandem train's own launcher before its workers "
                     "start: give --nproc-per-node N (under another launcher, give the mesh itself)");
  ParallelLayout layout;
  layout.pipeline = pipelined(o);
  if (o.mesh.empty()) {
    layout.mesh[layout.pipeline && o.devices.empty() ? MeshDim::kPipeline : MeshDim::kData] = ranks;
  } else {
    const std::string flag = "--mesh " + o.mesh.text();
    layout.mesh = o.mesh.for_ranks(ranks);
    if (layout.tensor_ranks() > 1) {  // the combinations tensor parallelism has so far
      TANDEM_CHECK_USAGE(models::is_language_model(o.model), flag, ": tensor parallelism splits a language model's "
                         "layers; ", o.model, " is an image classifier (lay the ranks out over dp and pp)");
    }
    if (layout.context_ranks() > 1) {  // the combinations context parallelism has so far
      TANDEM_CHECK_USAGE(models::is_language_model(o.model), flag, ": context parallelism splits a language model's "
                         "sequences; ", o.model, " is an image classifier");
      TANDEM_CHECK_USAGE(o.dropout == 0, flag, ": context parallelism with --dropout is not supported yet");
      TANDEM_CHECK_USAGE(o.device.rfind("cuda", 0) != 0, flag, ": context parallelism runs on the CPU only for now "
                         "(--device ", o.device, ")");
    }
    if (layout.mesh.ep > 1) {  // the combinations expert parallelism has so far
      const int64_t ep = layout.mesh.ep;
      const int64_t experts = models::is_language_model(o.model) ? models::model_traits(o.model).experts : 0;
      TANDEM_CHECK_USAGE(experts > 0, flag, ": expert parallelism spreads a mixture of experts' experts over ranks; ",
                         o.model, " has no experts (mixtral-tiny, qwen3-moe-tiny, ... have)");
      TANDEM_CHECK_USAGE(experts % ep == 0, flag, ": ep=", ep, " does not divide ", o.model, "'s ", experts,
                         " experts");
      TANDEM_CHECK_USAGE(o.strategy == Strategy::kAuto || o.strategy == Strategy::kDdp ||
                             o.strategy == Strategy::kAllReduce || o.strategy == Strategy::kPipeline,
                         flag, ": expert parallelism runs with DDP or the all-reduce over the data ranks so far "
                         "(--strategy ddp, the default, or allreduce), not --strategy ", o.strategy);
      TANDEM_CHECK_USAGE(o.device.rfind("cuda", 0) != 0, flag, ": expert parallelism runs on the CPU only for now "
                         "(--device ", o.device, ")");
    }
    if (layout.mesh.dp_shard > 0 && o.strategy != Strategy::kFsdp) {
      const std::string hsdp = flag + ": dp_replicate and dp_shard lay out HSDP (FSDP over each group of dp_shard "
                                      "ranks, replicated over dp_replicate groups); give --strategy fsdp";
      // dp=N only where that strategy takes a dp dimension.
      TANDEM_CHECK_USAGE(o.strategy != Strategy::kDdp && o.strategy != Strategy::kAllReduce &&
                             o.strategy != Strategy::kAuto,
                         hsdp, ", or dp=", layout.mesh[MeshDim::kData], " for --strategy ", o.strategy);
      TANDEM_CHECK_USAGE(false, hsdp);
    }
    TANDEM_CHECK_USAGE(o.strategy != Strategy::kNone && o.strategy != Strategy::kDp, flag, ": --strategy ", o.strategy,
                       " runs in one process; a mesh lays out the processes of a job");
    TANDEM_CHECK_USAGE(o.devices.empty(), "--devices ", o.devices, ": with ", flag,
                       " every rank runs its stage on its own --device; leave out --devices");
    TANDEM_CHECK_USAGE(o.strategy != Strategy::kPipeline || layout.pipeline_ranks() > 1 || ranks == 1, flag,
                       ": --strategy pipeline needs pp > 1 (e.g. --mesh pp=", ranks, ")");
  }
  if (o.strategy == Strategy::kAllReduce) {
    layout.data = DataParallelism::kAllReduce;
  } else if (o.strategy == Strategy::kFsdp) {
    layout.data = DataParallelism::kFsdp;
  } else if (o.strategy == Strategy::kNone || o.strategy == Strategy::kDp) {
    layout.data = DataParallelism::kNone;
  }
  return layout;
}

}  // namespace tandem::engine
