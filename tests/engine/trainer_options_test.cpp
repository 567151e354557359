// The Trainer's outputs and options: metrics lines, exported weights, and
// the flags it refuses by name.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <tuple>
#include <iterator>
#include <map>
#include <sstream>
#include <nlohmann/json.hpp>

#include <c10/util/Exception.h>
#include <caffe2/serialize/inline_container.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <cstring>
#include <torch/cuda.h>

#include "tandem/checkpoint/checkpoint.h"
#include "tandem/checkpoint/safetensors.h"
#include "tandem/engine/cuda_graph.h"
#include "tandem/engine/trainer.h"
#include "tandem/observe/metrics.h"
#include "tandem/observe/profile.h"
#include "tandem/util/check.h"
#include "testing.h"

#include "trainer_fixture.h"

namespace tandem::engine {
namespace {

using testing::TempDir;

TEST_F(TrainerTest, MetricsLinesAndExportedWeights) {
  TempDir out;
  auto o = small_run(data_.path());
  o.metrics_out = out.file("m.jsonl");
  o.export_weights = out.file("w.safetensors");
  Trainer trainer(o, nullptr);
  auto result = trainer.run();
  std::ifstream in(o.metrics_out);
  std::string line;
  int lines = 0;
  while (std::getline(in, line)) {
    auto j = nlohmann::json::parse(line);
    ++lines;
    EXPECT_EQ(j["epoch"], lines);
    EXPECT_EQ(j["step"], 8 * lines);
    EXPECT_EQ(j["world_size"], 1);
    for (const char* key : {"train_loss", "test_loss", "test_acc", "epoch_seconds", "images_per_second"}) {
      EXPECT_TRUE(j[key].is_number()) << key;
    }
    EXPECT_DOUBLE_EQ(j["test_acc"].get<double>(), result.epochs[lines - 1].test_acc);
  }
  EXPECT_EQ(lines, 2);
  auto file = checkpoint::read_safetensors(o.export_weights);
  auto state = state_of(trainer);
  expect_equal_states(file.tensors, state);

  // read_metrics gives the records back as the run returned them.
  auto records = observe::read_metrics(o.metrics_out);
  ASSERT_EQ(records.size(), 2u);
  for (size_t i = 0; i < records.size(); ++i) {
    const auto& a = records[i];
    const auto& b = result.epochs[i];
    EXPECT_EQ(a.epoch, b.epoch);
    EXPECT_EQ(a.step, b.step);
    EXPECT_DOUBLE_EQ(a.train_loss, b.train_loss);
    EXPECT_DOUBLE_EQ(a.test_acc, b.test_acc);
    EXPECT_DOUBLE_EQ(a.images_per_second, b.images_per_second);
    EXPECT_EQ(a.world_size, b.world_size);
    EXPECT_EQ(a.partial, b.partial);
    EXPECT_TRUE(a.evaluated);
  }
  std::ofstream(out.file("bad.jsonl")) << observe::to_json_line(records[0]) << "\n{\"epoch\": 2}\n";
  EXPECT_THROW(
      {
        try {
          observe::read_metrics(out.file("bad.jsonl"));
        } catch (const Error& e) {
          EXPECT_NE(std::string(e.what()).find("bad.jsonl:2: not a metrics record"), std::string::npos) << e.what();
          throw;
        }
      },
      Error);
  EXPECT_THROW(observe::read_metrics(out.file("missing.jsonl")), Error);

  // load_weights puts the exported weights into a fresh model of the same
  // flags, which then evaluates as the run did after its last epoch.
  Trainer fresh(small_run(data_.path()), nullptr);
  checkpoint::load_weights(o.export_weights, *fresh.model());
  expect_equal_states(state_of(fresh), state);
  auto eval = fresh.evaluate();
  EXPECT_EQ(eval.accuracy, result.epochs.back().test_acc);
  EXPECT_DOUBLE_EQ(eval.loss, result.epochs.back().test_loss);

  // --init-weights: a run that starts from them begins with these weights.
  auto warm = small_run(data_.path());
  warm.init_weights = o.export_weights;
  warm.seed = 99;  // another random initialisation, replaced
  Trainer started(warm, nullptr);
  expect_equal_states(state_of(started), state);
  warm.init_weights = out.file("absent.safetensors");
  try {
    Trainer t(warm, nullptr);
    ADD_FAILURE() << "started from a file that is not there";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "--init-weights: " + warm.init_weights + ": no such file (expected a safetensors file)");
  }

  // On --resume the checkpoint's weights replace them, and the run says so
  // (it used to be silent).
  TempDir checkpoints;
  auto checkpointed = small_run(data_.path());
  checkpointed.checkpoint_dir = checkpoints.path();
  checkpointed.max_steps = 2;
  Trainer(checkpointed, nullptr).run();
  checkpointed.resume = true;
  checkpointed.max_steps = 3;
  checkpointed.progress = ProgressMode::kLines;
  checkpointed.init_weights = o.export_weights;
  const std::string resumed = run_logged(checkpointed);
  EXPECT_NE(resumed.find("--init-weights " + o.export_weights + " is not used: the checkpoint's weights replace it"),
            std::string::npos) << resumed;

  // --init-weights-except: the head of a file made for 5 classes is left out
  // (fine-tuning), the rest loads; the head keeps the seed's initialisation.
  checkpoint::NamedTensors five_classes;
  for (const auto& [name, tensor] : file.tensors) {
    five_classes.emplace_back(name, name.rfind("fc2.", 0) == 0 ? tensor.narrow(0, 0, 5).clone() : tensor);
  }
  checkpoint::write_safetensors(out.file("five.safetensors"), five_classes);
  auto tuned = small_run(data_.path());
  tuned.init_weights = out.file("five.safetensors");
  try {
    Trainer strict(tuned, nullptr);
    ADD_FAILURE() << "loaded a head of another shape";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("tensor 'fc2."), std::string::npos) << e.what();
  }
  tuned.init_weights_except = "fc2";
  Trainer head_aside(tuned, nullptr);
  Trainer seeded(small_run(data_.path()), nullptr);
  auto loaded = state_of(head_aside), initial = state_of(seeded);
  for (size_t i = 0; i < loaded.size(); ++i) {
    bool head = loaded[i].first.rfind("fc2.", 0) == 0;
    EXPECT_TRUE(torch::equal(loaded[i].second, head ? initial[i].second : state[i].second)) << loaded[i].first;
  }
  tuned.init_weights_except = "fc3";
  try {
    Trainer misspelt(tuned, nullptr);
    ADD_FAILURE() << "accepted an --init-weights-except that names nothing";
  } catch (const UsageError& e) {  // the command line's mistake: exit 2
    EXPECT_NE(std::string(e.what()).find("--init-weights, --init-weights-except: 'fc3' names no parameter or "
                                         "buffer of the model"),
              std::string::npos)
        << e.what();
  }

  // Strict: a tensor missing, one too many, or one of another shape is named.
  auto expect_refused = [&](const checkpoint::NamedTensors& tensors, const std::string& why) {
    checkpoint::write_safetensors(out.file("other.safetensors"), tensors);
    Trainer target(small_run(data_.path()), nullptr);
    auto before = state_of(target);
    try {
      checkpoint::load_weights(out.file("other.safetensors"), *target.model());
      ADD_FAILURE() << "loaded: " << why;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(out.file("other.safetensors") + ": " + why), std::string::npos)
          << e.what();
    }
    expect_equal_states(state_of(target), before);  // nothing copied
  };
  checkpoint::NamedTensors missing(file.tensors.begin() + 1, file.tensors.end());
  expect_refused(missing, "no tensor for the model's");
  checkpoint::NamedTensors extra = file.tensors;
  extra.emplace_back("head.extra", torch::zeros({2}));
  expect_refused(extra, "tensor 'head.extra' is not a parameter or buffer of the model");
  checkpoint::NamedTensors reshaped = file.tensors;
  reshaped.back().second = torch::zeros({reshaped.back().second.numel() + 1});
  expect_refused(reshaped, "tensor '" + reshaped.back().first + "' has shape");
}

// Weights made with other settings that shape the model (Note [shape
// settings]): the tensor that does not fit is named, then the flag, from the
// file's metadata; a file without it gets the tensor alone.
TEST_F(TrainerTest, WeightsOfOtherShapeSettingsNameTheFlag) {
  TempDir out;
  auto expect_named = [&](const TrainOptions& made, TrainOptions used, const std::string& line) {
    Trainer maker(made, nullptr);
    checkpoint::write_safetensors(out.file("w.safetensors"), state_of(maker), maker.weights_metadata());
    checkpoint::write_safetensors(out.file("bare.safetensors"), state_of(maker));
    for (const std::string name : {"w.safetensors", "bare.safetensors"}) {
      used.init_weights = out.file(name);
      try {
        Trainer t(used, nullptr);
        ADD_FAILURE() << "loaded weights that do not fit: " << line;
      } catch (const UsageError& e) {
        ADD_FAILURE() << "a usage error: " << e.what();
      } catch (const Error& e) {
        const std::string message = e.what();
        EXPECT_EQ(message.rfind("--init-weights: " + out.file(name) + ": tensor '", 0), 0u) << message;
        EXPECT_NE(message.find("' has shape"), std::string::npos) << message;
        EXPECT_EQ(message.find('\n'), std::string::npos) << message;  // one line
        EXPECT_EQ(message.find("; --") != std::string::npos, name == "w.safetensors") << message;
        if (name == "w.safetensors") EXPECT_NE(message.find("; " + line), std::string::npos) << message;
      }
    }
  };
  auto o = small_run(data_.path());  // 28 x 28 images
  auto larger = o;
  larger.image_size = 32;
  expect_named(o, larger,
               "--image-size: the weights were made for 28 x 28 images (their metadata), this run's model for "
               "32 x 32 images");
  auto resnet = o;
  resnet.model = "resnet18";
  resnet.stem = "imagenet";
  auto automatic = resnet;
  automatic.stem = "auto";  // cifar for 28 px
  expect_named(resnet, automatic,
               "--stem: the weights were made for the imagenet stem (their metadata), this run's model for the "
               "cifar stem");
  auto mobile = o;
  mobile.model = "mobilenetv2";
  mobile.width_mult = 0.5;
  auto wide = mobile;
  wide.width_mult = 1;
  expect_named(mobile, wide,
               "--width-mult: the weights were made for --width-mult 0.5 (their metadata), this run's model for "
               "--width-mult 1");
}

TEST_F(TrainerTest, InvalidOptionsNameTheFlag) {
  auto o = small_run(data_.path());
  o.warmup_epochs = 5;
  try {
    Trainer t(o, nullptr);
    FAIL();
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "--warmup-epochs: expected [0, --epochs), got 5");
  }
  o = small_run(data_.path());
  o.device = "tpu";
  EXPECT_THROW(Trainer(o, nullptr), Error);
  o = small_run(data_.path());
  o.checkpoint_format = CheckpointFormat::kSharded;  // with nowhere to write
  refused(o, "--checkpoint-format sharded needs --checkpoint-dir (where the checkpoints go)");
  o = small_run(data_.path());
  o.resume = true;
  EXPECT_THROW(Trainer(o, nullptr), Error);
  // Values that used to run, ignored or wrong (a black-box sweep's finds).
  auto with = [&](const std::function<void(TrainOptions&)>& change) {
    auto changed = small_run(data_.path());
    change(changed);
    return changed;
  };
  refused(with([](auto& c) { c.min_lr = 1; }),
          "--min-lr 1: expected 0 to --lr (0.05), where the cosine schedule ends; --lr is its peak");
  refused(with([](auto& c) { c.lr = 1e300; }), "--lr 1e+300: beyond the largest float32 (3.40282e+38)");
  refused(with([](auto& c) { c.clip_grad_norm = 1e39; }), "--clip-grad-norm 1e+39: beyond the largest float32");
  refused(with([](auto& c) { c.width_mult = 2; }), "--width-mult 2 applies to --model mobilenetv2 only, not convnet");
  refused(with([](auto& c) { c.stem = "cifar"; }), "--stem cifar applies to the resnet models only, not convnet");
  refused(with([](auto& c) {
            c.strategy = Strategy::kPipeline;
            c.devices = "cpu,cpu";
            c.micro_batches = 65;
          }),
          "--micro-batches 65: more than the 64 samples each rank takes a step (--batch-size 64 over 1 data-parallel "
          "rank(s))");
  refused(with([](auto& c) { c.image_size = 8193; }), "--image-size: expected 1 to 8192 pixels");
  // What the options alone show is a usage error (the CLI's exit 2), also
  // checked by `tandem train --nproc-per-node` before any worker starts.
  EXPECT_THROW(Trainer(with([](auto& c) { c.momentum = 1; }), nullptr), UsageError);
  EXPECT_THROW(check_train_options(with([](auto& c) { c.profile_steps = "8:5"; })), UsageError);
  EXPECT_NO_THROW(check_train_ranks(small_run(data_.path()), 4));
  EXPECT_EQ(testing::error_of([&] { check_train_ranks(small_run(data_.path()), 3); }),
            "--batch-size 64: not divisible by the world size 3 (each data-parallel rank takes batch-size / 3 "
            "samples a step)");
  EXPECT_NO_THROW(check_train_ranks(with([](auto& c) { c.batch_per_process = 5; }), 3));
  EXPECT_EQ(testing::error_of([&] {
              check_train_ranks(with([](auto& c) {
                                  c.strategy = Strategy::kPipeline;
                                  c.micro_batches = 65;
                                }), 2);
            }),
            "--micro-batches 65: more than the 64 samples each rank takes a step (--batch-size 64 over 1 "
            "data-parallel rank(s)); each micro-batch needs at least one");
  // The flag the user gave names the share (a hostile run saw --batch-size named for --batch-per-process).
  EXPECT_EQ(testing::error_of([&] {
              check_train_ranks(with([](auto& c) {
                                  c.batch_per_process = 2;
                                  c.grad_accum = 3;
                                }), 2);
            }),
            "--grad-accum 3: more chunks than the 2 samples each rank takes a step (--batch-per-process 2)");
  // --export-weights is checked when run() starts, before the first step.
  EXPECT_EQ(testing::error_of([&] { Trainer(with([](auto& c) { c.export_weights = "/no/such/folder/w.st"; }), nullptr).run(); }),
            "--export-weights /no/such/folder/w.st: /no/such/folder is not a folder this process can write to");
  EXPECT_EQ(testing::error_of([&] { Trainer(with([&](auto& c) { c.export_weights = data_.path(); }), nullptr).run(); }),
            "--export-weights " + data_.path() + ": is a folder; expected a file name");
  refused(with([&](auto& c) { c.metrics_out = "m-{rank}.jsonl"; }),
          "--metrics-out m-{rank}.jsonl: one file for the job (rank 0 writes the figures summed over the ranks); "
          "{rank} applies to --export-weights and --profile-out");
  // Two output flags on one file (the weights used to overwrite the metrics, exit 0).
  TempDir outputs;
  refused(with([&](auto& c) {
            c.metrics_out = outputs.file("same.out");
            c.export_weights = outputs.path() + "/./same.out";
          }),
          "--metrics-out " + outputs.file("same.out") + " and --export-weights " + outputs.path() +
              "/./same.out name the same file: each needs its own");
  refused(with([&](auto& c) {
            c.profile_out = outputs.file("t.json");
            c.export_weights = outputs.file("t.json");
          }),
          "--export-weights " + outputs.file("t.json") + " and --profile-out " + outputs.file("t.json") + " name the same file");
  // A device or FIFO would be replaced by the rename: refused, left as it was
  // (a copy of /dev/null made with mknod; --export-weights /dev/null, as
  // root, used to replace the system's). A link to a regular file is kept,
  // and the file it points to is written.
  TempDir special;
  const std::string null_copy = special.file("null"), fifo = special.file("fifo");
  ASSERT_EQ(::mknod(null_copy.c_str(), S_IFCHR | 0666, ::makedev(1, 3)), 0) << std::strerror(errno);
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0666), 0);
  for (const auto& path : {null_copy, fifo}) {
    auto o = with([&](auto& c) {
      c.export_weights = path;
      c.max_steps = 1;
    });
    EXPECT_EQ(testing::error_of([&] { Trainer(o, nullptr).run(); }),
              "--export-weights " + path + ": is " + (path == fifo ? "a FIFO" : "a character device") +
                  ", not a regular file; this file is written whole and renamed into place, which would replace "
                  "it: name a regular file");
    EXPECT_FALSE(std::filesystem::is_regular_file(path));
  }
  std::ofstream(special.file("real.st")) << "old";
  std::filesystem::create_symlink(special.file("real.st"), special.file("link.st"));
  Trainer(with([&](auto& c) {
            c.export_weights = special.file("link.st");
            c.max_steps = 1;
          }),
          nullptr)
      .run();
  EXPECT_TRUE(std::filesystem::is_symlink(special.file("link.st")));
  EXPECT_GT(std::filesystem::file_size(special.file("real.st")), 1000u);
}

// Note [loading in place]: a resumed run copies the checkpoint into the
// model's own tensors (the same storage before and after, so aliases such as
// DDP's gradient views hold) and ends with the weights that were saved. A
// run resumed at --max-steps trains no further and writes nothing new.

TEST_F(TrainerTest, OutOfRangeNumbersAreRefusedByName) {
  auto message = [&](auto change) {
    auto o = small_run(data_.path());
    change(o);
    try {
      Trainer t(o, nullptr);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("<no error>");
  };
  EXPECT_EQ(message([](TrainOptions& o) { o.workers = 5000; }), "--workers: expected 0 to 1024, got 5000");
  EXPECT_EQ(message([](TrainOptions& o) { o.dist_timeout = 1e16; }),
            "--dist-timeout: expected a positive number of seconds up to a week (604800), got 1e+16");
  EXPECT_EQ(message([](TrainOptions& o) { o.bucket_cap_mb = 1e30; }),
            "--bucket-cap-mb: expected a positive size up to 1e6 MiB, got 1e+30");
}

}  // namespace
}  // namespace tandem::engine
