// Generation with a key/value cache (models/decoding.h): the cached
// layers give the logits of the whole sequence recomputed (float64, to
// rounding), greedy generation is transformers' generate() token for token
// on the same weights, a sequence past the positions is cropped as nanoGPT
// crops it, and sampling is the seed's.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <fstream>

#include "tandem/checkpoint/hf_format.h"
#include "tandem/checkpoint/safetensors.h"
#include "tandem/models/decoding.h"
#include "tandem/models/gpt2.h"
#include "tandem/models/llama.h"
#include "tandem/util/check.h"
#include "testing.h"

namespace tandem::models {
namespace {

using testing::TempDir;

Gpt2Config small_gpt2(int64_t positions = 32) {
  Gpt2Config c;
  c.vocab_size = 61;
  c.n_positions = positions;
  c.n_embd = 12;
  c.n_layer = 2;
  c.n_head = 3;
  return c;
}

LlamaConfig small_llama() {
  LlamaConfig c;
  c.vocab_size = 61;
  c.hidden_size = 16;
  c.intermediate_size = 24;
  c.num_layers = 2;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.max_positions = 32;
  return c;
}

std::vector<Sequence> both_models() {
  torch::manual_seed(3);
  auto a = gpt2(small_gpt2()), b = llama(small_llama());
  a->to(torch::kFloat64);
  b->to(torch::kFloat64);
  a->eval();
  b->eval();
  return {a, b};
}

// The prompt in one pass, then 3 tokens at once, then 1: the last
// positions' outputs of every layer equal the whole 9 tokens' recomputed.
TEST(DecodingTest, CachedLayersGiveTheWholeSequencesOutputs) {
  torch::NoGradGuard no_grad;
  for (auto& model : both_models()) {
    auto tokens = torch::randint(61, {2, 9}, torch::kInt64);
    auto whole = model->forward(tokens);
    auto* embed = dynamic_cast<PositionedEmbedding*>(model->at(0).ptr().get());
    ASSERT_NE(embed, nullptr);
    std::vector<KvCache> caches(model->size() - 2);
    std::vector<torch::Tensor> pieces;
    int64_t start = 0;
    for (int64_t n : {5, 3, 1}) {
      auto x = embed->forward_at(tokens.narrow(1, start, n), start);
      for (size_t i = 1; i + 1 < model->size(); ++i) {
        x = dynamic_cast<CachedLayer*>(model->at(i).ptr().get())->forward_cached(x, caches[i - 1]);
      }
      pieces.push_back(model->at(model->size() - 1).forward(x));
      start += n;
    }
    auto cached = torch::cat(pieces, 1);
    EXPECT_LT((cached - whole).abs().max().item<double>(), 1e-12) << model->name(1);
    EXPECT_EQ(caches.front().length(), 9);
    // Control: the 3 tokens without their cache (positions from 0) differ.
    std::vector<KvCache> fresh(model->size() - 2);
    auto x = embed->forward_at(tokens.narrow(1, 5, 3), 0);
    for (size_t i = 1; i + 1 < model->size(); ++i) {
      x = dynamic_cast<CachedLayer*>(model->at(i).ptr().get())->forward_cached(x, fresh[i - 1]);
    }
    EXPECT_GT((model->at(model->size() - 1).forward(x) - whole.narrow(1, 5, 3)).abs().max().item<double>(), 1e-3);
  }
}

// Greedy generation is the argmax of the whole sequence's last logits,
// step after step; past the positions the sequence keeps its last ones.
TEST(DecodingTest, GreedyGenerationIsTheRecomputedArgmaxAndCropsAtTheContext) {
  torch::NoGradGuard no_grad;
  torch::manual_seed(4);
  auto model = gpt2(small_gpt2(/*positions=*/8));
  model->to(torch::kFloat64);
  auto prompt = torch::randint(61, {2, 5}, torch::kInt64);
  SampleOptions o;
  o.max_tokens = 10;  // 15 tokens: past the 8 positions
  o.temperature = 0;
  o.context = 8;
  auto generated = generate(model, prompt, o);
  ASSERT_EQ(generated.sizes(), (std::vector<int64_t>{2, 10}));
  auto sequence = prompt;
  model->eval();
  for (int64_t n = 0; n < 10; ++n) {
    auto window = sequence.size(1) > 8 ? sequence.narrow(1, sequence.size(1) - 8, 8) : sequence;
    auto next = model->forward(window).select(1, window.size(1) - 1).argmax(-1, true);
    sequence = torch::cat({sequence, next}, 1);
  }
  EXPECT_TRUE(torch::equal(generated, sequence.narrow(1, 5, 10)));
  // Without the context the model refuses the 9th position, by name.
  o.context = 0;
  EXPECT_THROW(generate(model, prompt, o), Error);
}

// Sampling draws from the seeded generator: the same seed the same
// tokens, another seed others; top-k 1 is greedy.
TEST(DecodingTest, SamplingIsTheSeedsAndTopKOneIsGreedy) {
  auto model = both_models()[1];
  auto prompt = torch::randint(61, {1, 4}, torch::kInt64);
  SampleOptions o;
  o.max_tokens = 20;
  o.temperature = 1.5;
  o.seed = 7;
  auto a = generate(model, prompt, o), b = generate(model, prompt, o);
  EXPECT_TRUE(torch::equal(a, b));
  o.seed = 8;
  EXPECT_FALSE(torch::equal(a, generate(model, prompt, o)));
  o.top_k = 1;
  auto top1 = generate(model, prompt, o);
  o.temperature = 0;
  o.top_k = 0;
  EXPECT_TRUE(torch::equal(top1, generate(model, prompt, o)));
  o.temperature = -1;
  EXPECT_THROW(generate(model, prompt, o), Error);
}

const char* kScript = R"(
import sys, torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM
sys.path.insert(0, sys.argv.pop(1))  # tests/testing
import transformers_peer
transformers_peer.keep_float64_rms_norm()
folder, io = sys.argv[1], sys.argv[2]
prompt = load_file(io)["prompt"]
model = AutoModelForCausalLM.from_pretrained(folder).eval()
with torch.no_grad():
    out = model.generate(prompt, attention_mask=torch.ones_like(prompt), do_sample=False, max_new_tokens=12,
                         pad_token_id=0)
save_file({"tokens": out[:, prompt.shape[1]:].contiguous()}, io + ".out")
)";

// transformers' generate(do_sample=False) on the same weights (its own
// key/value cache) gives the same 12 tokens, for GPT-2 and for LLaMA with
// grouped-query heads.
TEST(DecodingTest, GreedyGenerationIsTransformers) {
  const std::vector<std::string> kinds = {"gpt2", "llama"};
  auto models = both_models();
  for (size_t m = 0; m < models.size(); ++m) {
    TempDir dir;
    auto& model = models[m];
    if (kinds[m] == "gpt2") {
      checkpoint::write_hf_folder(dir.file("hf"), model, small_gpt2());
    } else {
      checkpoint::write_hf_folder(dir.file("hf"), model, small_llama());
    }
    torch::manual_seed(5);
    auto prompt = torch::randint(61, {2, 6}, torch::kInt64);
    checkpoint::write_safetensors(dir.file("io.safetensors"), {{"prompt", prompt}});
    std::ofstream(dir.file("script.py")) << kScript;
    auto r = testing::run("HF_HUB_OFFLINE=1 " + std::string(TANDEM_PYTHON) + " " + dir.file("script.py") +
                          " " TANDEM_SOURCE_DIR "/tests/testing " + dir.file("hf") + " " +
                          dir.file("io.safetensors") + " 2>&1");
    ASSERT_EQ(r.exit_code, 0) << r.output;
    auto theirs = checkpoint::read_safetensors(dir.file("io.safetensors.out")).tensors.at(0).second;
    SampleOptions o;
    o.max_tokens = 12;
    o.temperature = 0;
    auto ours = generate(model, prompt, o);
    EXPECT_TRUE(torch::equal(ours, theirs)) << kinds[m] << "\nours " << ours << "\ntheirs " << theirs;
  }
}

}  // namespace
}  // namespace tandem::models
