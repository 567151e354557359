#include <gtest/gtest.h>

#include "tandem/models/mobilenetv2.h"
#include "tandem/models/registry.h"
#include "tandem/util/check.h"

namespace tandem::models {
namespace {

ModelOptions imagenet(int64_t classes = 1000) {
  ModelOptions o;
  o.in_channels = 3;
  o.num_classes = classes;
  o.image_size = 224;
  return o;
}

// Counts from torchvision.models.*(num_classes=1000).
TEST(ModelsTest, ParameterCountsEqualTorchvision) {
  EXPECT_EQ(count_parameters(*make_model("resnet18", imagenet())), 11689512);
  EXPECT_EQ(count_parameters(*make_model("resnet34", imagenet())), 21797672);
  EXPECT_EQ(count_parameters(*make_model("resnet50", imagenet())), 25557032);
  EXPECT_EQ(count_parameters(*make_model("mobilenetv2", imagenet())), 3504872);
}

TEST(ModelsTest, ParameterNamesEqualTorchvisionStateDictKeys) {
  auto resnet = make_model("resnet18", imagenet());
  auto names = resnet->named_parameters().keys();
  EXPECT_EQ(names.front(), "conv1.weight");
  EXPECT_EQ(names.back(), "fc.bias");
  EXPECT_TRUE(resnet->named_parameters().contains("layer2.0.downsample.0.weight"));
  EXPECT_TRUE(resnet->named_buffers().contains("layer4.1.bn2.running_var"));
  auto mobilenet = make_model("mobilenetv2", imagenet());
  EXPECT_TRUE(mobilenet->named_parameters().contains("features.0.0.weight"));
  EXPECT_TRUE(mobilenet->named_parameters().contains("features.1.conv.0.0.weight"));
  EXPECT_TRUE(mobilenet->named_parameters().contains("features.2.conv.3.weight"));
  EXPECT_TRUE(mobilenet->named_parameters().contains("classifier.1.weight"));
}

TEST(ModelsTest, OutputShapesForEveryModelAndStem) {
  torch::NoGradGuard no_grad;
  struct Case {
    std::string name;
    int64_t channels, size;
  };
  for (const auto& c : std::vector<Case>{{"convnet", 1, 28}, {"convnet", 3, 32}, {"mlp", 1, 28}, {"resnet18", 3, 32},
                                         {"resnet18", 3, 112}, {"resnet50", 1, 32},
                                         {"mobilenetv2", 3, 64}}) {
    ModelOptions o;
    o.in_channels = c.channels;
    o.image_size = c.size;
    o.num_classes = 7;
    auto model = make_model(c.name, o);
    model->eval();
    auto out = model->forward(torch::randn({2, c.channels, c.size, c.size}));
    EXPECT_EQ(out.sizes(), (std::vector<int64_t>{2, 7})) << c.name << " at " << c.size;
  }
}

TEST(ModelsTest, CifarStemKeepsResolutionImagenetStemQuartersIt) {
  ModelOptions o = imagenet(10);
  o.stem = "cifar";
  auto cifar = make_model("resnet18", o);
  EXPECT_EQ(cifar->named_parameters()["conv1.weight"].sizes(), (std::vector<int64_t>{64, 3, 3, 3}));
  EXPECT_EQ(cifar->named_children().size(), 10u);  // no maxpool
  o.stem = "imagenet";
  auto in = make_model("resnet18", o);
  EXPECT_EQ(in->named_parameters()["conv1.weight"].sizes(), (std::vector<int64_t>{64, 3, 7, 7}));
  EXPECT_EQ(in->named_children().size(), 11u);
  torch::NoGradGuard no_grad;
  cifar->eval();
  in->eval();
  // Before layer1: the cifar stem keeps 32x32, the imagenet stem gives 8x8.
  auto x = torch::randn({1, 3, 32, 32});
  for (size_t i = 0; i < 3; ++i) x = cifar->at(i).forward(x);
  EXPECT_EQ(x.size(2), 32);
  x = torch::randn({1, 3, 32, 32});
  for (size_t i = 0; i < 4; ++i) x = in->at(i).forward(x);
  EXPECT_EQ(x.size(2), 8);
  o.stem = "bogus";
  EXPECT_THROW(make_model("resnet18", o), Error);
}

TEST(ModelsTest, WidthMultiplierScalesMobileNet) {
  EXPECT_EQ(make_divisible(32 * 0.5), 16);
  EXPECT_EQ(make_divisible(1280 * 1.4), 1792);
  auto o = imagenet();
  o.width_mult = 0.5;
  auto half = count_parameters(*make_model("mobilenetv2", o));
  EXPECT_LT(half, 2000000);  // torchvision mobilenet_v2(width_mult=0.5): 1,968,680
  EXPECT_EQ(half, 1968680);
}

TEST(ModelsTest, CloneIsADeepCopyWithTheSameNames) {
  auto model = make_model("resnet18", imagenet(10));
  auto copy = std::dynamic_pointer_cast<SequenceImpl>(model->clone());
  ASSERT_TRUE(copy);
  auto a = model->named_parameters();
  auto b = copy->named_parameters();
  ASSERT_EQ(a.keys(), b.keys());
  for (const auto& key : a.keys()) {
    EXPECT_TRUE(torch::equal(a[key], b[key])) << key;
    EXPECT_NE(a[key].data_ptr(), b[key].data_ptr()) << key;
  }
  model->eval();
  copy->eval();
  torch::NoGradGuard no_grad;
  auto x = torch::randn({2, 3, 32, 32});
  EXPECT_TRUE(torch::equal(model->forward(x), copy->forward(x)));
}

TEST(ModelsTest, RegistryNamesUnknownModelsAndTakesNewOnes) {
  try {
    make_model("resnet9000", {});
    FAIL();
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(),
                 "unknown model 'resnet9000' (known: convnet, gpt2, gpt2-large, gpt2-medium, gpt2-tiny, gpt2-xl, gpt3-175b, "
                 "llama-3-70b, llama-3-8b, llama-3.1-405b, llama-3.2-1b, llama-tiny, mixtral-8x7b, mixtral-tiny, mlp, mobilenetv2, qwen3-30b-a3b, qwen3-moe-tiny, resnet18, resnet34, resnet50)");
  }
  register_model("tiny", [](const ModelOptions& o) {
    Sequence s;
    s->push_back("flatten", torch::nn::Flatten());
    s->push_back("fc", torch::nn::Linear(o.in_channels * o.image_size * o.image_size, o.num_classes));
    return s;
  });
  EXPECT_EQ(count_parameters(*make_model("tiny", {1, 10, 4})), 16 * 10 + 10);
  EXPECT_THROW(register_model("tiny", nullptr), Error);
}

}  // namespace
}  // namespace tandem::models

namespace tandem::models {
namespace {

// The language models of the registry: the data's vocabulary and the
// sequence length in, [B, T, vocab] out; their traits say what the built
// model is (layer names, tie, context), and the FLOPs per token are 6 per
// multiplying weight (all but the position table and an untied
// embedding's own lookups) plus attention's 12 x layers x width x T.
TEST(ModelsTest, LanguageModelsTakeTheDataVocabularyAndTheirTraitsAreTheModel) {
  torch::NoGradGuard no_grad;
  ModelOptions o;
  o.vocab_size = 300;
  o.seq_len = 16;
  for (const std::string name : {"gpt2-tiny", "llama-tiny"}) {
    auto traits = model_traits(name);
    ASSERT_EQ(traits.kind, ModelKind::kLanguageModel) << name;
    auto model = make_model(name, o);
    auto out = model->forward(torch::randint(300, {2, 16}, torch::kInt64));
    EXPECT_EQ(out.sizes(), (std::vector<int64_t>{2, 16, 300})) << name;
    std::vector<std::string> layers;
    for (size_t i = 0; i < model->size(); ++i) layers.push_back(model->name(i));
    EXPECT_EQ(layers, traits.layer_names) << name;
    EXPECT_EQ(traits.tied_embedding, !model->ties().empty()) << name;
    double looked_up = 0;  // parameters that are only looked up
    for (const auto& p : model->named_parameters()) {
      // GPT-2's position table; an untied token embedding (its head has
      // its own weight); the tied one multiplies in the head.
      const bool in_embed = p.key().rfind("embed.", 0) == 0;
      if (in_embed && (p.key() == "embed.wpe.weight" || !traits.tied_embedding)) {
        looked_up += static_cast<double>(p.value().numel());
      }
    }
    const double weights = static_cast<double>(count_parameters(*model)) - looked_up;
    EXPECT_DOUBLE_EQ(traits.flops_per_token(o), 6 * weights + 12.0 * 4 * 128 * 16) << name;
  }
  EXPECT_TRUE(model_traits("llama-3.2-1b").tied_embedding);
  EXPECT_FALSE(model_traits("convnet").kind == ModelKind::kLanguageModel);
  o.seq_len = 257;
  EXPECT_THROW(make_model("gpt2-tiny", o), UsageError);  // 256 positions
  o.seq_len = 16;
  o.vocab_size = 0;
  EXPECT_THROW(make_model("llama-tiny", o), UsageError);  // no vocabulary
}

}  // namespace
}  // namespace tandem::models
