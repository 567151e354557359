// A model's loss and accuracy on a data set (evaluate.h).
#include "tandem/engine/evaluate.h"

#include "tandem/data/device_prefetcher.h"
#include "tandem/data/loader.h"
#include "tandem/data/sampler.h"
#include "tandem/models/registry.h"
#include "tandem/util/arith.h"
#include "trainer_internal.h"

namespace tandem::engine {

EvalResult evaluate(models::Sequence& model, const data::Dataset& dataset, int64_t batch_size,
                    const torch::Device& device, int64_t workers, dist::ProcessGroup* group,
                    const Forward& forward, const Task* task, const SequenceCut& cut) {
  torch::NoGradGuard no_grad;
  // Note [evaluation batches of tokens]: a language model's windows are
  // evaluated at least kEvalTokens tokens a forward, more windows than
  // batch_size where they are short. Each forward costs its operators'
  // dispatch and, on the CPU, an OpenMP fork and join per operator:
  // 3,788 forwards of 8 one-token windows took 15.8 s on 2 cores (84% of it
  // spinning threads), 119 of 256 took 1.3 s. The loss and accuracy are
  // sums over windows, the same whatever the grouping.
  constexpr int64_t kEvalTokens = 2048;
  if (const int64_t seq_len = dataset.info().seq_len; seq_len > 0) {
    batch_size = std::max(batch_size, ceil_div(kEvalTokens, seq_len));
  }
  static const auto classification = classification_task();
  if (task == nullptr) task = classification.get();
  bool was_training = model->is_training();
  model->eval();
  std::shared_ptr<const data::Sampler> sampler;
  // The ranks that read other samples (a run of cut.copies reads the same).
  const int64_t ranks = group != nullptr ? group->size() / cut.copies : 1;
  const int64_t rank = group != nullptr ? group->rank() / cut.copies : 0;
  if (ranks > 1) {
    std::vector<int64_t> mine;  // r, r + W, ...: every sample once over the ranks
    for (int64_t i = rank; i < dataset.size(); i += ranks) mine.push_back(i);
    sampler = std::make_shared<data::SubsetSampler>(std::move(mine));
  } else {
    sampler = std::make_shared<data::SequentialSampler>(dataset.size());
  }
  data::DataLoader loader(std::shared_ptr<const data::Dataset>(&dataset, [](auto*) {}), sampler,
                          internal::loader_options(batch_size, workers, device));
  data::DevicePrefetcher batches(loader.epoch(0), data::PrefetchOptions{device, models::parameter_dtype(*model)});
  auto loss_sum = torch::zeros({}, torch::TensorOptions().dtype(torch::kFloat64).device(device));
  auto correct = torch::zeros({}, torch::TensorOptions().dtype(torch::kInt64).device(device));
  int64_t count = 0, predictions = 0;  // samples; the task's predictions (rows, or tokens)
  // Every rank calls `forward` as often as the rank with the most batches
  // (rank 0, whose share is the largest): a forward with collectives in it
  // (FSDP's all-gathers) must not leave a rank waiting for one more call.
  int64_t calls = 0;
  const int64_t most = ceil_div(dataset.size(), ranks);
  const int64_t batches_of_the_most = ceil_div(most, batch_size);
  auto empty_input = [&] {
    const auto info = dataset.info();
    if (info.seq_len > 0) {  // token ids
      return torch::zeros({0, info.seq_len}, torch::TensorOptions().dtype(torch::kInt64).device(device));
    }
    return torch::zeros({0, info.channels, info.height, info.width},
                        torch::TensorOptions().dtype(models::parameter_dtype(*model)).device(device));
  };
  while (auto batch = batches.next()) {
    ++calls;
    if (batch->size() == 0) {  // every image of it was unreadable
      if (forward) forward(empty_input());
      continue;
    }
    const auto inputs = cut.part ? cut.part(batch->inputs) : batch->inputs;
    const auto targets = cut.part ? cut.part(batch->targets) : batch->targets;
    auto logits = forward ? forward(inputs) : model->forward(inputs);
    if (!logits.defined()) continue;  // the output is another rank's (a pipeline's last stage)
    // Under --amp the logits are bf16 or fp16: scored in float32, as
    // autocast runs the training loss (a bf16 sum over a batch's tokens
    // kept 3 digits: a test loss of 4.8889 for 4.8724).
    if (logits.is_floating_point() && logits.element_size() < 4) logits = logits.to(torch::kFloat32);
    loss_sum += task->summed_loss(logits, targets);
    correct += task->hits(logits, targets);
    count += batch->size();
    predictions += targets.numel();
  }
  for (; forward && calls < batches_of_the_most; ++calls) forward(empty_input());
  model->train(was_training);
  // Summed over the ranks on the device (NCCL takes CUDA tensors only).
  auto sums = torch::stack({loss_sum, correct.to(torch::kFloat64),
                            torch::full({}, static_cast<double>(count), loss_sum.options()),
                            torch::full({}, static_cast<double>(predictions), loss_sum.options())});
  if (group != nullptr && group->size() > 1) group->all_reduce(sums).wait();
  sums = sums.cpu();
  double loss = sums[0].item<double>(), hits = sums[1].item<double>();
  const double total = sums[2].item<double>() / static_cast<double>(cut.copies);  // each sample's copies counted it
  const double predicted = sums[3].item<double>();
  if (total == 0) return {};
  return {loss / predicted, hits / predicted, static_cast<int64_t>(total)};
}

}  // namespace tandem::engine
