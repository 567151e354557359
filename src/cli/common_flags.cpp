#include "common_flags.h"

#include <string>

#include "tandem/data/augment.h"
#include "tandem/data/source.h"
#include "tandem/models/registry.h"

namespace tandem::cli {

void add_data_flags(FlagSet& flags, engine::TrainOptions& o) {
  std::string specs;
  std::string augments;
  for (const auto& name : data::augment_names()) augments += (augments.empty() ? "" : ", ") + name;
  for (const auto& line : data::data_spec_help()) specs += "\n        " + line;

  flags.section("data");
  flags.add_string("data", "SPEC", &o.data,
                   "the data set (training takes its training split, evaluation its test "
                   "split):" + specs + "\n      ");
  flags.add_string("val-data", "SPEC", &o.val_data,
                   "evaluation data (its test split, or a whole imagefolder); default: the "
                   "test split of --data");
  flags.add_int("workers", "N", &o.workers,
                "loader threads decoding and augmenting batches ahead (0: none)", 0);
  flags.add_string("augment", "NAME", &o.augment,
                   "transform preset: " + augments + "; default: cifar for cifar data, "
                   "imagenet for imagefolder, none otherwise");
  flags.add_int("image-size", "N", &o.image_size,
                "train and evaluate on N x N images (0: 32 for cifar, 224 for imagefolder, "
                "native for idx)", 0);
  flags.add_switch("skip-bad-images", &o.skip_bad_images,
                   "leave unreadable images out of their batch (with a warning) instead of "
                   "stopping");
  flags.add_int("seq-len", "T", &o.seq_len,
                "token data: tokens a sample's inputs hold, each sample a window of T + 1 (0: the model's "
                "context, at most 1024)", 0);
  flags.add_int("vocab-size", "V", &o.vocab_size,
                "token data: the vocabulary, which nanoGPT's .bin files do not record (0: the files'; text is "
                "bytes, 256)", 0);
  flags.add_string("tokenizer", "FILE", &o.tokenizer,
                   "token data: a tokenizer.json (byte-level BPE) or SentencePiece .model; text:FILE is tokenized "
                   "with it as it is read (each file a document, after the tokenizer's end- or begin-of-text "
                   "token; for large corpora, tandem tokenize), tokens:PATH takes its vocabulary; recorded in "
                   "the weights for tandem sample and eval");
}

void add_model_flags(FlagSet& flags, engine::TrainOptions& o) {
  std::string models;
  for (const auto& name : models::model_names()) models += (models.empty() ? "" : ", ") + name;
  flags.section("model");
  flags.add_string("model", "NAME", &o.model,
                   "one of " + models + "; or hf:DIR, the model a transformers config.json in DIR describes (GPT-2, "
                   "LLaMA, Mistral, Qwen2, Qwen3, Mixtral, Qwen3-MoE; its weights with --init-weights DIR)");
  flags.add_double("width-mult", "X", &o.width_mult, "mobilenetv2 width multiplier", 1e-3, models::kMaxWidthMult);
  flags.add_choice("stem", &o.stem, {"auto", "imagenet", "cifar"},
                   "resnet stem; auto picks cifar for images up to 64 px");
  flags.add_enum("dtype", &o.dtype, engine::dtype_names(),
                   "parameter and compute precision (float64 for exact comparisons)");
  flags.add_switch("channels-last", &o.channels_last,
                   "keep 4-D weights and inputs in NHWC memory order (channels last: faster "
                   "convolutions with cuDNN and tensor cores)");
  flags.add_switch("cudnn-benchmark", &o.cudnn_benchmark,
                   "let cuDNN time the convolution algorithms for each input shape and keep "
                   "the fastest (CUDA only)");
  flags.add_enum("amp", &o.amp, engine::amp_names(),
                   "mixed precision: autocast the forward pass to bf16 or fp16 (fp16 with "
                   "dynamic loss scaling); parameters stay float32");
}

}  // namespace tandem::cli
