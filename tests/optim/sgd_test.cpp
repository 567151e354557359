#include <gtest/gtest.h>
#include <torch/torch.h>

#include <sstream>

#include "tandem/optim/schedule.h"
#include "tandem/optim/sgd.h"
#include "tandem/util/check.h"

namespace tandem::optim {
namespace sgd_test {  // the file's own names (a layer's tests compile as one unit)

// Parameters of two dtypes (two foreach groups), one of which gets no
// gradient on odd steps.
std::vector<torch::Tensor> make_parameters() {
  torch::manual_seed(7);
  return {torch::randn({5, 3}).requires_grad_(), torch::randn({3}).requires_grad_(),
          torch::randn({4, 2}, torch::kFloat64).requires_grad_(), torch::randn({2, 2}).requires_grad_()};
}

void fake_backward(std::vector<torch::Tensor>& params, int step) {
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < params.size(); ++i) {
    if (i == 3 && step % 2 == 1) {
      params[i].mutable_grad() = torch::Tensor();
      continue;
    }
    params[i].mutable_grad() = torch::sin(params[i] * (step + 1) + static_cast<double>(i)).detach();
  }
}

void expect_same_steps(const torch::optim::SGDOptions& options) {
  auto ours = make_parameters(), theirs = make_parameters();
  Sgd sgd(ours, options);
  torch::optim::SGD reference(theirs, options);
  for (int step = 0; step < 6; ++step) {
    set_lr(sgd, options.lr() / (step + 1));
    set_lr(reference, options.lr() / (step + 1));
    fake_backward(ours, step);
    fake_backward(theirs, step);
    sgd.step();
    reference.step();
    for (size_t i = 0; i < ours.size(); ++i) {
      ASSERT_TRUE(torch::equal(ours[i], theirs[i])) << "parameter " << i << " after step " << step;
    }
  }
}

TEST(SgdTest, BitIdenticalToLibtorchSgdOnTheCpu) {
  expect_same_steps(torch::optim::SGDOptions(0.1));
  expect_same_steps(torch::optim::SGDOptions(0.1).momentum(0.9).weight_decay(5e-4));
  expect_same_steps(torch::optim::SGDOptions(0.05).momentum(0.9).nesterov(true).weight_decay(1e-3));
  expect_same_steps(torch::optim::SGDOptions(0.05).momentum(0.5).dampening(0.1));
}

// Note [learning rate in a tensor]: the tensor path reads the rate set_lr()
// wrote, from the first step on (which makes the momentum buffers, as
// CudaGraphStep's eager warm-up does); up to rounding of -lr * d before the
// add: at most half an ulp of lr * d a step (|lr * d| < 1 here, so 6e-8),
// well inside an absolute bound of 1e-6 over five steps. Fifty seeded draws of
// the parameters (an unseeded draw once landed a value near 0, where a
// bound of 1e-7 was too tight).
TEST(SgdTest, LearningRateTensorFollowsSetLr) {
  auto options = torch::optim::SGDOptions(0.1).momentum(0.9).weight_decay(5e-4);
  for (int seed = 0; seed < 50; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    torch::manual_seed(seed);
    std::vector<torch::Tensor> ours = {torch::randn({6, 4}).requires_grad_(), torch::randn({4}).requires_grad_()};
    std::vector<torch::Tensor> theirs;
    for (auto& p : ours) theirs.push_back(p.detach().clone().requires_grad_());
    Sgd sgd(ours, options);
    sgd.use_lr_tensor();
    torch::optim::SGD reference(theirs, options);
    for (int step = 0; step < 5; ++step) {
      set_lr(sgd, 0.1 * (5 - step));
      set_lr(reference, 0.1 * (5 - step));
      fake_backward(ours, step);
      fake_backward(theirs, step);
      sgd.step();
      reference.step();
      for (size_t i = 0; i < ours.size(); ++i) {
        ASSERT_TRUE(torch::allclose(ours[i], theirs[i], /*rtol=*/1e-6, /*atol=*/1e-6))
            << "step " << step << ", largest difference "
            << (ours[i] - theirs[i]).abs().max().item<double>();
      }
    }
    EXPECT_TRUE(sgd.has_lr_tensor());
  }
}

// Once the state is frozen (a capture begins), a parameter that never had a
// gradient cannot get a momentum buffer; one that has its buffer steps on.
TEST(SgdTest, FrozenStateRefusesANewMomentumBuffer) {
  std::vector<torch::Tensor> params = {torch::randn({3}).requires_grad_(), torch::randn({2}).requires_grad_()};
  Sgd sgd(params, torch::optim::SGDOptions(0.1).momentum(0.9));
  sgd.use_lr_tensor();
  params[0].mutable_grad() = torch::ones({3});
  sgd.step();  // the first parameter's buffer
  sgd.freeze_state();
  EXPECT_TRUE(sgd.state_frozen());
  auto before = params[0].detach().clone();
  sgd.step();
  EXPECT_FALSE(torch::equal(before, params[0]));
  params[1].mutable_grad() = torch::ones({2});
  try {
    sgd.step();
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no momentum buffer yet, and the state is frozen"), std::string::npos)
        << e.what();
  }
}

// The momentum buffers live where libtorch's SGD keeps them: a saved state
// loads into either class and the next steps agree.
TEST(SgdTest, StateLoadsIntoLibtorchSgdAndBack) {
  auto options = torch::optim::SGDOptions(0.1).momentum(0.9);
  auto ours = make_parameters(), theirs = make_parameters();
  Sgd sgd(ours, options);
  fake_backward(ours, 0);
  sgd.step();
  {
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < ours.size(); ++i) theirs[i].copy_(ours[i]);
  }
  std::stringstream stream;
  {
    torch::serialize::OutputArchive archive;
    sgd.save(archive);
    archive.save_to(stream);
  }
  torch::optim::SGD reference(theirs, options);
  torch::serialize::InputArchive archive;
  archive.load_from(stream);
  reference.load(archive);
  for (int step = 1; step < 4; ++step) {
    fake_backward(ours, step);
    fake_backward(theirs, step);
    sgd.step();
    reference.step();
  }
  for (size_t i = 0; i < ours.size(); ++i) EXPECT_TRUE(torch::equal(ours[i], theirs[i])) << i;
}

}  // namespace sgd_test
}  // namespace tandem::optim
