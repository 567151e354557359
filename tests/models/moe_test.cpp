// Mixtral and Qwen3-MoE (models::llama with experts, models/moe.h) against
// Hugging Face transformers' MixtralForCausalLM and Qwen3MoeForCausalLM
// (random small configs, nothing downloaded). tandem writes the weights
// as save_pretrained does (one tensor per expert, transformers' names and
// config.json), transformers' from_pretrained reads them into its fused
// experts, and logits, loss and every gradient agree to 1e-10 in float64
// and 1e-5 in float32; the load-balancing loss to 1e-6 (transformers sums
// its terms in float32). The reference normalises
// and routes in float64 for a float64 model, as tandem does
// (tests/testing/transformers_peer.py).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <fstream>

#include "tandem/checkpoint/hf_format.h"
#include "tandem/checkpoint/safetensors.h"
#include "tandem/models/llama.h"
#include "tandem/models/moe.h"
#include "testing.h"

namespace tandem::models {
namespace moe_test {  // the file's own names (a layer's tests compile as one unit)

using testing::TempDir;

LlamaConfig small_config(LlamaFamily family) {
  LlamaConfig c;
  c.family = family;
  c.vocab_size = 67;
  c.hidden_size = 32;
  c.intermediate_size = 40;
  c.expert_intermediate_size = 24;
  c.num_layers = 2;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.max_positions = 32;
  c.rms_norm_eps = 1e-5;
  c.rope_theta = 1e6;
  c.num_experts = 4;
  c.experts_per_token = 2;
  if (family == LlamaFamily::kMixtral) {
    c.intermediate_size = c.expert_intermediate_size;  // Mixtral's one size
  } else {
    c.head_size = 12;  // heads x head size is not the width, as in Qwen3's own sizes
    c.qk_norm = true;
    c.num_experts = 6;
    c.experts_per_token = 3;
    c.normalize_top_k = false;
  }
  return c;
}

const char* kReference = R"(
import sys, torch, torch.nn.functional as F
from safetensors.torch import load_file, save_file
sys.path.insert(0, sys.argv.pop(1))  # tests/testing
import transformers_peer
transformers_peer.keep_float64_rms_norm()
transformers_peer.keep_float64_routing()
from transformers import AutoModelForCausalLM
from transformers.models.mixtral.modeling_mixtral import load_balancing_loss_func

folder, inputs, out = sys.argv[1], load_file(sys.argv[2]), sys.argv[3]
tokens, targets = inputs["tokens"], inputs["targets"]
model, info = AutoModelForCausalLM.from_pretrained(folder, output_loading_info=True, experts_implementation="eager")
assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
model.eval()
output = model(input_ids=tokens, output_router_logits=True)
logits = output.logits
loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))
loss.backward()
c = model.config
result = {"logits": logits.detach().contiguous(), "loss": loss.detach().reshape(1),
          "balance": output.aux_loss.detach().reshape(1).to(torch.float64)}
mixtral = c.model_type == "mixtral"
names = {"gate": "w1", "up": "w3", "down": "w2"} if mixtral else {k: k + "_proj" for k in ("gate", "up", "down")}
for name, p in model.named_parameters():
    g = p.grad
    if ".experts." not in name:  # the router keeps its saved name under Mixtral's block_sparse_moe
        result["grad." + (name.replace(".mlp.gate.", ".block_sparse_moe.gate.") if mixtral else name)] = g.contiguous()
        continue
    layer = name[:name.index(".mlp.")] + (".block_sparse_moe." if mixtral else ".mlp.")
    parts = {"gate": g.chunk(2, dim=1)[0], "up": g.chunk(2, dim=1)[1]} if name.endswith("gate_up_proj") else {"down": g}
    for which, t in parts.items():
        for e in range(t.size(0)):
            result["grad." + layer + "experts.%d.%s.weight" % (e, names[which])] = t[e].contiguous()
save_file(result, out)
)";

struct Compared {
  double logits = 1, loss = 1, grads = 1, balance = 1;  // the largest absolute differences
  int64_t grads_compared = 0;
};

Compared compare_with_transformers(const LlamaConfig& config, torch::ScalarType dtype) {
  torch::manual_seed(11);
  auto model = llama(config);
  model->to(dtype);
  auto tokens = torch::randint(0, config.vocab_size, {2, 24}, torch::kInt64);
  auto targets = torch::randint(0, config.vocab_size, {2, 24}, torch::kInt64);
  TempDir dir;
  checkpoint::write_hf_folder(dir.file("model"), model, config);
  checkpoint::write_safetensors(dir.file("in.safetensors"), {{"tokens", tokens}, {"targets", targets}});
  std::ofstream(dir.file("reference.py")) << kReference;
  auto r = testing::run(std::string(TANDEM_PYTHON) + " " + dir.file("reference.py") + " " TANDEM_SOURCE_DIR
                        "/tests/testing " + dir.file("model") + " " + dir.file("in.safetensors") + " " +
                        dir.file("out.safetensors"));
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
  out.balance = std::abs(load_balancing_loss(take_router_records(*model), config.num_experts) -
                         theirs.at("balance").item<double>());
  out.grads = 0;
  for (const auto& p : model->named_parameters()) {
    const auto names = llama_hf_names(p.key(), config);
    for (size_t i = 0; i < names.size(); ++i) {
      const auto& want = theirs.at("grad." + names[i]);
      const auto mine = names.size() == 1 ? p.value().grad() : p.value().grad()[static_cast<int64_t>(i)];
      EXPECT_EQ(mine.sizes(), want.sizes()) << names[i];
      out.grads = std::max(out.grads, (mine - want).abs().max().item<double>());
      ++out.grads_compared;
    }
  }
  return out;
}

class MoeTest : public ::testing::TestWithParam<LlamaFamily> {};

TEST_P(MoeTest, LogitsLossGradientsAndBalanceAreTransformers) {
  const auto config = small_config(GetParam());
  auto c = compare_with_transformers(config, torch::kFloat64);
  // Per layer: 4 attention projections (+2 q/k norms), 2 norms, the router, 3 per expert; then embed, norm, head.
  const int64_t layer = 4 + (config.qk_norm ? 2 : 0) + 2 + 1 + 3 * config.num_experts;
  EXPECT_EQ(c.grads_compared, config.num_layers * layer + 3);
  EXPECT_LE(c.logits, 1e-10);
  EXPECT_LE(c.loss, 1e-10);
  EXPECT_LE(c.grads, 1e-10);
  EXPECT_LE(c.balance, 1e-6);  // transformers sums the balancing loss's terms in float32
  std::printf("float64: logits %.2e, loss %.2e, gradients %.2e, balance %.2e\n", c.logits, c.loss, c.grads, c.balance);
  c = compare_with_transformers(config, torch::kFloat32);
  EXPECT_LE(c.logits, 1e-5);
  EXPECT_LE(c.loss, 1e-5);
  EXPECT_LE(c.grads, 1e-5);
  std::printf("float32: logits %.2e, loss %.2e, gradients %.2e\n", c.logits, c.loss, c.grads);
}

INSTANTIATE_TEST_SUITE_P(Families, MoeTest, ::testing::Values(LlamaFamily::kMixtral, LlamaFamily::kQwen3Moe),
                         [](const auto& info) { return info.param == LlamaFamily::kMixtral ? "Mixtral" : "Qwen3Moe"; });

// The control: the same weights routed without renormalising the top k
// weights give other logits, past the bound (the routing is checked).
TEST(MoeControlTest, WithoutRenormalisedRoutingTheLogitsDiffer) {
  auto config = small_config(LlamaFamily::kMixtral);
  auto other = config;
  other.normalize_top_k = false;
  torch::manual_seed(3);
  auto a = llama(config);
  torch::manual_seed(3);
  auto b = llama(other);
  a->to(torch::kFloat64);
  b->to(torch::kFloat64);
  auto tokens = torch::randint(0, config.vocab_size, {1, 24}, torch::kInt64);
  EXPECT_GT((a->forward(tokens) - b->forward(tokens)).abs().max().item<double>(), 1e-4);
}

// Dropless and grouped: every expert gets a gradient each step, zeros where
// no token chose it, and the output is the same whatever the rows' order.
TEST(MoeControlTest, EveryExpertHasAGradientAndNoTokenIsDropped) {
  MoeConfig c{/*hidden=*/8, /*intermediate=*/6, /*experts=*/5, /*top_k=*/1};
  torch::manual_seed(5);
  SparseMoe moe(c);
  moe->to(torch::kFloat64);
  {  // a router that sends every token to expert 2
    torch::NoGradGuard no_grad;
    moe->gate->weight.zero_();
    moe->gate->weight[2].fill_(1);
  }
  auto x = torch::rand({1, 4, 8}, torch::kFloat64) + 0.1;
  moe->forward(x).sum().backward();
  const auto& g = moe->experts->gate_proj.grad();
  ASSERT_TRUE(g.defined());
  EXPECT_GT(g[2].abs().sum().item<double>(), 0);
  EXPECT_EQ(g.abs().sum().item<double>(), g[2].abs().sum().item<double>());
  const auto r = take_router_records(*moe);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].tokens_per_expert[2].item<double>(), 4);
  EXPECT_EQ(r[0].rows, 4);
  // Every token through expert 2 alone, with weight 1: its MLP, row by row.
  auto y = moe->forward(x)[0];
  const auto& e = *moe->experts;
  auto want = torch::matmul(torch::silu(torch::matmul(x[0], e.gate_proj[2].t())) * torch::matmul(x[0], e.up_proj[2].t()),
                            e.down_proj[2].t());
  EXPECT_LE((y - want).abs().max().item<double>(), 1e-14);
}

}  // namespace moe_test
}  // namespace tandem::models
