// bench/lm_throughput: a language model's training step in tokens a
// second, the peer of bench/lm_throughput.py (nanoGPT's formulation of the
// same GPT-2 in PyTorch eager).
//
//   lm_throughput --model gpt2-tiny --vocab 256 --seq-len 256 --batch 16 --steps 10 --rounds 3
//   lm_throughput --model gpt2 --vocab 50304 --seq-len 1024 --batch 8 --device cuda --amp bf16
//
// The step: random tokens (fixed, on the device), forward, next-token
// cross-entropy, backward, AdamW (nanoGPT's decay groups: lr 6e-4, betas
// 0.9 and 0.95, weight decay 0.1; the fused kernel on CUDA), as `tandem
// train` runs it, with its malloc settings. One JSON line a round:
// tokens_per_second.
#include <cstdio>

#include <torch/torch.h>

#include "bench_main.h"
#include "tandem/util/cuda_module.h"
#include "tandem/engine/run_setup.h"
#include "tandem/models/registry.h"
#include "tandem/optim/adamw.h"
#include "tandem/optim/amp.h"
#include "tandem/util/allocator.h"
#include "tandem/util/stopwatch.h"

using namespace tandem;

int main(int argc, char** argv) {
  tune_malloc_for_training();  // as the tandem binary does (Note [malloc for training])
  tandem::cuda::load_when_present();  // Note [CUDA as a module]
  std::string model_name = "gpt2-tiny", device_text = "cpu", amp = "off";
  int64_t vocab = 256, seq_len = 256, batch = 16, steps = 10, warmup = 2, rounds = 3;
  cli::FlagSet flags("lm_throughput", "A language model's training step, in tokens a second.");
  flags.add_string("model", "NAME", &model_name, "a language model of the registry");
  flags.add_int("vocab", "V", &vocab, "vocabulary", 1);
  flags.add_int("seq-len", "T", &seq_len, "tokens a sample", 1);
  flags.add_int("batch", "B", &batch, "samples a step", 1);
  flags.add_int("steps", "N", &steps, "steps a timed round", 1);
  flags.add_int("warmup", "N", &warmup, "untimed steps first", 0);
  flags.add_int("rounds", "N", &rounds, "timed rounds (one line each)", 1);
  flags.add_string("device", "DEV", &device_text, "cpu or cuda");
  flags.add_choice("amp", &amp, {"off", "bf16"}, "autocast");
  return bench::run("lm_throughput", flags, argc, argv, [&] {
    const auto device = engine::parse_device(device_text);
    torch::manual_seed(0);
    models::ModelOptions o;
    o.vocab_size = vocab;
    o.seq_len = seq_len;
    auto model = models::make_model(model_name, o);
    // nanoGPT's count (6 per multiplying weight, attention's 12 L d T), for MFU.
    const auto traits = models::model_traits(model_name);
    const double flops_per_token = traits.flops_per_token ? traits.flops_per_token(o) : 0.0;
    model->to(device);
    model->train();
    const auto adamw_options = torch::optim::AdamWOptions(6e-4).betas({0.9, 0.95}).weight_decay(0.1);
    optim::AdamW adamw(optim::decay_groups(model->named_parameters(), adamw_options), adamw_options);
    const auto amp_dtype = optim::parse_amp(amp);
    auto tokens = torch::randint(vocab, {batch, seq_len + 1}, torch::kInt64).to(device);
    auto inputs = tokens.narrow(1, 0, seq_len).contiguous(), targets = tokens.narrow(1, 1, seq_len).contiguous();
    auto step = [&] {
      adamw.zero_grad();
      torch::Tensor loss;
      {
        optim::AutocastGuard autocast(device.type(), amp_dtype);
        auto logits = model->forward(inputs);
        loss = torch::nn::functional::cross_entropy(logits.reshape({-1, vocab}), targets.reshape(-1));
      }
      loss.backward();
      adamw.step();
      return loss;
    };
    for (int64_t i = 0; i < warmup; ++i) step();
    for (int64_t r = 0; r < rounds; ++r) {
      Stopwatch clock;
      torch::Tensor loss;
      for (int64_t i = 0; i < steps; ++i) loss = step();
      loss.item<float>();  // waits for the device
      const double seconds = clock.seconds();
      std::printf("{\"impl\": \"tandem\", \"model\": \"%s\", \"vocab\": %lld, \"seq_len\": %lld, \"batch\": %lld, "
                  "\"threads\": %d, \"amp\": \"%s\", \"tokens_per_second\": %.1f, \"flops_per_token\": %.6g}\n",
                  model_name.c_str(), static_cast<long long>(vocab), static_cast<long long>(seq_len),
                  static_cast<long long>(batch), at::get_num_threads(), amp.c_str(),
                  static_cast<double>(steps * batch * seq_len) / seconds, flops_per_token);
      std::fflush(stdout);
    }
  });
}
