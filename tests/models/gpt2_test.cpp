// models::gpt2 against Hugging Face transformers' GPT2LMHeadModel (a random
// small config, nothing downloaded): tandem's weights, saved under
// transformers' names, load into it; the logits, the next-token loss and
// every parameter's gradient agree to 1e-10 in float64 and 1e-5 in float32.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <fstream>

#include "tandem/checkpoint/safetensors.h"
#include "tandem/models/gpt2.h"
#include "tandem/models/registry.h"
#include "tandem/models/split_region.h"
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
  checkpoint::NamedTensors saved = {{"tokens", tokens}, {"targets", targets}};
  for (const auto& p : model->named_parameters()) saved.emplace_back(gpt2_hf_name(p.key()), p.value().detach());
  checkpoint::write_safetensors(dir.file("in.safetensors"), saved);
  const std::string script = dir.file("reference.py");
  std::ofstream(script) << kReference;
  auto r = testing::run(std::string(TANDEM_PYTHON) + " " + script + " " + dir.file("in.safetensors") + " " +
                        dir.file("out.safetensors"));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  if (r.exit_code != 0) return {1, 1, 1, 0};
  std::map<std::string, torch::Tensor> theirs;
  for (auto& [name, t] : checkpoint::read_safetensors(dir.file("out.safetensors")).tensors) theirs[name] = t;

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

// Note [dropout under tp]: each part of a split activation is dropped with
// its part of the one mask the whole would get from the same generator
// state; the whole's mask is libtorch's dropout's (CPU), and evaluation
// drops nothing. A part of the wrong size is named, not broadcast.
TEST(Gpt2Test, DropoutKeepsEachPartOfOneWholeMask) {
  torch::manual_seed(1);
  const auto x = torch::randn({2, 6, 5, 5}, torch::kFloat64);
  torch::manual_seed(7);
  const auto whole = dropout_part(x, 0.3, true);
  torch::manual_seed(7);
  EXPECT_TRUE(torch::equal(whole, torch::dropout(x, 0.3, true)));
  EXPECT_FALSE(torch::equal(whole, x));
  for (int64_t rank = 0; rank < 3; ++rank) {
    torch::manual_seed(7);
    const auto part = dropout_part(x.chunk(3, 1)[rank], 0.3, true, 1, 6, rank, 3);
    EXPECT_TRUE(torch::equal(part, whole.chunk(3, 1)[rank])) << "part " << rank;
  }
  // A control: a part's own mask (drawn for its size alone) is another.
  torch::manual_seed(7);
  EXPECT_FALSE(torch::equal(dropout_part(x.chunk(3, 1)[1], 0.3, true), whole.chunk(3, 1)[1]));
  EXPECT_TRUE(torch::equal(dropout_part(x, 0.3, false), x));
  EXPECT_THROW(dropout_part(x.chunk(3, 1)[0], 0.3, true, 1, 9, 0, 3), std::exception);
}

// With dropout on, GPT-2's attention takes the softmax path whose mask it
// draws itself (Note [dropout under tp]); with nothing dropped (p so small
// that 1 - p is 1) it computes sdpa's function to rounding, and in
// evaluation the model is the one without dropout.
TEST(Gpt2Test, TheAttentionWithDropoutIsSdpasFunction) {
  auto config = small_config();
  torch::manual_seed(3);
  auto plain = gpt2(config);
  plain->to(torch::kFloat64);
  config.dropout = 1e-300;
  auto dropping = gpt2(config);
  dropping->to(torch::kFloat64);
  {
    torch::NoGradGuard no_grad;
    auto theirs = plain->named_parameters();
    for (auto& p : dropping->named_parameters()) p.value().copy_(theirs[p.key()]);
  }
  const auto tokens = torch::randint(61, {2, 16}, torch::kInt64);
  const auto expected = plain->forward(tokens);
  const auto got = dropping->forward(tokens);
  EXPECT_LT((got - expected).abs().max().item<double>(), 1e-12);
  config.dropout = 0.5;
  auto half = gpt2(config);
  half->to(torch::kFloat64);
  {
    torch::NoGradGuard no_grad;
    auto theirs = plain->named_parameters();
    for (auto& p : half->named_parameters()) p.value().copy_(theirs[p.key()]);
  }
  EXPECT_GT((half->forward(tokens) - expected).abs().max().item<double>(), 1e-3);  // the control
  half->eval();
  EXPECT_TRUE(torch::equal(half->forward(tokens), plain->forward(tokens)));
}

}  // namespace
}  // namespace tandem::models
