// models::llama against Hugging Face transformers' LlamaForCausalLM (random
// small configs, nothing downloaded): an untied head with grouped-query
// attention, and a tied one with Llama 3's rotary scaling. tandem's weights
// load into it by name; logits, loss and every gradient agree to 1e-10 in
// float64 and 1e-5 in float32. transformers' RMSNorm rounds float64 inputs
// to float32; the reference runs it in the input's precision when that is
// wider, as tandem's does (Note [rotary positions in float32]): the one
// change made to it (tests/testing/transformers_peer.py).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "tandem/checkpoint/safetensors.h"
#include "tandem/models/llama.h"
#include "tandem/models/registry.h"
#include "testing.h"

namespace tandem::models {
namespace llama_test {  // the file's own names (a layer's tests compile as one unit)

using testing::TempDir;

LlamaConfig small_config(bool tied_and_scaled) {
  LlamaConfig c;
  c.vocab_size = 67;
  c.hidden_size = 32;
  c.intermediate_size = 40;
  c.num_layers = 2;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.max_positions = 32;
  c.rms_norm_eps = 1e-5;
  if (tied_and_scaled) {
    c.tie_embeddings = true;
    c.rope_theta = 500000;
    c.rope_factor = 8;
    c.rope_original_max_positions = 16;  // short, so that every band is met
  }
  return c;
}

const char* kReference = R"(
import json, sys, torch, torch.nn.functional as F
from safetensors.torch import load_file, save_file
sys.path.insert(0, sys.argv.pop(1))  # tests/testing
import transformers_peer
transformers_peer.keep_float64_rms_norm()
from transformers import LlamaConfig, LlamaForCausalLM

c = json.loads(sys.argv[1])
inputs, out = load_file(sys.argv[2]), sys.argv[3]
tokens, targets = inputs.pop("tokens"), inputs.pop("targets")
dtype = inputs["model.embed_tokens.weight"].dtype
rope = {"rope_type": "default", "rope_theta": c["rope_theta"]}
if c["rope_factor"]:
    rope = {"rope_type": "llama3", "rope_theta": c["rope_theta"], "factor": c["rope_factor"],
            "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": c["original"]}
config = LlamaConfig(vocab_size=c["vocab"], hidden_size=c["hidden"], intermediate_size=c["intermediate"],
                     num_hidden_layers=c["layers"], num_attention_heads=c["heads"], num_key_value_heads=c["kv"],
                     max_position_embeddings=c["positions"], rms_norm_eps=1e-5, rope_parameters=rope,
                     tie_word_embeddings=c["tied"], attention_bias=False, mlp_bias=False)
model = LlamaForCausalLM(config).to(dtype)
missing, unexpected = model.load_state_dict(inputs, strict=False)
assert missing == (["lm_head.weight"] if c["tied"] else []) and not unexpected, (missing, unexpected)
assert (model.lm_head.weight is model.model.embed_tokens.weight) == c["tied"]
model.eval()
logits = model(input_ids=tokens).logits
loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))
loss.backward()
result = {"logits": logits.detach().contiguous(), "loss": loss.detach().reshape(1)}
for name, p in model.named_parameters():
    result["grad." + name] = p.grad.contiguous()
save_file(result, out)
)";

struct Compared {
  double logits = 1, loss = 1, grads = 1;  // the largest absolute differences
  int64_t grads_compared = 0;
};

Compared compare_with_transformers(const LlamaConfig& config, torch::ScalarType dtype) {
  torch::manual_seed(11);
  auto model = llama(config);
  model->to(dtype);
  auto tokens = torch::randint(0, config.vocab_size, {2, 24}, torch::kInt64);
  auto targets = torch::randint(0, config.vocab_size, {2, 24}, torch::kInt64);
  TempDir dir;
  checkpoint::NamedTensors saved = {{"tokens", tokens}, {"targets", targets}};
  for (const auto& p : model->named_parameters()) saved.emplace_back(llama_hf_name(p.key()), p.value().detach());
  checkpoint::write_safetensors(dir.file("in.safetensors"), saved);
  const nlohmann::json c = {{"vocab", config.vocab_size},       {"hidden", config.hidden_size},
                            {"intermediate", config.intermediate_size}, {"layers", config.num_layers},
                            {"heads", config.num_heads},        {"kv", config.num_kv_heads},
                            {"positions", config.max_positions}, {"rope_theta", config.rope_theta},
                            {"rope_factor", config.rope_factor}, {"original", config.rope_original_max_positions},
                            {"tied", config.tie_embeddings}};
  std::ofstream(dir.file("reference.py")) << kReference;
  auto r = testing::run(std::string(TANDEM_PYTHON) + " " + dir.file("reference.py") + " " TANDEM_SOURCE_DIR
                        "/tests/testing '" + c.dump() + "' " +
                        dir.file("in.safetensors") + " " + dir.file("out.safetensors"));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  if (r.exit_code != 0) return {};
  std::map<std::string, torch::Tensor> theirs;
  for (auto& [name, t] : checkpoint::read_safetensors(dir.file("out.safetensors")).tensors) theirs[name] = t;
  auto logits = model->forward(tokens);
  auto loss = torch::nn::functional::cross_entropy(logits.reshape({-1, config.vocab_size}), targets.reshape({-1}));
  loss.backward();
  Compared out;
  out.logits = (logits - theirs.at("logits")).abs().max().item<double>();
  out.loss = std::abs(loss.item<double>() - theirs.at("loss").item<double>());
  out.grads = 0;
  for (const auto& p : model->named_parameters()) {
    const auto& want = theirs.at("grad." + llama_hf_name(p.key()));
    EXPECT_EQ(p.value().grad().sizes(), want.sizes()) << p.key();
    out.grads = std::max(out.grads, (p.value().grad() - want).abs().max().item<double>());
    ++out.grads_compared;
  }
  return out;
}

class LlamaTest : public ::testing::TestWithParam<bool> {};

TEST_P(LlamaTest, LogitsLossAndGradientsAreTransformers) {
  const auto config = small_config(GetParam());
  auto c = compare_with_transformers(config, torch::kFloat64);
  EXPECT_EQ(c.grads_compared, 1 + 2 * 9 + 1 + (GetParam() ? 0 : 1));
  EXPECT_LE(c.logits, 1e-10);
  EXPECT_LE(c.loss, 1e-10);
  EXPECT_LE(c.grads, 1e-10);
  std::printf("float64: logits %.2e, loss %.2e, gradients %.2e\n", c.logits, c.loss, c.grads);
  c = compare_with_transformers(config, torch::kFloat32);
  EXPECT_LE(c.logits, 1e-5);
  EXPECT_LE(c.loss, 1e-5);
  EXPECT_LE(c.grads, 1e-5);
  std::printf("float32: logits %.2e, loss %.2e, gradients %.2e\n", c.logits, c.loss, c.grads);
}

INSTANTIATE_TEST_SUITE_P(Heads, LlamaTest, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "TiedWithLlama3Rope" : "UntiedGqa"; });

// The control: the rotary scaling left out (the plain frequencies) changes
// the logits far past the bound, so the scaled case checks the scaling.
TEST(LlamaControlTest, WithoutTheRotaryScalingTheLogitsDiffer) {
  auto config = small_config(true);
  auto unscaled = config;
  unscaled.rope_factor = 0;
  torch::manual_seed(3);
  auto a = llama(config);
  torch::manual_seed(3);
  auto b = llama(unscaled);
  a->to(torch::kFloat64);
  b->to(torch::kFloat64);
  auto tokens = torch::randint(0, config.vocab_size, {1, 24}, torch::kInt64);
  EXPECT_GT((a->forward(tokens) - b->forward(tokens)).abs().max().item<double>(), 1e-4);
}

TEST(LlamaControlTest, PresetsHaveTheirParameterCounts) {
  // Llama 3.2 1B: 1,235,814,400 parameters, its embedding tied.
  auto one_b = LlamaConfig::preset("llama-3.2-1b");
  one_b.num_layers = 1;  // one layer, counted then scaled: the whole model is 5 GB
  const int64_t embedding = one_b.vocab_size * one_b.hidden_size;
  const int64_t with_one = count_parameters(*llama(one_b));
  const int64_t per_layer = with_one - embedding - one_b.hidden_size;
  EXPECT_EQ(embedding + 16 * per_layer + one_b.hidden_size, 1235814400);
  EXPECT_THROW(LlamaConfig::preset("llama-70b"), std::exception);
  auto odd = small_config(false);
  odd.num_kv_heads = 3;
  EXPECT_THROW(llama(odd), std::exception);
}

}  // namespace llama_test
}  // namespace tandem::models
