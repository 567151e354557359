// tandem plan: every layout of a training job on a cluster, with its
// predicted memory, traffic, bubble and time, best first (plan/planner.h).
#include <cstdio>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "calibrate_command.h"
#include "tandem/cli/commands.h"
#include "tandem/cli/flags.h"
#include "tandem/dist/device_mesh.h"
#include "tandem/plan/planner.h"
#include "tandem/util/atomic_file.h"
#include "tandem/util/check.h"
#include "tandem/util/table.h"

namespace tandem::cli {
namespace {

struct PlanFlags {
  std::string model, device = "h100", mesh, calibrate, time_links;
  int64_t nodes = 1, gpus_per_node = 8, seq_len = 0, global_batch_tokens = 0, batch_size = 0, vocab_size = 0;
  int64_t image_size = 32, channels = 3, classes = 10;
  int64_t top = 10;
  plan::Precision precision = plan::Precision::kBf16;
  plan::OptimizerKind optimizer = plan::OptimizerKind::kAdamW;
  bool json = false;
};

FlagSet plan_flags(PlanFlags& f) {
  FlagSet flags("tandem plan",
                "Predict, for every layout tandem can train a language model in on a cluster (dp, ZeRO-1, FSDP, "
                "HSDP; pp; cp; ep for a mixture of experts; tp with and without sequence parallelism; activation "
                "checkpointing; micro-batches), or an image classifier (its data strategies over dp ranks, measured "
                "on this machine), "
                "each rank's memory, the bytes a step sends over each mesh dimension (what --metrics-out "
                "counts), the pipeline's bubble (its schedule replayed), the step's time, tokens/s and MFU; "
                "best first. Exit 2 when no layout fits.");
  flags.add_string("model", "NAME", &f.model, "a registry language model (gpt2-tiny ... gpt3-175b, llama-tiny ... "
                   "llama-3.1-405b, mixtral-8x7b, qwen3-30b-a3b) or image classifier (convnet, mlp, resnet18, "
                   "resnet34, resnet50, mobilenetv2); required");
  flags.add_int("nodes", "N", &f.nodes, "machines", 1);
  flags.add_int("gpus-per-node", "G", &f.gpus_per_node, "ranks a machine (its GPUs, or cpu processes)", 1);
  flags.add_string("device", "PROFILE", &f.device,
                   "h100, h200, a100, cpu (this machine, measured), or a JSON profile's path: peak_tflops_bf16, "
                   "peak_tflops_fp32, memory_gib, intra_node_gb_per_s, inter_node_gb_per_s, intra_node_latency_us, "
                   "inter_node_latency_us, efficiency");
  flags.add_int("seq-len", "T", &f.seq_len, "tokens a sequence (0: the model's context, at most 2048)", 0);
  flags.add_int("global-batch-tokens", "K", &f.global_batch_tokens,
                "tokens a step over the whole job (a multiple of --seq-len)", 1);
  flags.add_int("batch-size", "B", &f.batch_size, "sequences (an image classifier's images) a step over the whole "
                "job (instead of --global-batch-tokens; 0: one a rank)", 0);
  flags.add_enum("precision", &f.precision,
                 {{"bf16", plan::Precision::kBf16}, {"float32", plan::Precision::kFloat32},
                  {"float64", plan::Precision::kFloat64}},
                 "bf16: autocast over float32 weights (--amp bf16); float32 or float64: --dtype");
  flags.add_enum("optimizer", &f.optimizer,
                 {{"adamw", plan::OptimizerKind::kAdamW}, {"sgd", plan::OptimizerKind::kSgdMomentum},
                  {"sgd-plain", plan::OptimizerKind::kSgd}},
                 "the optimizer's state a parameter: AdamW's two moments, SGD's momentum, or none");
  flags.add_int("vocab-size", "V", &f.vocab_size, "the vocabulary (0: the preset's; 256 for text as bytes)", 0);
  flags.add_int("image-size", "S", &f.image_size, "an image classifier's images: S x S pixels", 1);
  flags.add_int("channels", "C", &f.channels, "an image classifier's images: C channels", 1);
  flags.add_int("classes", "K", &f.classes, "an image classifier's classes", 2);
  flags.add_string("mesh", "SPEC", &f.mesh, "only the layouts of this mesh (as tandem train --mesh)");
  flags.add_int("top", "N", &f.top, "layouts in the table (--json has them all)", 1);
  flags.add_switch("json", &f.json, "print {\"layouts\": [...]} best first instead of the table");
  flags.add_string("calibrate", "FILE", &f.calibrate,
                   "measure this machine instead of planning: time training steps of --model (default llama-tiny) "
                   "at --seq-len (default 64), or of an image classifier at --image-size, and loopback Gloo "
                   "all-reduces, and write a profile for --device FILE");
  flags.add_string("time-links", "FILE", &f.time_links,
                   "internal: the link timing --calibrate runs as two worker processes");
  return flags;
}

// --mesh's words as the planner writes them ("pp=2,dp=4,tp=2").
std::string planned_mesh(const std::string& spec, int64_t world) {
  const auto shape = dist::parse_mesh(spec, world);
  plan::Layout l;
  l.ep = shape.ep;
  l.pp = shape[dist::MeshDim::kPipeline];
  l.dp = shape.dp();
  l.cp = shape.cp;
  l.tp = shape[dist::MeshDim::kTensor];
  if (shape.dp_shard > 0) {
    l.data = plan::DataSharding::kHsdp;
    l.dp_shard = shape.dp_shard;
  }
  return l.mesh();
}

nlohmann::json bytes_json(const std::map<std::string, std::map<std::string, double>>& bytes) {
  nlohmann::json out = nlohmann::json::object();
  for (const auto& [dim, by] : bytes) {
    for (const auto& [collective, b] : by) out[dim][collective] = b;
  }
  return out;
}

// `throughput`: the key of the job's rate, "tokens_per_second" or for an
// image classifier "images_per_second".
nlohmann::json to_json(const plan::LayoutCost& c, const std::string& throughput) {
  const auto& l = c.layout;
  const auto bytes = bytes_json(c.bytes);
  nlohmann::json stages = nlohmann::json::array();
  for (const auto& s : c.stage_bytes) stages.push_back(bytes_json(s));
  nlohmann::json memories = nlohmann::json::array();
  for (const auto& m : c.stage_memory) memories.push_back(m.total());
  return {{"mesh", l.mesh()},
          {"strategy", l.strategy()},
          {"sequence_parallel", l.sequence_parallel},
          {"activation_checkpointing", l.recompute},
          {"micro_batch", l.micro_batch},
          {"micro_batches", l.micro_batches},
          {"schedule", l.pp > 1 ? l.schedule : ""},
          {"fits", c.fits},
          {"shortfall_bytes", c.shortfall},
          {"memory_bytes_per_rank", c.memory.total()},
          {"memory_bytes_by_stage", memories},
          {"memory", {{"parameters", c.memory.parameters}, {"gradients", c.memory.gradients},
                      {"optimizer", c.memory.optimizer}, {"activations", c.memory.activations},
                      {"buffers", c.memory.buffers}}},
          {"bytes_per_step", bytes},
          {"bytes_per_step_by_stage", stages},
          {"bubble", c.bubble},
          {"compute_seconds", c.compute_seconds},
          {"exposed_comm_seconds", c.exposed_comm_seconds},
          {"bubble_seconds", c.bubble_seconds},
          {"step_seconds", c.step_seconds},
          {throughput, c.tokens_per_second},
          {"mfu", c.mfu}};
}


// The flags that size the other kind of model's batch are refused: an
// image classifier's batch is images of --channels x --image-size squared,
// a language model's sequences of --seq-len tokens. `also`: more of the
// language model's that the command takes.
void check_model_kind_flags(const FlagSet& flags, const std::string& model, bool image,
                            std::vector<const char*> also = {}) {
  std::vector<const char*> text_only{"seq-len", "vocab-size"};
  text_only.insert(text_only.end(), also.begin(), also.end());
  for (const char* name : image ? text_only : std::vector<const char*>{"image-size", "channels", "classes"}) {
    TANDEM_CHECK_USAGE(!flags.given(name), "--", name, ": ", model,
                       image ? " is an image classifier (its batch is --batch-size images of --channels x "
                               "--image-size x --image-size)"
                             : " is a language model (its batch is sequences of --seq-len tokens)");
  }
}

double dim_bytes(const plan::LayoutCost& c, const std::string& dim) {
  double total = 0;
  auto found = c.bytes.find(dim);
  if (found != c.bytes.end()) {
    for (const auto& [collective, b] : found->second) total += b;
  }
  return total;
}

// tandem plan --calibrate FILE (Note [calibrated profile]).
int calibrate_command(const PlanFlags& f, const FlagSet& flags) {
  for (const char* other : {"nodes", "gpus-per-node", "device", "global-batch-tokens", "batch-size", "precision",
                            "optimizer", "mesh", "top", "json", "channels", "classes"}) {
    TANDEM_CHECK_USAGE(!flags.given(other), "--", other, " plans a job: --calibrate measures this machine and "
                       "takes only --model, --seq-len and --vocab-size (a language model's) or --image-size (an "
                       "image classifier's)");
  }
  check_replaceable_file("--calibrate", f.calibrate);
  check_output_file("--calibrate", f.calibrate);
  plan::CalibrateOptions o;
  if (!f.model.empty()) o.model = f.model;
  const bool image = plan::is_image_model(o.model);
  check_model_kind_flags(flags, o.model, image);
  if (image) {
    o.image_size = f.image_size;
    return internal::calibrate_machine(o, f.calibrate);
  }
  if (f.seq_len > 0) o.seq_len = f.seq_len;
  if (f.vocab_size > 0) o.vocab = f.vocab_size;
  const auto shape = plan::model_shape(o.model, o.vocab);
  TANDEM_CHECK_USAGE(o.seq_len <= shape.context, "--seq-len ", o.seq_len, ": ", o.model, " takes sequences of at most ",
                     shape.context, " tokens");
  return internal::calibrate_machine(o, f.calibrate);
}

}  // namespace

std::string plan_help() {
  PlanFlags f;
  return plan_flags(f).help();
}

int plan_command(const std::vector<std::string>& args) {
  PlanFlags f;
  auto flags = plan_flags(f);
  flags.parse(args);
  if (flags.help_requested()) {
    std::printf("%s", flags.help().c_str());
    return 0;
  }
  if (flags.given("time-links")) return internal::time_links_worker(f.time_links);
  if (flags.given("calibrate")) return calibrate_command(f, flags);
  TANDEM_CHECK_USAGE(!f.model.empty(), "--model NAME is required (a registry language model, e.g. llama-3-8b)");
  TANDEM_CHECK_USAGE(!(flags.given("global-batch-tokens") && flags.given("batch-size")),
                     "give --global-batch-tokens or --batch-size, not both");
  // Bounds that keep every figure finite and the enumeration short.
  constexpr int64_t kMostRanks = int64_t(1) << 20, kMostSequences = int64_t(1) << 24;
  TANDEM_CHECK_USAGE(f.nodes <= kMostRanks && f.gpus_per_node <= kMostRanks && f.nodes * f.gpus_per_node <= kMostRanks,
                     "--nodes ", f.nodes, " x --gpus-per-node ", f.gpus_per_node, ": the planner lays out at most ",
                     kMostRanks, " ranks (2^20, as --mesh)");
  TANDEM_CHECK_USAGE(f.batch_size <= kMostSequences, "--batch-size ", f.batch_size, ": at most ", kMostSequences,
                     " sequences a step (2^24)");
  TANDEM_CHECK_USAGE(f.global_batch_tokens <= (int64_t(1) << 40), "--global-batch-tokens ", f.global_batch_tokens,
                     ": at most 2^40 tokens a step");
  plan::Job job;
  const bool image = plan::is_image_model(f.model);
  check_model_kind_flags(flags, f.model, image, {"global-batch-tokens"});
  job.model = image ? plan::image_model_shape(f.model, f.channels, f.image_size, f.classes,
                                              f.precision == plan::Precision::kFloat64)
                    : plan::model_shape(f.model, f.vocab_size);
  job.nodes = f.nodes;
  job.gpus_per_node = f.gpus_per_node;
  job.device = plan::device_profile(f.device);
  job.precision = f.precision;
  job.optimizer = f.optimizer;
  // An image is a sequence of one token: tokens/s are images/s.
  job.seq_len = image ? 1 : f.seq_len > 0 ? f.seq_len : std::min<int64_t>(job.model.context, 2048);
  TANDEM_CHECK_USAGE(image || job.seq_len <= job.model.context, "--seq-len ", job.seq_len, ": ", f.model,
                     " takes sequences of at most ", job.model.context, " tokens");
  if (f.global_batch_tokens > 0) {
    TANDEM_CHECK_USAGE(f.global_batch_tokens % job.seq_len == 0, "--global-batch-tokens ", f.global_batch_tokens,
                       ": not a whole number of sequences of ", job.seq_len, " tokens (--seq-len)");
    job.global_batch = f.global_batch_tokens / job.seq_len;
    TANDEM_CHECK_USAGE(job.global_batch <= kMostSequences, "--global-batch-tokens ", f.global_batch_tokens, ": ",
                       job.global_batch, " sequences a step, over the planner's 2^24");
  } else {
    job.global_batch = f.batch_size > 0 ? f.batch_size : job.world();
  }
  plan::PlanOptions options;
  if (!f.mesh.empty()) options.mesh = planned_mesh(f.mesh, job.world());
  const auto layouts = plan::plan_layouts(job, options);
  TANDEM_CHECK_USAGE(!layouts.empty() || !image, "no layout of ", f.model, " on ", job.world(), " rank(s)",
                     f.mesh.empty() ? "" : " with --mesh " + f.mesh, ": an image classifier is planned over dp "
                     "ranks only, dividing the global batch of ", job.global_batch, " images");
  TANDEM_CHECK_USAGE(!layouts.empty(), "no layout of ", f.model, " on ", job.world(), " rank(s)",
                     f.mesh.empty() ? "" : " with --mesh " + f.mesh, ": the planner's layouts have tp dividing a "
                     "node's ranks (", job.gpus_per_node, ") and the model's ", job.model.heads, " heads and ",
                     job.model.kv_heads, " key/value heads, 2 cp dividing the sequence of ", job.seq_len,
                     " tokens, pp at most its ", job.model.layers, " layers, dp dividing the global batch of ",
                     job.global_batch, " sequences, and HSDP's shard groups a node's dp ranks");
  if (f.json) {
    nlohmann::json all = nlohmann::json::array();
    for (const auto& c : layouts) all.push_back(to_json(c, image ? "images_per_second" : "tokens_per_second"));
    std::printf("%s\n", nlohmann::json{{"layouts", all}}.dump(1).c_str());
  } else {
    const std::string batch = image ? format("%lld images of %lld x %lld x %lld", static_cast<long long>(job.global_batch),
                                             static_cast<long long>(f.channels), static_cast<long long>(f.image_size),
                                             static_cast<long long>(f.image_size))
                                    : format("%lld sequences of %lld tokens", static_cast<long long>(job.global_batch),
                                             static_cast<long long>(job.seq_len));
    std::printf("%s on %lld x %lld %s, %s a step: %zu layouts\n\n", f.model.c_str(),
                static_cast<long long>(job.nodes), static_cast<long long>(job.gpus_per_node),
                job.device.name.c_str(), batch.c_str(), layouts.size());
    Table table({"mesh", "strategy", "sp", "ac", "micro", "GiB/rank", "fits", "dp MB", "cp MB", "tp MB", "pp MB",
                 "bubble", "step s", image ? "images/s" : "tokens/s", "MFU"});
    for (size_t i = 0; i < layouts.size() && static_cast<int64_t>(i) < f.top; ++i) {
      const auto& c = layouts[i];
      const auto& l = c.layout;
      table.add_row({l.mesh(), l.strategy(), l.sequence_parallel ? "on" : "", l.recompute ? "on" : "",
                     format("%lldx%lld", static_cast<long long>(l.micro_batches), static_cast<long long>(l.micro_batch)),
                     gib(c.memory.total()), c.fits ? "yes" : "no (+" + gib(c.shortfall) + ")",
                     format("%.1f", (dim_bytes(c, "dp") + dim_bytes(c, "dp_cp")) / 1e6),
                     format("%.1f", dim_bytes(c, "cp") / 1e6),
                     format("%.1f", dim_bytes(c, "tp") / 1e6),
                     format("%.1f", dim_bytes(c, "pp") / 1e6), format("%.3f", c.bubble),
                     format("%.3g", c.step_seconds), format("%.4g", c.tokens_per_second),
                     format("%.3f", c.mfu)});
    }
    std::printf("%s", table.render().c_str());
  }
  if (!layouts.front().fits) {
    const auto& best = layouts.front();
    throw UsageError("no layout of " + f.model + " fits " + std::to_string(job.world()) + " x " + job.device.name +
                     ": the closest, " + best.layout.mesh() + " " + best.layout.strategy() +
                     (best.layout.recompute ? " with activation checkpointing" : "") + ", needs " +
                     gib(best.memory.total()) + " GiB a rank, " + gib(best.shortfall) + " more than it has");
  }
  return 0;
}

}  // namespace tandem::cli
