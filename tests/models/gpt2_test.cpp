// models::gpt2 against Hugging Face transformers' GPT2LMHeadModel (a random
// small config, nothing downloaded): tandem's weights, saved under
// transformers' names, load into it; the logits, the next-token loss and
// every parameter's gradient agree to 1e-10 in float64 and 1e-5 in float32.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <fstream>

#include "tandem/engine/safetensors.h"
#include "tandem/models/gpt2.h"
#include "tandem/models/registry.h"
#include "tandem/parallel/data_parallel.h"
#include "testing.h"

namespace tandem::models {
namespace {

using testing::TempDir;

Gpt2Config small_config() {
  Gpt2Config c;
  c.vocab_size = 61;
  c.n_positions = 16;
  c.n_embd = 12;
  c.n_layer = 2;
  c.n_head = 3;
  return c;
}

const char* kReference = R"(
import sys, torch, torch.nn.functional as F
from safetensors.torch import load_file, save_file
from transformers import GPT2Config, GPT2LMHeadModel
inputs, out = load_file(sys.argv[1]), sys.argv[2]
tokens, targets = inputs.pop("tokens"), inputs.pop("targets")
dtype = inputs["transformer.wte.weight"].dtype
config = GPT2Config(vocab_size=61, n_positions=16, n_embd=12, n_layer=2, n_head=3, resid_pdrop=0.0,
                    embd_pdrop=0.0, attn_pdrop=0.0, layer_norm_epsilon=1e-5)
model = GPT2LMHeadModel(config).to(dtype)
missing, unexpected = model.load_state_dict(inputs, strict=False)
assert missing == ["lm_head.weight"] and not unexpected, (missing, unexpected)
assert model.lm_head.weight is model.transformer.wte.weight
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
  double logits = 0, loss = 0, grads = 0;  // the largest absolute differences
  int64_t grads_compared = 0;
};

// Runs tandem's model and transformers' on the same weights and tokens.
// `untie_gradient`: the control, the head's use of the embedding left out
// of its gradient.
Compared compare_with_transformers(torch::ScalarType dtype, bool untie_gradient = false) {
  torch::manual_seed(5);
  auto model = gpt2(small_config());
  model->to(dtype);
  auto tokens = torch::randint(0, 61, {2, 10}, torch::kInt64);
  auto targets = torch::randint(0, 61, {2, 10}, torch::kInt64);
  TempDir dir;
  engine::NamedTensors saved = {{"tokens", tokens}, {"targets", targets}};
  for (const auto& p : model->named_parameters()) saved.emplace_back(gpt2_hf_name(p.key()), p.value().detach());
  engine::write_safetensors(dir.file("in.safetensors"), saved);
  const std::string script = dir.file("reference.py");
  std::ofstream(script) << kReference;
  auto r = testing::run(std::string(TANDEM_PYTHON) + " " + script + " " + dir.file("in.safetensors") + " " +
                        dir.file("out.safetensors"));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  if (r.exit_code != 0) return {1, 1, 1, 0};
  std::map<std::string, torch::Tensor> theirs;
  for (auto& [name, t] : engine::read_safetensors(dir.file("out.safetensors")).tensors) theirs[name] = t;

  if (untie_gradient) {
    auto* head = model->at(model->size() - 1).get<Gpt2Head>().get();
    head->tie(head->tied().detach());
  }
  auto logits = model->forward(tokens);
  auto loss = torch::nn::functional::cross_entropy(logits.reshape({-1, 61}), targets.reshape({-1}));
  loss.backward();
  Compared c;
  c.logits = (logits - theirs.at("logits")).abs().max().item<double>();
  c.loss = std::abs(loss.item<double>() - theirs.at("loss").item<double>());
  for (const auto& p : model->named_parameters()) {
    const auto& want = theirs.at("grad." + gpt2_hf_name(p.key()));
    EXPECT_EQ(p.value().grad().sizes(), want.sizes()) << p.key();
    c.grads = std::max(c.grads, (p.value().grad() - want).abs().max().item<double>());
    ++c.grads_compared;
  }
  return c;
}

TEST(Gpt2Test, LogitsLossAndGradientsAreTransformersInFloat64) {
  auto c = compare_with_transformers(torch::kFloat64);
  EXPECT_EQ(c.grads_compared, 2 + 2 * 12 + 2);  // wte, wpe; 12 per block; ln_f
  EXPECT_LE(c.logits, 1e-10);
  EXPECT_LE(c.loss, 1e-10);
  EXPECT_LE(c.grads, 1e-10);
  std::printf("float64: logits %.2e, loss %.2e, gradients %.2e\n", c.logits, c.loss, c.grads);
}

TEST(Gpt2Test, LogitsLossAndGradientsAreTransformersInFloat32) {
  auto c = compare_with_transformers(torch::kFloat32);
  EXPECT_LE(c.logits, 1e-5);
  EXPECT_LE(c.loss, 1e-5);
  EXPECT_LE(c.grads, 1e-5);
  std::printf("float32: logits %.2e, loss %.2e, gradients %.2e\n", c.logits, c.loss, c.grads);
}

// The control: without the head's share of the tied embedding's gradient,
// the gradients are far outside the bound (the forward is the same).
TEST(Gpt2Test, AnUntiedGradientFailsTheBound) {
  auto c = compare_with_transformers(torch::kFloat64, /*untie_gradient=*/true);
  EXPECT_LE(c.logits, 1e-10);
  EXPECT_GT(c.grads, 1e-3);
}

// Note [tied embedding]: a clone's head multiplies by the clone's own
// embedding, so DataParallel's replicas (clones) give one device's
// gradients: the tied tensor's included, with both of its uses.
TEST(Gpt2Test, ClonesAndDataParallelReplicasKeepTheTie) {
  torch::manual_seed(7);
  auto model = gpt2(small_config());
  model->to(torch::kFloat64);
  auto copy = std::dynamic_pointer_cast<SequenceImpl>(model->clone());
  auto* head = copy->at(copy->size() - 1).get<Gpt2Head>().get();
  EXPECT_TRUE(head->tied().is_same(copy->named_parameters()["embed.wte.weight"]));
  EXPECT_FALSE(head->tied().is_same(model->named_parameters()["embed.wte.weight"]));

  auto tokens = torch::randint(0, 61, {4, 10}, torch::kInt64);
  auto targets = torch::randint(0, 61, {4, 10}, torch::kInt64);
  auto loss_of = [&](const torch::Tensor& logits) {
    return torch::nn::functional::cross_entropy(logits.reshape({-1, 61}), targets.reshape({-1}));
  };
  loss_of(copy->forward(tokens)).backward();
  parallel::DataParallel dp(model, parallel::DataParallelOptions{{torch::kCPU, torch::kCPU}});
  loss_of(dp->forward(tokens)).backward();
  auto want = copy->named_parameters();
  for (const auto& p : model->named_parameters()) {
    ASSERT_TRUE(p.value().grad().defined()) << p.key();
    EXPECT_LE((p.value().grad() - want[p.key()].grad()).abs().max().item<double>(), 1e-12) << p.key();
  }
}

TEST(Gpt2Test, PresetsHaveGpt2sParameterCounts) {
  // transformers' GPT2LMHeadModel sizes, the tied head counted once.
  EXPECT_EQ(count_parameters(*gpt2(Gpt2Config::preset("gpt2"))), 124439808);
  auto tiny = Gpt2Config::preset("gpt2-tiny");
  EXPECT_EQ(tiny.n_layer, 4);
  EXPECT_EQ(tiny.n_embd, 128);
  try {
    Gpt2Config::preset("gpt3");
    FAIL() << "gpt3 accepted";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("unknown GPT-2 size 'gpt3' (known: gpt2-tiny, gpt2, gpt2-medium"),
              std::string::npos) << e.what();
  }
  auto odd = small_config();
  odd.n_head = 5;
  EXPECT_THROW(gpt2(odd), std::exception);
}

TEST(Gpt2Test, TooLongASequenceIsNamed) {
  auto model = gpt2(small_config());
  try {
    model->forward(torch::zeros({1, 17}, torch::kInt64));
    FAIL() << "17 tokens accepted";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("a sequence of 17 tokens is longer than the model's 16 positions"),
              std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace tandem::models
