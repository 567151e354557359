// The planner's device profiles (device_profile.h).
#include "tandem/plan/device_profile.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "one_thread.h"
#include "tandem/util/check.h"

namespace tandem::plan {
namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

DeviceProfile gpu(const std::string& name, double bf16_tflops, double fp32_tflops, double memory_bytes,
                  double nvlink_gb_per_s, double network_gb_per_s) {
  DeviceProfile p;
  p.name = name;
  p.peak_flops_bf16 = bf16_tflops * 1e12;
  p.peak_flops_fp32 = fp32_tflops * 1e12;
  p.memory_bytes = memory_bytes;
  p.intra_node_bandwidth = nvlink_gb_per_s * 1e9;
  p.inter_node_bandwidth = network_gb_per_s * 1e9;
  p.intra_node_latency = 10e-6;
  p.inter_node_latency = 25e-6;
  return p;
}

// This machine: the median of five timed float32 products of 512 x 512
// matrices on one thread (a core's peak; the ranks share the cores), its
// physical memory, and loopback links. A first figure, not a calibration.
DeviceProfile this_cpu() {
  DeviceProfile p;
  p.name = "cpu";
  const internal::OneThread one_thread;
  p.cores = std::max<int64_t>(1, static_cast<int64_t>(sysconf(_SC_NPROCESSORS_ONLN)));
  auto a = torch::randn({512, 512}), b = torch::randn({512, 512});
  std::vector<double> seconds;
  for (int i = 0; i < 6; ++i) {
    const auto start = std::chrono::steady_clock::now();
    auto c = torch::mm(a, b);
    seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  seconds.erase(seconds.begin());  // the first warms the threads up
  std::sort(seconds.begin(), seconds.end());
  p.peak_flops_fp32 = 2.0 * 512 * 512 * 512 / std::max(seconds[seconds.size() / 2], 1e-9);
  p.peak_flops_bf16 = p.peak_flops_fp32;
  p.memory_bytes = static_cast<double>(sysconf(_SC_PHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGE_SIZE));
  p.intra_node_bandwidth = p.inter_node_bandwidth = 2e9;
  p.intra_node_latency = p.inter_node_latency = 50e-6;
  p.efficiency = 0.5;
  p.memory_per_node = true;
  return p;
}

// A field's value, from `least` to `most` (the figures stay finite).
double field(const nlohmann::json& j, const std::string& key, const std::string& file, double scale, double least,
             double most) {
  TANDEM_CHECK_USAGE(j.contains(key), "--device ", file, ": the profile has no \"", key, "\" (every field is "
                     "required: see tandem plan --help)");
  const auto& v = j.at(key);
  TANDEM_CHECK_USAGE(v.is_number(), "--device ", file, ": \"", key, "\" must be a number, got ", v.dump());
  const double x = v.get<double>();
  TANDEM_CHECK_USAGE(x > 0 && x >= least && x <= most, "--device ", file, ": \"", key, "\" must be positive, from ",
                     least, " to ", most, ", got ", v.dump());
  return x * scale;
}

// "norm_seconds": [[elements, RMSNorm's seconds, LayerNorm's seconds], ...],
// the elements positive and increasing, the seconds from 0 to 1e6.
std::vector<DeviceProfile::NormTiming> norm_timings(const nlohmann::json& v, const std::string& file) {
  const std::string expected = "a list of [elements, seconds with RMSNorm, seconds with LayerNorm], the elements "
                               "increasing, the seconds from 0 to 1e6";
  TANDEM_CHECK_USAGE(v.is_array() && v.size() <= 1024, "--device ", file, ": \"norm_seconds\" must be ", expected,
                     ", got ", v.dump().substr(0, 200));
  std::vector<DeviceProfile::NormTiming> out;
  for (const auto& row : v) {
    const bool three = row.is_array() && row.size() == 3 &&
                       std::all_of(row.begin(), row.end(), [](const nlohmann::json& x) { return x.is_number(); });
    TANDEM_CHECK_USAGE(three, "--device ", file, ": \"norm_seconds\" must be ", expected, ", got the entry ",
                       row.dump().substr(0, 200));
    DeviceProfile::NormTiming t{row[0].get<double>(), row[1].get<double>(), row[2].get<double>()};
    const bool fine = t.elements >= 1 && t.elements <= 1e15 && (out.empty() || t.elements > out.back().elements) &&
                      t.rms >= 0 && t.rms <= 1e6 && t.layer >= 0 && t.layer <= 1e6;
    TANDEM_CHECK_USAGE(fine, "--device ", file, ": \"norm_seconds\" must be ", expected, ", got the entry ",
                       row.dump());
    out.push_back(t);
  }
  return out;
}

DeviceProfile from_file(const std::string& file) {
  nlohmann::json j;
  std::error_code ec;
  const auto size = std::filesystem::file_size(file, ec);
  TANDEM_CHECK_USAGE(!ec && size <= (1 << 20), "--device ", file, ": a profile is a JSON file of at most 1 MiB",
                     ec ? "" : " (this one has " + std::to_string(size) + " bytes)");
  try {
    std::ifstream in(file);
    TANDEM_CHECK_USAGE(in.good() && in.peek() != std::ifstream::traits_type::eof(), "--device ", file,
                       in.good() ? ": the file is empty" : ": cannot read it (permissions?)");
    // A field given twice is refused (the parser would keep the last).
    std::vector<std::string> keys;
    std::string twice;
    j = nlohmann::json::parse(in, [&](int depth, nlohmann::json::parse_event_t event, nlohmann::json& parsed) {
      if (event == nlohmann::json::parse_event_t::key && depth == 1) {
        const auto key = parsed.get<std::string>();
        if (std::find(keys.begin(), keys.end(), key) != keys.end() && twice.empty()) twice = key;
        keys.push_back(key);
      }
      return true;
    });
    TANDEM_CHECK_USAGE(twice.empty(), "--device ", file, ": the field \"", twice, "\" is given twice");
  } catch (const nlohmann::json::exception& e) {
    throw UsageError("--device " + file + ": not a JSON profile (" + e.what() + ")");
  } catch (const std::ios_base::failure& e) {
    throw UsageError("--device " + file + ": cannot read it (" + e.what() + ")");
  }
  TANDEM_CHECK_USAGE(j.is_object(), "--device ", file, ": expected a JSON object of the profile's fields");
  static const std::vector<std::string> known = {"name", "peak_tflops_bf16", "peak_tflops_fp32", "memory_gib",
                                                 "intra_node_gb_per_s", "inter_node_gb_per_s",
                                                 "intra_node_latency_us", "inter_node_latency_us", "efficiency",
                                                 "layer_overhead_us", "call_overhead_us", "norm_seconds", "cores"};
  for (const auto& [key, value] : j.items()) {
    TANDEM_CHECK_USAGE(std::find(known.begin(), known.end(), key) != known.end(), "--device ", file,
                       ": unknown field \"", key, "\" (known: name, peak_tflops_bf16, peak_tflops_fp32, memory_gib, "
                       "intra_node_gb_per_s, inter_node_gb_per_s, intra_node_latency_us, inter_node_latency_us, "
                       "efficiency; optional: layer_overhead_us, call_overhead_us, norm_seconds, cores)");
  }
  DeviceProfile p;
  TANDEM_CHECK_USAGE(!j.contains("name") || j["name"].is_string(), "--device ", file,
                     ": \"name\" must be a string, got ", j.contains("name") ? j["name"].dump() : "");
  p.name = j.contains("name") ? j["name"].get<std::string>() : std::filesystem::path(file).stem().string();
  TANDEM_CHECK_USAGE(!p.name.empty() && std::all_of(p.name.begin(), p.name.end(),
                                                    [](char c) { return c >= 0x20 && c != 0x7f; }),
                     "--device ", file, ": \"name\" must be a printable name of one line");
  p.peak_flops_bf16 = field(j, "peak_tflops_bf16", file, 1e12, 1e-6, 1e6);
  p.peak_flops_fp32 = field(j, "peak_tflops_fp32", file, 1e12, 1e-6, 1e6);
  p.memory_bytes = field(j, "memory_gib", file, kGiB, 1e-6, 1e9);
  p.intra_node_bandwidth = field(j, "intra_node_gb_per_s", file, 1e9, 1e-6, 1e6);
  p.inter_node_bandwidth = field(j, "inter_node_gb_per_s", file, 1e9, 1e-6, 1e6);
  p.intra_node_latency = field(j, "intra_node_latency_us", file, 1e-6, 1e-3, 1e9);
  p.inter_node_latency = field(j, "inter_node_latency_us", file, 1e-6, 1e-3, 1e9);
  p.efficiency = field(j, "efficiency", file, 1.0, 1e-6, 1.0);
  // Optional microseconds, 0 when absent.
  auto optional_us = [&](const char* key) {
    if (!j.contains(key)) return 0.0;
    const auto& v = j[key];
    TANDEM_CHECK_USAGE(v.is_number() && v.get<double>() >= 0 && v.get<double>() <= 1e9, "--device ", file, ": \"",
                       key, "\" must be a number from 0 to 1e9, got ", v.dump());
    return v.get<double>() * 1e-6;
  };
  p.layer_overhead = optional_us("layer_overhead_us");
  p.call_overhead = optional_us("call_overhead_us");
  if (j.contains("norm_seconds")) p.norm_timings = norm_timings(j["norm_seconds"], file);
  if (j.contains("cores")) {
    const auto& v = j["cores"];
    const bool whole = v.is_number() && v.get<double>() >= 1 && v.get<double>() <= double(1 << 20) &&
                       v.get<double>() == std::floor(v.get<double>());
    TANDEM_CHECK_USAGE(whole, "--device ", file, ": \"cores\" must be a whole number from 1 to 2^20, got ", v.dump());
    p.cores = static_cast<int64_t>(v.get<double>());
    p.memory_per_node = true;
  }
  return p;
}

}  // namespace

double DeviceProfile::norm_seconds(bool rms, double elements) const {
  const auto& t = norm_timings;
  if (t.empty()) return 0;
  auto at = [&](size_t i) { return rms ? t[i].rms : t[i].layer; };
  if (elements <= t[0].elements) return at(0);  // below the sizes measured: the first's
  if (t.size() == 1) return at(0) * elements / t[0].elements;
  // The segment that holds `elements`, or the last, extrapolated.
  size_t i = 1;
  while (i + 1 < t.size() && t[i].elements < elements) ++i;
  const double x0 = t[i - 1].elements, x1 = t[i].elements;
  return std::max(0.0, at(i - 1) + (at(i) - at(i - 1)) * (elements - x0) / (x1 - x0));
}

std::vector<std::string> device_profile_names() { return {"h100", "h200", "a100", "cpu"}; }

DeviceProfile device_profile(const std::string& name_or_file) {
  // H100 SXM: 989 dense bf16 TFLOP/s, 67 fp32, 80 GiB, NVLink 4 450 GB/s a
  // direction, a 400 Gb/s NDR adapter a GPU. H200: the same chip, 141 GB.
  // A100 SXM 80GB: 312 and 19.5, NVLink 3 300 GB/s, 200 Gb/s HDR.
  if (name_or_file == "h100") return gpu("h100", 989, 67, 80 * kGiB, 450, 50);
  if (name_or_file == "h200") return gpu("h200", 989, 67, 141e9, 450, 50);
  if (name_or_file == "a100") return gpu("a100", 312, 19.5, 80 * kGiB, 300, 25);
  if (name_or_file == "cpu") return this_cpu();
  std::error_code ec;
  const auto status = std::filesystem::status(name_or_file, ec);
  TANDEM_CHECK_USAGE(std::filesystem::exists(status), "--device ", name_or_file,
                     ": unknown device (presets: h100, h200, a100, cpu; or the path of a JSON profile, and no file "
                     "has this name)");
  TANDEM_CHECK_USAGE(std::filesystem::is_regular_file(status), "--device ", name_or_file,
                     ": not a regular file (a JSON profile is expected)");
  return from_file(name_or_file);
}

}  // namespace tandem::plan
