// tandem/models/registry.h: model names -> factories, for the CLI.
//
// Built in: the image classifiers convnet, mlp, resnet18, resnet34,
// resnet50, mobilenetv2, and the language models gpt2-tiny, gpt2,
// gpt2-medium, gpt2-large, gpt2-xl, llama-tiny, llama-3.2-1b, mixtral-tiny,
// mixtral-8x7b, qwen3-moe-tiny, qwen3-30b-a3b
// (models/language_models.cpp). Users add their own with register_model()
// before parsing flags.
#pragma once

#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include "tandem/models/options.h"
#include "tandem/models/sequence.h"

namespace tandem::models {

using ModelFactory = std::function<Sequence(const ModelOptions&)>;

// What a model is trained on and for: images to classes ([N, C, H, W] float
// -> [N, classes]) or tokens to next tokens ([B, T] int64 -> [B, T, vocab]).
enum class ModelKind { kImageClassifier, kLanguageModel };

// What the trainer needs to know of a model before it builds one.
struct ModelTraits {
  ModelKind kind = ModelKind::kImageClassifier;
  // Language models: the longest sequence the model takes (its positions).
  int64_t context_length = 0;
  // Language models: the floating-point operations of one token's forward
  // and backward at options.seq_len, for MFU: 6 per weight that multiplies
  // (the embedding lookups do not) plus 12 * layers * width * seq_len for
  // attention's two products (PaLM's appendix B, as nanoGPT counts).
  std::function<double(const ModelOptions&)> flops_per_token;
  // Language models: the top-level layers' names, known without building
  // the model (flags that name layers are checked before the data are read).
  std::vector<std::string> layer_names;
  // The output layer reads the token embedding's tensor (Note [tied
  // embedding] in models/gpt2.h), so that the strategies that would keep
  // the two apart are refused before any worker starts.
  bool tied_embedding = false;
  // Language models: the sizes tensor parallelism's ranks must divide,
  // each with what it counts ("heads", "key/value heads"), so that a tp the
  // model cannot take is refused before any worker starts.
  std::vector<std::pair<std::string, int64_t>> tensor_parallel_divisors;
  // Language models: the experts of each mixture-of-experts layer (0:
  // none), so that an ep the model cannot take is refused before any
  // worker starts.
  int64_t experts = 0;
  // Language models: the parameters the model has at options.vocab_size,
  // counted from its shape without building it (so that a model too large
  // for the machine is refused before it is allocated).
  std::function<int64_t(const ModelOptions&)> parameter_count;
};

// Throws tandem::Error if the name is taken.
void register_model(const std::string& name, ModelFactory factory, ModelTraits traits = {});

// Note [model resolvers]: names that stand for a file rather than a
// preset ("hf:DIR", a model built from DIR/config.json) are registered
// when first asked for: model_traits, make_model and the configs' preset()
// hand a name they do not know to the resolver of its prefix, which
// registers it (add_llama_model, add_gpt2_model) or throws naming what is
// wrong. Every process resolves the name itself (a launched worker reads
// the same flags), each at most once; thread ranks share the result.
using ModelResolver = std::function<void(const std::string& name)>;
void add_model_resolver(const std::string& prefix, ModelResolver resolver);
// Resolves `name` if a resolver's prefix starts it and it is not yet
// resolved; false when no resolver takes it.
bool resolve_model_name(const std::string& name);

// The name as weights record it and compare it: "hf:DIR" with DIR made
// absolute (a run started elsewhere names the same folder); others as
// they are.
std::string canonical_model_name(const std::string& name);

// A GPT-2 or LLaMA-family model of `config` under `name`, with the traits
// of its shape; its vocabulary is the config's where fixed_vocabulary.
struct Gpt2Config;
struct LlamaConfig;
void add_gpt2_model(const std::string& name, const Gpt2Config& config);
void add_llama_model(const std::string& name, const LlamaConfig& config);

// Throws tandem::Error naming the known models when `name` is unknown.
ModelTraits model_traits(const std::string& name);
bool is_language_model(const std::string& name);

// Throws tandem::Error naming the known models when `name` is unknown.
Sequence make_model(const std::string& name, const ModelOptions& options);

// Note [seeded model]: a model's initial weights are drawn from the
// process's default generator after torch::manual_seed(seed), so that
// every rank draws the same ones. Ranks that are threads of one process
// (engine's Note [a job the program made]) share that generator: the seed
// and the draws of make_seeded_model are one critical section, and any
// other draw from the generator while ranks may be building theirs (a
// clone's reset, a layer's dropout) holds it too, or rank r's weights
// would depend on when rank s drew.
std::unique_lock<std::mutex> hold_default_generator();

// make_model under hold_default_generator(), right after seeding it.
Sequence make_seeded_model(const std::string& name, const ModelOptions& options, uint64_t seed);

// Sorted.
std::vector<std::string> model_names();

// Number of scalar parameters (not buffers).
int64_t count_parameters(const torch::nn::Module& module);

// The dtype of the first parameter (float32 when there is none): what the
// module's inputs are given in (--dtype).
torch::ScalarType parameter_dtype(const torch::nn::Module& module);

// --channels-last: every 4-D parameter to NHWC memory order, in place
// (set_data keeps the parameters' identity for optimizers and DDP).
// Returns how many there were.
int64_t to_channels_last(torch::nn::Module& module);

}  // namespace tandem::models
