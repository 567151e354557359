// tandem train --mesh auto (auto_mesh.h): the planner inside the trainer.
#include "auto_mesh.h"

#include <map>

#include <nlohmann/json.hpp>

#include "tandem/data/source.h"
#include "tandem/engine/run_setup.h"
#include "tandem/models/registry.h"
#include "tandem/plan/planner.h"
#include "tandem/util/check.h"
#include "tandem/util/env.h"
#include "tandem/util/table.h"

namespace tandem::cli::internal {
namespace {

// The flags that lay `l` out, for tandem train.
std::vector<std::string> layout_flags(const plan::Layout& l) {
  std::vector<std::string> flags{"--mesh", l.mesh()};
  if (l.data == plan::DataSharding::kFsdp || l.data == plan::DataSharding::kHsdp) {
    flags.insert(flags.end(), {"--strategy", "fsdp"});
  }
  if (l.data == plan::DataSharding::kZero1) flags.push_back("--shard-optimizer");
  if (l.sequence_parallel) flags.push_back("--sequence-parallel");
  if (l.pp > 1) flags.insert(flags.end(), {"--micro-batches", std::to_string(l.micro_batches)});
  return flags;
}

// The command line without --mesh auto (or --mesh=auto).
std::vector<std::string> without_mesh(const std::vector<std::string>& args) {
  std::vector<std::string> out;
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i] == "--mesh" && i + 1 < args.size()) {
      ++i;
      continue;
    }
    if (args[i].rfind("--mesh=", 0) == 0) continue;
    out.push_back(args[i]);
  }
  return out;
}

}  // namespace

AutoLayout choose_layout(const engine::TrainOptions& o, const FlagSet& flags, const std::vector<std::string>& args,
                         int64_t workers) {
  const auto splits = data::open_data(o.data, engine::data_options_for(o));
  const auto model_options = engine::model_options_for(o, splits.train->info());
  const bool image = !models::is_language_model(o.model);
  plan::Job job;
  // An image classifier is measured as the run builds it (Note [measured
  // image models]); a step's "sequence" is one image.
  job.model = image ? plan::image_model_shape(o.model, model_options.in_channels, model_options.image_size,
                                              model_options.num_classes, o.dtype == engine::Dtype::kFloat64)
                    : plan::model_shape(o.model, model_options.vocab_size);
  job.gpus_per_node = workers;
  job.device = plan::device_profile(o.device.rfind("cuda", 0) == 0 ? "h100" : "cpu");
  job.seq_len = image ? 1 : o.seq_len;
  job.global_batch = o.batch_size;
  job.precision = o.dtype == engine::Dtype::kFloat64 ? plan::Precision::kFloat64
                  : o.amp == engine::AmpMode::kBf16   ? plan::Precision::kBf16
                                                      : plan::Precision::kFloat32;
  job.optimizer = engine::resolved_optimizer(o) == engine::Optimizer::kAdamW ? plan::OptimizerKind::kAdamW
                  : o.momentum > 0                                          ? plan::OptimizerKind::kSgdMomentum
                                                                            : plan::OptimizerKind::kSgd;
  plan::PlanOptions options;
  options.recompute_both = false;  // every layer recomputed is not a flag of tandem train yet
  // The run's own FSDP and all-reduce flags, which the chosen layout keeps.
  options.fsdp_min_unit = o.fsdp_min_unit_params;
  options.fsdp_reshard = o.fsdp_sharding == engine::FsdpSharding::kFull;
  options.allreduce = o.strategy == engine::Strategy::kAllReduce;
  const auto layouts = plan::plan_layouts(job, options);
  std::string tried;
  for (const auto& c : layouts) {
    const auto& l = c.layout;
    if (!c.fits) break;  // best first: the rest do not fit either
    // What the user asked for stays.
    const bool sharded = l.data == plan::DataSharding::kFsdp || l.data == plan::DataSharding::kHsdp;
    if (flags.given("strategy") && (o.strategy == engine::Strategy::kFsdp) != sharded) continue;
    if (flags.given("shard-optimizer") && o.shard_optimizer != (l.data == plan::DataSharding::kZero1)) continue;
    if (flags.given("sequence-parallel") && o.sequence_parallel != l.sequence_parallel) continue;
    if (flags.given("micro-batches") && (l.pp == 1 || l.micro_batches != o.micro_batches)) continue;
    if (l.pp == 1 && l.micro_batches != 1) continue;  // gradient accumulation is --grad-accum's, not chosen here
    auto chosen = o;
    chosen.mesh = engine::MeshFlag(l.mesh());
    if (sharded) chosen.strategy = engine::Strategy::kFsdp;
    chosen.shard_optimizer = l.data == plan::DataSharding::kZero1;
    chosen.sequence_parallel = l.sequence_parallel;
    if (l.pp > 1) chosen.micro_batches = l.micro_batches;
    try {
      engine::check_train_options(chosen);
      engine::check_train_ranks(chosen, workers);
    } catch (const UsageError& e) {
      if (tried.empty()) tried = l.mesh() + " " + l.strategy() + ": " + e.what();
      continue;
    }
    AutoLayout a;
    a.args = without_mesh(args);
    const auto extra = layout_flags(l);
    a.args.insert(a.args.end(), extra.begin(), extra.end());
    nlohmann::json bytes = nlohmann::json::object();
    for (const auto& [dim, by] : c.stage_bytes.front()) {
      for (const auto& [collective, b] : by) bytes[dim][collective] = b;
    }
    const char* unit = image ? "images/s" : "tokens/s";
    a.prediction = nlohmann::json{{"mesh", l.mesh()},
                                  {"strategy", l.strategy()},
                                  {"rate", c.tokens_per_second},  // the job's sequences' tokens, or its images
                                  {"unit", unit},
                                  {"memory_bytes_per_rank", c.memory.total()},
                                  {"bytes_per_step", bytes}}
                       .dump();
    std::string flat;
    for (size_t i = 0; i < extra.size(); ++i) flat += (i ? " " : "") + extra[i];
    a.summary = format("--mesh auto: %s (the fastest of %zu layouts planned for %lld ranks on %s that fit and that "
                       "the run's flags allow): predicted %s GiB a rank, %.4g %s, a step of %.3g s",
                       flat.c_str(), layouts.size(), static_cast<long long>(workers), job.device.name.c_str(),
                       gib(c.memory.total()).c_str(), c.tokens_per_second, unit, c.step_seconds);
    return a;
  }
  TANDEM_CHECK_USAGE(!layouts.empty(), "--mesh auto: no layout of ", o.model, " over ", workers, " ranks: dp must "
                     "divide the global batch of ", o.batch_size, " sequences (--batch-size), tp the model's heads, "
                     "and pp be at most its layers");
  TANDEM_CHECK_USAGE(layouts.front().fits, "--mesh auto: no layout of ", o.model, " over ",
                     workers, " ranks fits ", job.device.name, "'s memory",
                     layouts.empty() ? std::string()
                                     : " (the closest needs " + gib(layouts.front().memory.total()) + " GiB a rank)");
  throw UsageError("--mesh auto: none of the layouts that fit is one the run's flags allow (--strategy, "
                   "--shard-optimizer, --sequence-parallel and --micro-batches narrow the choice" +
                   (tried.empty() ? std::string(")") : "; the first the run's checks refused: " + tried + ")"));
}

std::string planned_against_measured(double tokens_per_second, double images_per_second,
                                     const std::map<std::string, std::map<std::string, double>>& bytes) {
  const auto text = env::get(kPlanned);
  if (!text) return "";
  const auto planned = nlohmann::json::parse(*text, nullptr, /*allow_exceptions=*/false);
  // The variable is tandem's own; one set by hand that is not a prediction
  // gets no line rather than an error after the run.
  const bool whole = !planned.is_discarded() && planned.is_object() && planned.contains("mesh") &&
                     planned["mesh"].is_string() && planned.contains("strategy") && planned["strategy"].is_string() &&
                     planned.contains("rate") && planned["rate"].is_number() && planned.contains("unit") &&
                     planned["unit"].is_string() && planned.contains("bytes_per_step");
  if (!whole) return "";
  const std::string unit = planned["unit"].get<std::string>();
  const double measured_rate = unit == "images/s" ? images_per_second : tokens_per_second;
  nlohmann::json measured = nlohmann::json::object();
  for (const auto& [dim, by] : bytes) {
    for (const auto& [collective, b] : by) measured[dim][collective] = b;
  }
  const double rate = planned["rate"].get<double>();
  return format("--mesh auto chose %s (%s): predicted %.4g %s, measured %.4g (%.2fx); bytes a step on rank 0 "
                "predicted %s, measured %s%s",
                planned["mesh"].get<std::string>().c_str(), planned["strategy"].get<std::string>().c_str(), rate,
                unit.c_str(), measured_rate, measured_rate / rate, planned["bytes_per_step"].dump().c_str(),
                measured.dump().c_str(), planned["bytes_per_step"] == measured ? " (equal)" : " (they differ)");
}

}  // namespace tandem::cli::internal
