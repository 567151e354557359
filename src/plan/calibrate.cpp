// This machine's profile, measured (calibrate.h, Note [calibrated profile]).
#include "tandem/plan/calibrate.h"

#include <algorithm>
#include <chrono>
#include <exception>
#include <fstream>
#include <memory>
#include <thread>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "tandem/dist/process_group.h"
#include "tandem/models/registry.h"
#include "tandem/optim/adamw.h"
#include "tandem/plan/model_shape.h"
#include "tandem/util/atomic_file.h"
#include "norm_timing.h"
#include "one_thread.h"
#include "tandem/util/check.h"
#include "tandem/util/stats.h"
#include "tandem/util/table.h"

namespace tandem::plan {
namespace {

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// The training steps of `model` on micro-batches of `batch` random
// sequences, `timed` of them after `warm` untimed: what one rank of a
// data-parallel job computes a step.
std::vector<double> step_times(models::Sequence& model, optim::AdamW& optimizer, int64_t batch, int warm,
                               int timed, const CalibrateOptions& o) {
  std::vector<double> times;
  for (int i = 0; i < warm + timed; ++i) {
    auto tokens = torch::randint(o.vocab, {batch, o.seq_len + 1}, torch::kLong);
    auto input = tokens.narrow(1, 0, o.seq_len), target = tokens.narrow(1, 1, o.seq_len);
    const auto start = std::chrono::steady_clock::now();
    optimizer.zero_grad();
    auto logits = model->forward(input);
    auto loss = torch::nn::functional::cross_entropy(logits.reshape({-1, logits.size(-1)}), target.reshape(-1));
    loss.backward();
    optimizer.step();
    if (i >= warm) times.push_back(seconds_since(start));
  }
  return times;
}

// The same for an image classifier: `batch` random images of `shape`.
std::vector<double> image_step_times(models::Sequence& model, optim::AdamW& optimizer, int64_t batch, int warm,
                                     int timed, const ImageShape& shape) {
  std::vector<double> times;
  for (int i = 0; i < warm + timed; ++i) {
    auto images = torch::randn({batch, shape.channels, shape.image_size, shape.image_size});
    auto labels = torch::randint(shape.classes, {batch}, torch::kLong);
    const auto start = std::chrono::steady_clock::now();
    optimizer.zero_grad();
    torch::nn::functional::cross_entropy(model->forward(images), labels).backward();
    optimizer.step();
    if (i >= warm) times.push_back(seconds_since(start));
  }
  return times;
}

// Note [calibrated in rounds]: the sizes are timed in turn, a third of
// their steps in each of three rounds, so that a change in the machine's
// load while the calibration runs (a shared machine's other work) moves
// every size alike instead of tilting the fitted line: timed one size
// after the other, a quiet spell over the small sizes alone cut the
// fitted overhead of a layer to a third. A size warms up twice its first
// round, once in each later one.
constexpr int kRounds = 3;

// Float counts of the all-reduces timed: 64 KiB to 16 MiB.
const std::vector<int64_t> kLinkFloats = {int64_t(16) << 10, int64_t(64) << 10, int64_t(256) << 10,
                                          int64_t(1) << 20, int64_t(4) << 20};

}  // namespace

// Note [links timed between products]: a step calls its collectives
// between computations, not in a quiet loop: the buffer has left the
// caches, a waiting thread has slept, the peer arrives a little late. So
// each size's calls alternate, one after a barrier, one after a few
// matrix products on every rank (as a tp region's all-reduce follows its
// layer's): the ring's latency and bandwidth are fitted to the first,
// which the products before them leave as cold as a step's, and the
// median over the sizes of what the second cost more is the profile's
// call_overhead, the peer's lateness a call pays when it is waited for at
// once. Here: 1.1-1.6 ms a ring step (0.8-1.1 ms in a quiet loop, which
// planned tp's 20 all-reduces a step 15-30% fast), 0-0.34 ms a call.
LinkTimes time_allreduces(dist::ProcessGroup& group) {
  const auto a = torch::randn({384, 384}), b = torch::randn({384, 384});
  std::vector<double> means;
  for (const int64_t floats : kLinkFloats) {
    auto t = torch::ones({floats});
    group.all_reduce(t).wait();  // connections made
    // The mean, not the median: a call costs either about 0.5 ms or about
    // 3 ms here (whether a peer's thread slept), and a step pays the mix.
    // The two ways alternate, so that the machine's load moves both alike.
    constexpr int kCalls = 31;
    double total[2] = {0, 0};
    for (int k = 0; k < 2 * kCalls; ++k) {
      const bool between_products = k % 2 == 1;
      if (between_products) {
        for (int i = 0; i < 3; ++i) torch::mm(a, b);
      } else {
        group.barrier().wait();
      }
      const auto start = std::chrono::steady_clock::now();
      group.all_reduce(t).wait();
      total[k % 2] += seconds_since(start);
    }
    means.push_back(total[0] / kCalls);
    means.push_back(total[1] / kCalls);
  }
  auto mean = torch::tensor(means, torch::kFloat64);
  group.all_reduce(mean).wait();
  mean /= double(group.size());
  LinkTimes out;
  for (size_t i = 0; i < kLinkFloats.size(); ++i) {
    const auto k = static_cast<int64_t>(2 * i);
    out.push_back({double(kLinkFloats[i] * 4), mean[k].item<double>(), mean[k + 1].item<double>()});
  }
  return out;
}

std::pair<double, double> fit_steps(const std::vector<std::pair<double, double>>& steps, double peak_flops) {
  auto [slope, intercept] = fit_line(steps);
  double sx = 0, sy = 0;
  for (const auto& [x, y] : steps) {
    sx += x;
    sy += y;
  }
  if (slope < 1.0 / peak_flops) {  // faster than the peak: the peak's slope, the intercept refitted to it
    slope = 1.0 / peak_flops;
    intercept = (sy - slope * sx) / double(steps.size());
  }
  if (intercept < 0) {
    double sxx = 0, sxy = 0;
    for (const auto& [x, y] : steps) {
      sxx += x * x;
      sxy += x * y;
    }
    intercept = 0;
    slope = std::max(sxy / sxx, 1.0 / peak_flops);
  }
  return {slope, intercept};
}

Calibration calibrate(const CalibrateOptions& o, const std::function<void(const std::string&)>& say,
                      const std::function<LinkTimes()>& links) {
  const bool image = is_image_model(o.model);
  TANDEM_CHECK_USAGE(image || models::is_language_model(o.model), "--model ", o.model,
                     ": the calibration times a registry model's training steps");
  TANDEM_CHECK_USAGE(o.micro_batches.size() >= 2, "the calibration fits at least two micro-batch sizes");
  Calibration cal;
  auto& p = cal.profile;
  p = device_profile("cpu");  // a core's matrix-product peak, the node's memory
  p.name = "cpu-calibrated";
  say(format("a core's float32 matrix product: %.2f GFLOP/s", p.peak_flops_fp32 / 1e9));

  const internal::OneThread one_thread;
  // An image classifier at --image-size (3 channels, 10 classes), its
  // FLOPs measured (Note [measured image models]); a language model's
  // counted.
  const auto shape = image ? image_model_shape(o.model, 3, o.image_size, 10, /*float64=*/false)
                           : model_shape(o.model, o.vocab);
  models::ModelOptions mo;
  mo.vocab_size = o.vocab;
  mo.seq_len = o.seq_len;
  mo.image_size = o.image_size;
  // Note [calibrated under load]: a job's ranks keep every core busy, and
  // a core runs slower then than alone (the caches and the memory are
  // shared): each size is timed on every core at once, a model a core on
  // its own thread, and the median of all their steps kept.
  const int64_t cores = std::max<int64_t>(1, p.cores);
  std::vector<models::Sequence> copies;
  std::vector<std::unique_ptr<optim::AdamW>> optimizers;
  for (int64_t c = 0; c < cores; ++c) {
    copies.push_back(models::make_seeded_model(o.model, mo, 0));
    copies.back()->train();
    optimizers.push_back(std::make_unique<optim::AdamW>(copies.back()->parameters(),
                                                        torch::optim::AdamWOptions(1e-4)));
  }
  std::vector<int64_t> sizes;
  for (const int64_t b : o.micro_batches) {
    if (!image || b >= 2) sizes.push_back(b);  // BatchNorm needs more than one value a channel
  }
  // Note [calibrated in rounds]
  const int per_round = std::max(1, (o.steps + kRounds - 1) / kRounds);
  std::vector<std::vector<double>> loaded(sizes.size());
  for (int round = 0; round < kRounds; ++round) {
    for (size_t k = 0; k < sizes.size(); ++k) {
      const int warm = round == 0 ? 2 : 1;
      const auto times = internal::on_every_core(cores, [&](int64_t c) {
        const auto i = static_cast<size_t>(c);
        return image ? image_step_times(copies[i], *optimizers[i], sizes[k], warm, per_round, *shape.image)
                     : step_times(copies[i], *optimizers[i], sizes[k], warm, per_round, o);
      });
      loaded[k].insert(loaded[k].end(), times.begin(), times.end());
    }
  }
  std::vector<std::pair<double, double>> steps;
  for (size_t k = 0; k < sizes.size(); ++k) {
    const int64_t b = sizes[k];
    CalibrationPoint point;
    point.micro_batch = b;
    point.flops = image ? shape.image->flops_per_sample * double(b)
                        : shape.flops_per_token(o.seq_len) * double(b * o.seq_len);
    point.seconds = median(loaded[k]);
    cal.points.push_back(point);
    steps.emplace_back(point.flops, point.seconds);
    say(image ? format("%s, %lld images of 3 x %lld x %lld a step: %.4f s", o.model.c_str(),
                       static_cast<long long>(b), static_cast<long long>(o.image_size),
                       static_cast<long long>(o.image_size), point.seconds)
              : format("%s, %lld x %lld tokens a step: %.4f s", o.model.c_str(), static_cast<long long>(b),
                       static_cast<long long>(o.seq_len), point.seconds));
  }
  TANDEM_CHECK_USAGE(steps.size() >= 2, "the calibration fits at least two micro-batch sizes");
  // Note [replicated element-wise work] (norm_timing.h): a language model's
  // norms and residual adds timed apart, at its width and the sizes' token
  // counts, and taken out of the steps the line is fitted to.
  if (!image) {
    std::vector<int64_t> tokens;
    for (const auto& q : cal.points) tokens.push_back(q.micro_batch * o.seq_len);
    p.norm_timings = internal::time_norms(shape.hidden, tokens, cores, o.steps);
    for (size_t i = 0; i < steps.size(); ++i) {
      const auto& t = p.norm_timings[i];
      say(format("a layer's norms and residual adds on %lld x %lld: %.2f ms with RMSNorm, %.2f with LayerNorm",
                 static_cast<long long>(tokens[i]), static_cast<long long>(shape.hidden), t.rms * 1e3,
                 t.layer * 1e3));
      cal.points[i].replicated = double(shape.layers) * (shape.llama ? t.rms : t.layer);
      steps[i].second -= cal.points[i].replicated;
    }
  }
  const auto [slope, intercept] = fit_steps(steps, p.peak_flops_fp32);
  p.efficiency = std::min(1.0, 1.0 / (slope * p.peak_flops_fp32));
  p.layer_overhead = intercept / double(shape.layers);
  for (auto& q : cal.points) {
    q.fitted = slope * q.flops + intercept + q.replicated;
  }
  say(format("fit: efficiency %.3f of the core's peak, %.1f us a layer and micro-batch besides its FLOPs",
             p.efficiency, p.layer_overhead * 1e6));

  cal.links = links();
  std::vector<std::pair<double, double>> quiet;
  std::vector<double> more;
  for (const auto& [bytes, alone, between] : cal.links) {
    say(format("all-reduce of %.0f bytes between two processes: %.3f ms after a barrier, %.3f ms after products",
               bytes, alone * 1e3, between * 1e3));
    quiet.emplace_back(bytes, alone);
    more.push_back(between - alone);
  }
  // Two ranks: a ring all-reduce is 2 steps and puts its payload on the wire once.
  const auto [per_byte, fixed] = fit_line(quiet);
  p.intra_node_latency = p.inter_node_latency = std::max(fixed / 2.0, 1e-9);
  p.intra_node_bandwidth = p.inter_node_bandwidth = 1.0 / std::max(per_byte, 1e-15);
  p.call_overhead = std::max(0.0, median(more));  // Note [links timed between products]
  say(format("loopback Gloo fit: %.1f us a ring step, %.2f GB/s, %.1f us more a call between computations",
             p.intra_node_latency * 1e6, p.intra_node_bandwidth / 1e9, p.call_overhead * 1e6));
  return cal;
}

void write_profile(const DeviceProfile& p, const std::string& path) {
  nlohmann::ordered_json j;
  j["name"] = p.name;
  j["peak_tflops_bf16"] = p.peak_flops_bf16 / 1e12;
  j["peak_tflops_fp32"] = p.peak_flops_fp32 / 1e12;
  j["memory_gib"] = p.memory_bytes / (1024.0 * 1024.0 * 1024.0);
  j["intra_node_gb_per_s"] = p.intra_node_bandwidth / 1e9;
  j["inter_node_gb_per_s"] = p.inter_node_bandwidth / 1e9;
  j["intra_node_latency_us"] = p.intra_node_latency * 1e6;
  j["inter_node_latency_us"] = p.inter_node_latency * 1e6;
  j["efficiency"] = p.efficiency;
  j["layer_overhead_us"] = p.layer_overhead * 1e6;
  j["call_overhead_us"] = p.call_overhead * 1e6;
  if (!p.norm_timings.empty()) {
    j["norm_seconds"] = nlohmann::ordered_json::array();
    for (const auto& t : p.norm_timings) j["norm_seconds"].push_back({t.elements, t.rms, t.layer});
  }
  if (p.cores > 0) j["cores"] = p.cores;
  write_atomically(path, [&](const std::string& tmp) {
    std::ofstream out(tmp);
    out << j.dump(2) << "\n";
    TANDEM_CHECK(out.good(), "--calibrate ", path, ": cannot write the profile");
  });
}

}  // namespace tandem::plan
