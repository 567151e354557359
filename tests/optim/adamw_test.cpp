// optim::AdamW against torch.optim.AdamW (Python, the same wheel): the
// weights and the state after several steps, bit for bit, for each of
// PyTorch's paths on the CPU (single-tensor, foreach, fused), with and
// without amsgrad. The parameters, gradients and learning rates are made by
// the same libtorch kernels on both sides, so any difference is the
// optimizer's.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "tandem/optim/adamw.h"
#include "tandem/optim/schedule.h"
#include "testing.h"

namespace tandem::optim {
namespace adamw_test {  // the file's own names (a layer's tests compile as one unit)

constexpr int kSteps = 6;

// Two dtypes (two foreach groups); parameter 3 gets no gradient on odd
// steps; parameter 1 is a vector (no weight decay).
std::vector<torch::Tensor> make_parameters() {
  const std::vector<std::pair<std::vector<int64_t>, torch::ScalarType>> shapes = {
      {{5, 3}, torch::kFloat32}, {{3}, torch::kFloat32}, {{4, 2}, torch::kFloat64}, {{2, 2}, torch::kFloat32}};
  std::vector<torch::Tensor> params;
  for (size_t i = 0; i < shapes.size(); ++i) {
    int64_t n = 1;
    for (auto d : shapes[i].first) n *= d;
    params.push_back(torch::sin(torch::arange(n, shapes[i].second).reshape(shapes[i].first) * 0.37 +
                                static_cast<double>(i))
                         .requires_grad_());
  }
  return params;
}

void fake_backward(std::vector<torch::Tensor>& params, int step) {
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < params.size(); ++i) {
    params[i].mutable_grad() = (i == 3 && step % 2 == 1)
                                   ? torch::Tensor()
                                   : torch::sin(params[i].detach() * (step + 1) + static_cast<double>(i));
  }
}

double lr_at(int step) { return 0.01 / (step + 1); }

const char* kReference = R"(
import json, sys, torch
def run(kwargs, amsgrad):
  shapes = [((5, 3), torch.float32), ((3,), torch.float32), ((4, 2), torch.float64), ((2, 2), torch.float32)]
  ps = []
  for i, (shape, dtype) in enumerate(shapes):
      n = 1
      for d in shape: n *= d
      ps.append(torch.sin(torch.arange(n, dtype=dtype).reshape(shape) * 0.37 + float(i)).requires_grad_())
  opt = torch.optim.AdamW([{"params": [ps[0], ps[2], ps[3]], "weight_decay": 0.1},
                           {"params": [ps[1]], "weight_decay": 0.0}],
                          lr=0.01, betas=(0.9, 0.95), eps=1e-8, amsgrad=amsgrad, **kwargs)
  for step in range(6):
      for g in opt.param_groups: g["lr"] = 0.01 / (step + 1)
      with torch.no_grad():
          for i, p in enumerate(ps):
              p.grad = None if (i == 3 and step % 2 == 1) else torch.sin(p.detach() * (step + 1) + float(i))
      opt.step()
  out = []
  for p in ps:
      s = opt.state[p]
      out.append({"param": p.detach().double().flatten().tolist(), "exp_avg": s["exp_avg"].double().flatten().tolist(),
                  "exp_avg_sq": s["exp_avg_sq"].double().flatten().tolist(), "step": float(s["step"]),
                  "max_exp_avg_sq": s["max_exp_avg_sq"].double().flatten().tolist() if amsgrad else []})
  return out
print(json.dumps({c: run(json.loads(c.split("|")[0]), c.split("|")[1] == "1") for c in sys.argv[1:]}))
)";

// Python's weights for every case at once ("kwargs|amsgrad"): one start
// of Python and torch per test process.
nlohmann::json reference(const std::string& kwargs, bool amsgrad) {
  static const nlohmann::json all = [] {
    const std::string path = ::testing::TempDir() + "/adamw_reference.py";
    std::ofstream(path) << kReference;
    std::string command = std::string(TANDEM_PYTHON) + " " + path;
    for (const char* kw : {"{}", "{\"foreach\": true}", "{\"fused\": true}"}) {
      for (const char* ams : {"0", "1"}) command += std::string(" '") + kw + "|" + ams + "'";
    }
    auto r = testing::run(command);
    EXPECT_EQ(r.exit_code, 0) << r.output;
    return r.exit_code == 0 ? nlohmann::json::parse(r.output) : nlohmann::json::object();
  }();
  const std::string key = kwargs + "|" + (amsgrad ? "1" : "0");
  EXPECT_TRUE(all.contains(key)) << key;
  return all.value(key, nlohmann::json::array());
}

bool same(const torch::Tensor& ours, const nlohmann::json& theirs) {
  auto values = theirs.get<std::vector<double>>();
  return torch::equal(ours.detach().to(torch::kFloat64).flatten(), torch::tensor(values, torch::kFloat64));
}

// Trains the parameters with `make_optimizer` and compares every parameter
// and state tensor with Python's; returns how many differed.
template <typename MakeOptimizer>
int differences(const nlohmann::json& want, bool amsgrad, MakeOptimizer make_optimizer) {
  auto params = make_parameters();
  if (want.size() != params.size()) return 1000;  // no reference: a failure already reported
  auto options = torch::optim::AdamWOptions(0.01).betas({0.9, 0.95}).eps(1e-8).amsgrad(amsgrad);
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(std::vector<torch::Tensor>{params[0], params[2], params[3]},
                      std::make_unique<torch::optim::AdamWOptions>(torch::optim::AdamWOptions(options).weight_decay(0.1)));
  groups.emplace_back(std::vector<torch::Tensor>{params[1]},
                      std::make_unique<torch::optim::AdamWOptions>(torch::optim::AdamWOptions(options).weight_decay(0)));
  auto optimizer = make_optimizer(std::move(groups), options);
  for (int step = 0; step < kSteps; ++step) {
    set_lr(*optimizer, lr_at(step));
    fake_backward(params, step);
    optimizer->step();
  }
  int differ = 0;
  for (size_t i = 0; i < params.size(); ++i) {
    const auto& state =
        static_cast<torch::optim::AdamWParamState&>(*optimizer->state().at(params[i].unsafeGetTensorImpl()));
    differ += !same(params[i], want[i]["param"]);
    differ += !same(state.exp_avg(), want[i]["exp_avg"]);
    differ += !same(state.exp_avg_sq(), want[i]["exp_avg_sq"]);
    if (amsgrad) differ += !same(state.max_exp_avg_sq(), want[i]["max_exp_avg_sq"]);
    differ += static_cast<double>(state.step()) != want[i]["step"].get<double>();
  }
  return differ;
}

auto ours(AdamWKernel kernel) {
  return [kernel](std::vector<torch::optim::OptimizerParamGroup> groups, torch::optim::AdamWOptions options) {
    return std::make_unique<AdamW>(std::move(groups), options, kernel);
  };
}

TEST(AdamWTest, ForeachIsBitIdenticalToTorchOptimAdamWOnTheCpu) {
  for (bool amsgrad : {false, true}) {
    SCOPED_TRACE(amsgrad ? "amsgrad" : "adamw");
    auto single = reference("{}", amsgrad);  // PyTorch's default on the CPU: single-tensor
    auto foreach = reference("{\"foreach\": true}", amsgrad);
    EXPECT_EQ(differences(single, amsgrad, ours(AdamWKernel::foreach)), 0);
    EXPECT_EQ(differences(foreach, amsgrad, ours(AdamWKernel::foreach)), 0);
    // On the CPU, automatic is foreach.
    EXPECT_EQ(differences(single, amsgrad, ours(AdamWKernel::automatic)), 0);
  }
}

TEST(AdamWTest, FusedIsBitIdenticalToTorchOptimAdamWsFusedKernel) {
  for (bool amsgrad : {false, true}) {
    SCOPED_TRACE(amsgrad ? "amsgrad" : "adamw");
    auto fused = reference("{\"fused\": true}", amsgrad);
    EXPECT_EQ(differences(fused, amsgrad, ours(AdamWKernel::fused)), 0);
    // The fused kernel rounds otherwise than the foreach ops: the
    // comparison tells the two apart.
    EXPECT_GT(differences(fused, amsgrad, ours(AdamWKernel::foreach)), 0);
  }
}

// The control: libtorch's own C++ AdamW decays exp_avg with mul and add, not
// lerp, and so is not PyTorch's AdamW to the bit (why tandem has its own).
TEST(AdamWTest, LibtorchsAdamWIsNotBitIdenticalToPythons) {
  auto single = reference("{}", false);
  EXPECT_GT(differences(single, false,
                        [](std::vector<torch::optim::OptimizerParamGroup> groups, torch::optim::AdamWOptions options) {
                          return std::make_unique<torch::optim::AdamW>(std::move(groups), options);
                        }),
            0);
}

// A state saved and loaded midway (libtorch's archive, the keys of
// torch::optim::AdamW) continues exactly, for either kernel: the fused
// kernel's step tensors are remade from the loaded steps.
TEST(AdamWTest, AStateSavedMidwayContinuesExactly) {
  for (auto kernel : {AdamWKernel::foreach, AdamWKernel::fused}) {
    auto straight = make_parameters(), resumed = make_parameters();
    auto options = torch::optim::AdamWOptions(0.01).weight_decay(0.1);
    AdamW a(straight, options, kernel);
    auto b = std::make_unique<AdamW>(resumed, options, kernel);
    std::stringstream saved;
    for (int step = 0; step < kSteps; ++step) {
      if (step == 3) {
        torch::serialize::OutputArchive archive;
        b->save(archive);
        archive.save_to(saved);
        b = std::make_unique<AdamW>(resumed, options, kernel);
        torch::serialize::InputArchive in;
        in.load_from(saved);
        b->load(in);
      }
      fake_backward(straight, step);
      fake_backward(resumed, step);
      a.step();
      b->step();
    }
    for (size_t i = 0; i < straight.size(); ++i) EXPECT_TRUE(torch::equal(straight[i], resumed[i])) << i;
  }
}

TEST(AdamWTest, DecayGroupsDecayMatricesOnly) {
  torch::nn::Sequential net(torch::nn::Embedding(10, 4), torch::nn::LayerNorm(torch::nn::LayerNormOptions({4})),
                            torch::nn::Linear(4, 3));
  auto options = torch::optim::AdamWOptions(6e-4).betas({0.9, 0.95}).weight_decay(0.1);
  auto groups = decay_groups(net->named_parameters(), options);
  ASSERT_EQ(groups.size(), 2u);
  ASSERT_EQ(groups[0].params().size(), 2u);  // the embedding and the linear weight
  EXPECT_TRUE(groups[0].params()[0].is_same(net[0]->named_parameters()["weight"]));
  EXPECT_EQ(groups[1].params().size(), 3u);  // the norm's weight and bias, the linear bias
  const auto& decayed = static_cast<const torch::optim::AdamWOptions&>(groups[0].options());
  const auto& plain = static_cast<const torch::optim::AdamWOptions&>(groups[1].options());
  EXPECT_EQ(decayed.weight_decay(), 0.1);
  EXPECT_EQ(plain.weight_decay(), 0);
  EXPECT_EQ(plain.lr(), 6e-4);
  EXPECT_EQ(std::get<1>(plain.betas()), 0.95);
  AdamW optimizer(std::move(groups), options);  // the groups' own options win
  EXPECT_EQ(static_cast<const torch::optim::AdamWOptions&>(optimizer.param_groups()[1].options()).weight_decay(), 0);
}

TEST(AdamWTest, BadOptionsAreNamed) {
  auto p = make_parameters();
  EXPECT_THROW(AdamW(p, torch::optim::AdamWOptions(-1)), std::exception);
  try {
    AdamW(p, torch::optim::AdamWOptions(0.1).betas({0.9, 1.0}));
    FAIL() << "betas of 1 accepted";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("beta"), std::string::npos) << e.what();
  }
}

}  // namespace adamw_test
}  // namespace tandem::optim
