// examples/pipeline.cpp: a model cut into stages on devices, with
// micro-batches so that the stages work at once (PyTorch's split_size
// loop, generalised).
//
//   ./pipeline --devices cpu,cpu --micro-batches 4 --schedule 1f1b
//   ./pipeline --devices cuda:0,cuda:1 --schedule gpipe
//
// The model's layers are cut into one stage per device, balanced by
// parameter count. Every step cuts the batch into --micro-batches pieces;
// stage s runs a piece's forward as soon as stage s - 1 has passed it on,
// and its backward once stage s + 1 has passed the gradient back, in the
// order the schedule gives (GPipe: all forwards, then all backwards; 1F1B:
// alternating, so fewer pieces are held at once). The gradients sum over
// the pieces into the model's parameters: the step is the whole batch's.
// A copy of the model trained without the pipeline is the reference: the
// program prints how far the two ended apart and fails above 1e-5
// (relative). It also prints the last step's idle share per stage beside
// the textbook bubble, (p - 1) / (m + p - 1): on a model this small the
// hand-offs between stages outweigh the work, so the stages idle far more.
#include <cstdio>
#include <memory>

#include "example.h"

int main(int argc, char** argv) {
  return example::run("pipeline", [&] {
    std::string device_list = "cpu,cpu", schedule = "1f1b";
    int64_t micro_batches = 4, epochs = 4;
    tandem::cli::FlagSet flags("pipeline", "a model cut into stages over devices, with micro-batches");
    flags.add_string("devices", "LIST", &device_list, "one stage per device, e.g. cpu,cpu or cuda:0,cuda:1");
    flags.add_int("micro-batches", "M", &micro_batches, "pieces each batch is cut into", 1);
    flags.add_choice("schedule", &schedule, {"gpipe", "1f1b"}, "the order of the pieces' forwards and backwards");
    flags.add_int("epochs", "N", &epochs, "epochs to train", 1);
    if (!example::parse_flags(flags, argc, argv)) return 0;
    const auto devices = tandem::parallel::parse_devices(device_list);

    auto data = example::regression_data();
    torch::manual_seed(0);
    tandem::models::Sequence model;
    model->push_back("fc1", torch::nn::Linear(8, 64));
    model->push_back("act1", torch::nn::Tanh());
    model->push_back("fc2", torch::nn::Linear(64, 64));
    model->push_back("act2", torch::nn::Tanh());
    model->push_back("fc3", torch::nn::Linear(64, 64));
    model->push_back("act3", torch::nn::Tanh());
    model->push_back("out", torch::nn::Linear(64, 1));
    auto plain = std::dynamic_pointer_cast<tandem::models::SequenceImpl>(model->clone());  // the reference

    auto sizes = tandem::parallel::balance_stages(tandem::parallel::parameter_costs(model),
                                                  static_cast<int64_t>(devices.size()));
    std::printf("stages: %s\n", tandem::parallel::describe_split(model, sizes).c_str());
    tandem::parallel::PipelineOptions options;
    options.micro_batches = micro_batches;
    options.schedule = schedule;
    tandem::parallel::Pipeline pipe(model, sizes, devices, options);  // moves each stage to its device

    torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
    torch::optim::SGD sgd_plain(plain->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
    auto mse = [](const torch::Tensor& output, const torch::Tensor& target) {
      return torch::mse_loss(output, target);
    };
    tandem::parallel::PipelineStep step;
    for (int64_t epoch = 0; epoch < epochs; ++epoch) {
      double loss_sum = 0;
      int64_t steps = 0;
      for (int64_t start = 0; start < data.x.size(0); start += 64) {
        auto xb = data.x.narrow(0, start, 64), yb = data.y.narrow(0, start, 64);
        sgd.zero_grad();
        step = pipe.train_step(xb, yb, mse);  // forwards and backwards of the micro-batches
        sgd.step();
        sgd_plain.zero_grad();
        mse(plain->forward(xb), yb).backward();
        sgd_plain.step();
        loss_sum += step.loss.item<double>();
        ++steps;
      }
      std::printf("epoch %lld: loss %.6f\n", static_cast<long long>(epoch + 1), loss_sum / steps);
    }

    const double p = static_cast<double>(devices.size()), m = static_cast<double>(step.micro_batches);
    std::printf("last step: %lld micro-batches, idle share per stage", static_cast<long long>(step.micro_batches));
    for (double idle : step.idle_share()) std::printf(" %.2f", idle);
    std::printf(" (textbook %.2f)\n", (p - 1) / (m + p - 1));
    double difference = example::relative_difference(*plain, *model);
    std::printf("%s over %zu stages: %s; largest difference from the model without a pipeline: %.3g\n",
                options.schedule.c_str(), devices.size(), example::checksum(*model).c_str(), difference);
    TANDEM_CHECK(difference <= 1e-5, "the pipeline's weights differ from one device's by ", difference,
                 " (relative), more than 1e-5");
    return 0;
  });
}
