// tandem/plan/device_profile.h: what the planner knows of a device and its
// links (tandem plan --device).
//
// Presets from the vendors' data sheets (dense tensor-core peaks, no
// sparsity; one direction of a GPU's NVLink and of its network adapter),
// `cpu` measured on this machine, or a JSON file of the same fields:
//
//   {"name": "my-gpu", "peak_tflops_bf16": 989, "peak_tflops_fp32": 67, "memory_gib": 80,
//    "intra_node_gb_per_s": 450, "inter_node_gb_per_s": 50, "intra_node_latency_us": 10,
//    "inter_node_latency_us": 25, "efficiency": 0.45}
//
// Those fields are required and must be positive (efficiency at most 1).
// The rest are optional: "layer_overhead_us" (default 0), what a layer's
// forward and backward of one micro-batch cost besides their FLOPs;
// "norm_seconds" (default none), what a layer's two norms and residual
// adds cost, forward and backward, on an activation of so many elements,
// which tensor parallelism does not divide: [[elements, seconds with
// RMSNorm, seconds with LayerNorm], ...], elements increasing; and "cores" (a
// CPU: the peaks are one core's, shared by the node's ranks, and the
// memory the node's). tandem plan --calibrate FILE writes them all
// (calibrate.h). A field the planner does not know is refused, naming it.
#pragma once

#include <string>
#include <vector>

namespace tandem::plan {

struct DeviceProfile {
  std::string name;
  double peak_flops_bf16 = 0;  // FLOP/s, dense
  double peak_flops_fp32 = 0;  // FLOP/s (float64 is planned at half of it)
  double memory_bytes = 0;
  double intra_node_bandwidth = 0;  // bytes/s a rank sends to the others of its node
  double inter_node_bandwidth = 0;  // bytes/s a rank sends over the network
  double intra_node_latency = 0;    // seconds a collective call costs besides its bytes
  double inter_node_latency = 0;
  // Seconds a call made between computations costs besides its ring steps
  // and bytes (Note [links timed between products] in calibrate.cpp);
  // measured on CPUs, 0 for the GPUs' presets.
  double call_overhead = 0;
  // The share of the peak a training step's matrix products reach (the
  // ceiling of its model FLOPs utilisation), a profile value: 0.45 for the
  // GPUs (torchtitan's and Megatron-LM's published runs reach 0.40-0.55).
  double efficiency = 0.45;
  // Seconds a layer's forward and backward of one micro-batch take besides
  // their FLOPs (Note [calibrated profile] in calibrate.h); 0 for the GPUs,
  // whose kernels are queued ahead of the device.
  double layer_overhead = 0;
  // Seconds a layer's two norms and two residual adds take, forward and
  // backward, on an activation of `elements` (tokens x hidden), with
  // RMSNorm and with LayerNorm (Note [replicated element-wise work] in
  // src/plan/norm_timing.h), measured at a few sizes; none for the GPUs
  // (memory-bound work, a few percent of a large model's step).
  struct NormTiming {
    double elements = 0, rms = 0, layer = 0;
  };
  std::vector<NormTiming> norm_timings;  // by increasing elements
  // Interpolated between the sizes measured, the first's below them, the
  // last two's slope above; 0 when none was measured.
  double norm_seconds(bool rms, double elements) const;
  // cpu: the memory is the node's, shared by its ranks, and the peaks one
  // core's, of `cores`, which the ranks share (peak_for).
  bool memory_per_node = false;
  int64_t cores = 0;
  // A rank's peak when `ranks` share a node (FLOP/s, at `fp32` or bf16).
  double peak_for(bool fp32, int64_t ranks) const {
    const double peak = fp32 ? peak_flops_fp32 : peak_flops_bf16;
    return cores > 0 ? peak * double(cores) / double(ranks > 0 ? ranks : 1) : peak;
  }
};

// "h100", "h200", "a100", "cpu" (this machine: its memory and a measured
// matrix product; its links those of loopback Gloo), or the path of a JSON
// profile. Throws tandem::UsageError naming --device and what was expected.
DeviceProfile device_profile(const std::string& name_or_file);
std::vector<std::string> device_profile_names();

}  // namespace tandem::plan
