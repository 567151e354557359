// The checks of TrainOptions that concern the model's kind and the
// optimizer (train_options_checks.h): a language model's token data and
// flags, an image model's, and each optimizer's own flags.
#include <algorithm>
#include <cmath>
#include <string>
#include <utility>

#include "tandem/data/source.h"
#include "tandem/models/gpt2.h"
#include "tandem/models/registry.h"
#include "tandem/util/check.h"
#include "train_options_checks.h"
#include "trainer_internal.h"

namespace tandem::engine {

Optimizer resolved_optimizer(const TrainOptions& o) {
  if (o.optimizer != Optimizer::kAuto) return o.optimizer;
  return models::is_language_model(o.model) ? Optimizer::kAdamW : Optimizer::kSgd;
}

optim::OptimizerSettings internal::optimizer_settings(const TrainOptions& o) {
  if (resolved_optimizer(o) == Optimizer::kAdamW) {
    return optim::OptimizerSettings::of(
        torch::optim::AdamWOptions(o.lr).betas({o.beta1, o.beta2}).eps(o.adam_eps).weight_decay(o.weight_decay));
  }
  return optim::OptimizerSettings::of(
      torch::optim::SGDOptions(o.lr).momentum(o.momentum).nesterov(o.nesterov).weight_decay(o.weight_decay));
}

int64_t resolved_seq_len(const TrainOptions& o) {
  const auto traits = models::model_traits(o.model);
  if (traits.kind != models::ModelKind::kLanguageModel) return 0;
  return o.seq_len > 0 ? o.seq_len : std::min<int64_t>(traits.context_length, 1024);
}

namespace internal {

// A language model trains on token data and an image model on images;
// each kind's own flags go with it alone.
void check_model_and_data(const TrainOptions& o) {
  const bool language = models::is_language_model(o.model);
  for (const auto& [flag, spec] : {std::pair<const char*, std::string>{"--data", o.data}, {"--val-data", o.val_data}}) {
    if (spec.empty()) continue;
    const bool tokens = data::is_token_spec(spec);
    TANDEM_CHECK_USAGE(tokens == language, flag, " ", spec, ": ", tokens ? "token data" : "image data", ", but --model ",
                       o.model, language ? " is a language model (it trains on text:FILE or tokens:PATH)"
                                         : " is an image classifier (it trains on images; the language models are "
                                           "gpt2-tiny, gpt2, ..., llama-tiny, llama-3.2-1b)");
  }
  if (language) {
    TANDEM_CHECK_USAGE(o.augment.empty() && o.image_size == 0 && !o.skip_bad_images && !o.channels_last &&
                           !o.cudnn_benchmark && !o.sync_bn,
                       "--augment, --image-size, --skip-bad-images, --channels-last, --cudnn-benchmark and "
                       "--sync-bn are for image models; --model ", o.model, " is a language model");
  } else {
    TANDEM_CHECK_USAGE(o.seq_len == 0 && o.vocab_size == 0 && o.tokenizer.empty(), "--seq-len, --vocab-size and "
                       "--tokenizer are for language models "
                       "on token data; --model ", o.model, " is an image classifier");
    TANDEM_CHECK_USAGE(o.export_hf.empty(), "--export-hf writes a language model in transformers' form; --model ",
                       o.model, " is an image classifier (--export-weights writes its weights)");
  }
  TANDEM_CHECK_USAGE(o.export_hf.find("{rank}") == std::string::npos, "--export-hf ", o.export_hf,
                     ": one folder for the job (rank 0 writes it)");
  TANDEM_CHECK_USAGE(o.seq_len >= 0, "--seq-len: expected a positive number of tokens (0: the model's context), got ",
                     o.seq_len);
  // 2^24: past every tokenizer's (LLaMA 3: 128,256); a larger one only
  // made an embedding libtorch could not allocate, blamed on the batch.
  TANDEM_CHECK_USAGE(o.vocab_size >= 0 && o.vocab_size <= (int64_t{1} << 24),
                     "--vocab-size: expected a size from 1 to 16777216 (0: the data's), got ", o.vocab_size);
  TANDEM_CHECK_USAGE(o.dropout >= 0 && o.dropout < 1, "--dropout: expected a probability from 0 up to, not "
                     "including, 1, got ", o.dropout);
  const auto gpt2 = models::Gpt2Config::preset_names();
  TANDEM_CHECK_USAGE(o.dropout == 0 || std::find(gpt2.begin(), gpt2.end(), o.model) != gpt2.end(),
                     "--dropout is GPT-2's (its embeddings, attention and residuals); --model ", o.model,
                     " has no dropout to set");
  if (language) {
    const auto context = models::model_traits(o.model).context_length;
    TANDEM_CHECK_USAGE(o.seq_len <= context, "--seq-len ", o.seq_len, ": ", o.model, " takes sequences of at most ",
                       context, " tokens");
  }
}

void check_optimizer(const TrainOptions& o) {
  const TrainOptions defaults;
  const bool adamw = resolved_optimizer(o) == Optimizer::kAdamW;
  if (adamw) {
    TANDEM_CHECK_USAGE(!o.nesterov, "--nesterov is SGD's; the optimizer is adamw");
    TANDEM_CHECK_USAGE(o.beta1 >= 0 && o.beta1 < 1, "--beta1: expected [0, 1), got ", o.beta1);
    TANDEM_CHECK_USAGE(o.beta2 >= 0 && o.beta2 < 1, "--beta2: expected [0, 1), got ", o.beta2);
    TANDEM_CHECK_USAGE(o.adam_eps > 0 && std::isfinite(o.adam_eps), "--adam-eps: expected a positive number, got ",
                       o.adam_eps);
    TANDEM_CHECK_USAGE(!o.cuda_graph, "--cuda-graph captures SGD's step only; it does not work with --optimizer adamw");
  } else {
    TANDEM_CHECK_USAGE(o.beta1 == defaults.beta1 && o.beta2 == defaults.beta2 && o.adam_eps == defaults.adam_eps,
                       "--beta1, --beta2 and --adam-eps are AdamW's; the optimizer is sgd (--optimizer adamw)");
  }
  // A device's peak is between a slow CPU's (a GFLOPS) and the largest
  // accelerator's (thousands of TFLOPS); outside that it is a typo, and the
  // MFU it gives would mean nothing.
  TANDEM_CHECK_USAGE(o.peak_tflops == 0 || (o.peak_tflops >= 1e-3 && o.peak_tflops <= 1e5),
                     "--peak-tflops: expected a device's peak TFLOPS from 0.001 to 100000 (0: the device's known "
                     "peak), got ", o.peak_tflops);
}

}  // namespace internal
}  // namespace tandem::engine
