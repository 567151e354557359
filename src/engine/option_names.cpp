// The names the command line gives each mode of TrainOptions
// (train_options.h), both ways: the flag table parses them, messages and
// fingerprints print them.
#include <ostream>
#include <string>

#include "tandem/engine/train_options.h"

namespace tandem::engine {

const EnumNames<Strategy>& strategy_names() {
  static const EnumNames<Strategy> names = {
      {"auto", Strategy::kAuto}, {"none", Strategy::kNone}, {"ddp", Strategy::kDdp},
      {"allreduce", Strategy::kAllReduce}, {"fsdp", Strategy::kFsdp}, {"dp", Strategy::kDp},
      {"pipeline", Strategy::kPipeline}};
  return names;
}

const EnumNames<Dtype>& dtype_names() {
  static const EnumNames<Dtype> names = {{"float32", Dtype::kFloat32}, {"float64", Dtype::kFloat64}};
  return names;
}

const EnumNames<Schedule>& schedule_names() {
  static const EnumNames<Schedule> names = {
      {"gpipe", Schedule::kGpipe}, {"1f1b", Schedule::k1F1B}, {"interleaved", Schedule::kInterleaved}};
  return names;
}

const EnumNames<DistBackend>& dist_backend_names() {
  static const EnumNames<DistBackend> names = {
      {"auto", DistBackend::kAuto}, {"gloo", DistBackend::kGloo}, {"nccl", DistBackend::kNccl}};
  return names;
}

const EnumNames<PipelineBalance>& pipeline_balance_names() {
  static const EnumNames<PipelineBalance> names = {{"time", PipelineBalance::kTime},
                                                   {"params", PipelineBalance::kParams}};
  return names;
}

const EnumNames<FsdpSharding>& fsdp_sharding_names() {
  static const EnumNames<FsdpSharding> names = {{"full", FsdpSharding::kFull}, {"grad-op", FsdpSharding::kGradOp}};
  return names;
}

const EnumNames<ProgressMode>& progress_names() {
  static const EnumNames<ProgressMode> names = {
      {"auto", ProgressMode::kAuto}, {"bar", ProgressMode::kBar}, {"lines", ProgressMode::kLines},
      {"off", ProgressMode::kOff}};
  return names;
}

const EnumNames<AmpMode>& amp_names() {
  static const EnumNames<AmpMode> names = {{"off", AmpMode::kOff}, {"bf16", AmpMode::kBf16}, {"fp16", AmpMode::kFp16}};
  return names;
}

const EnumNames<DdpCommHook>& ddp_comm_hook_names() {
  static const EnumNames<DdpCommHook> names = {
      {"allreduce", DdpCommHook::kAllReduce}, {"fp16", DdpCommHook::kFp16}, {"bf16", DdpCommHook::kBf16}};
  return names;
}

const EnumNames<CheckpointFormat>& checkpoint_format_names() {
  static const EnumNames<CheckpointFormat> names = {
      {"auto", CheckpointFormat::kAuto}, {"file", CheckpointFormat::kFile}, {"sharded", CheckpointFormat::kSharded}};
  return names;
}

const EnumNames<Optimizer>& optimizer_names() {
  static const EnumNames<Optimizer> names = {
      {"auto", Optimizer::kAuto}, {"sgd", Optimizer::kSgd}, {"adamw", Optimizer::kAdamW}};
  return names;
}

namespace {

template <class E>
const std::string& name_in(const EnumNames<E>& names, E value) {
  for (const auto& [name, e] : names) {
    if (e == value) return name;
  }
  static const std::string unknown = "?";
  return unknown;
}

}  // namespace

const std::string& strategy_name(Strategy s) { return name_in(strategy_names(), s); }
const std::string& option_name(Optimizer o) { return name_in(optimizer_names(), o); }
const std::string& option_name(Dtype d) { return name_in(dtype_names(), d); }
const std::string& option_name(Schedule s) { return name_in(schedule_names(), s); }
const std::string& option_name(DistBackend b) { return name_in(dist_backend_names(), b); }
const std::string& option_name(PipelineBalance b) { return name_in(pipeline_balance_names(), b); }
const std::string& option_name(FsdpSharding s) { return name_in(fsdp_sharding_names(), s); }
const std::string& option_name(ProgressMode p) { return name_in(progress_names(), p); }
const std::string& option_name(AmpMode a) { return name_in(amp_names(), a); }
const std::string& option_name(DdpCommHook h) { return name_in(ddp_comm_hook_names(), h); }
const std::string& option_name(CheckpointFormat f) { return name_in(checkpoint_format_names(), f); }

std::ostream& operator<<(std::ostream& out, Strategy s) { return out << strategy_name(s); }
std::ostream& operator<<(std::ostream& out, Optimizer o) { return out << option_name(o); }
std::ostream& operator<<(std::ostream& out, Dtype d) { return out << option_name(d); }
std::ostream& operator<<(std::ostream& out, Schedule s) { return out << option_name(s); }
std::ostream& operator<<(std::ostream& out, DistBackend b) { return out << option_name(b); }
std::ostream& operator<<(std::ostream& out, PipelineBalance b) { return out << option_name(b); }
std::ostream& operator<<(std::ostream& out, FsdpSharding s) { return out << option_name(s); }
std::ostream& operator<<(std::ostream& out, ProgressMode p) { return out << option_name(p); }
std::ostream& operator<<(std::ostream& out, AmpMode a) { return out << option_name(a); }
std::ostream& operator<<(std::ostream& out, DdpCommHook h) { return out << option_name(h); }
std::ostream& operator<<(std::ostream& out, CheckpointFormat f) { return out << option_name(f); }

}  // namespace tandem::engine
