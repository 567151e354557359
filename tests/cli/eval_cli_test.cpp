// tandem eval from the weights alone (Note [eval from the weights] in
// src/cli/eval_command.cpp): the export's metadata gives the model, the
// data, the preset and the sizes, and the evaluation is the run's own.
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tandem/checkpoint/safetensors.h"
#include "testing.h"

namespace tandem {
namespace {

using testing::run_tandem;
using testing::TempDir;

// The printed test loss of a `tandem eval` output; NaN if none.
double printed_loss(const std::string& output) {
  const auto at = output.find("test loss ");
  return at == std::string::npos ? std::nan("") : std::atof(output.c_str() + at + 10);
}

std::string printed_accuracy(const nlohmann::json& metrics) {
  char text[64];
  std::snprintf(text, sizeof text, "test accuracy %.2f%%", 100 * metrics["test_acc"].get<double>());
  return text;
}

// Fashion-MNIST (the Debian package's files): `tandem eval --weights W`
// with nothing else, and with --val-data, gives the run's last test loss
// and accuracy; the model was not named either.
TEST(EvalCliTest, FashionMnistWeightsAloneGiveTheRunsFigures) {
  TempDir dir;
  auto r = run_tandem("train --data fashion-mnist --model mlp --epochs 1 --max-steps 30 --batch-size 64 "
                      "--progress off --metrics-out " + dir.file("m.jsonl") + " --export-weights " +
                      dir.file("w.safetensors"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto metrics = testing::last_metrics(dir.file("m.jsonl"));
  for (const std::string more : {"", " --val-data fashion-mnist"}) {
    r = run_tandem("eval --weights " + dir.file("w.safetensors") + more);
    ASSERT_EQ(r.exit_code, 0) << more << "\n" << r.output;
    EXPECT_NE(r.output.find("mlp from " + dir.file("w.safetensors") + " on fashion-mnist: "), std::string::npos)
        << r.output;
    EXPECT_NE(r.output.find(printed_accuracy(metrics) + " (10000 images)"), std::string::npos) << r.output;
    EXPECT_NEAR(printed_loss(r.output), metrics["test_loss"].get<double>(), 6e-5) << r.output;
    EXPECT_EQ(r.output.find("warning"), std::string::npos) << r.output;
  }
}

class EvalImageFolderCliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    testing::write_synthetic_image_folder(dir_.file("train"), 3, 12, 40);
    testing::write_synthetic_image_folder(dir_.file("val"), 3, 8, 40);
  }
  // Trains on train/, evaluating on val/ after its epoch; the last metrics.
  nlohmann::json train(const std::string& flags, const std::string& weights) {
    auto r = run_tandem("train --data imagefolder:" + dir_.file("train") + " --val-data imagefolder:" +
                        dir_.file("val") + " --model convnet --image-size 32 --epochs 1 --batch-size 12 --lr 0.05 "
                        "--progress off --metrics-out " + dir_.file("m.jsonl") + " --export-weights " + weights +
                        flags);
    EXPECT_EQ(r.exit_code, 0) << r.output;
    return testing::last_metrics(dir_.file("m.jsonl"));
  }
  std::string eval(const std::string& weights, const std::string& flags = "") {
    auto r = run_tandem("eval --weights " + weights + " --val-data imagefolder:" + dir_.file("val") + flags);
    EXPECT_EQ(r.exit_code, 0) << flags << "\n" << r.output;
    return r.output;
  }
  TempDir dir_;
};

// The default preset (imagenet: Resize then CenterCrop for evaluation) and
// --augment none (a plain resize): each run's weights with --val-data alone
// give that run's figures. The control: evaluating the none run's weights
// with the imagenet preset's transform gives another loss, and says so.
TEST_F(EvalImageFolderCliTest, TheWeightsAndValDataGiveTheRunsFigures) {
  const std::string preset = dir_.file("preset.safetensors"), plain = dir_.file("plain.safetensors");
  for (const auto& [flags, weights] : {std::pair<std::string, std::string>{"", preset}, {" --augment none", plain}}) {
    const auto metrics = train(flags, weights);
    const std::string out = eval(weights);
    EXPECT_NE(out.find(printed_accuracy(metrics) + " (24 images)"), std::string::npos) << flags << "\n" << out;
    EXPECT_NEAR(printed_loss(out), metrics["test_loss"].get<double>(), 6e-5) << flags << "\n" << out;
    EXPECT_EQ(out.find("warning"), std::string::npos) << out;
  }
  const std::string want = eval(plain);
  const std::string other = eval(plain, " --augment imagenet");
  EXPECT_NE(other.find("tandem: warning: --augment imagenet: " + plain + " was trained with --augment none (its "
                       "metadata); evaluating with the --augment given"),
            std::string::npos) << other;
  EXPECT_GT(std::abs(printed_loss(other) - printed_loss(want)), 1e-4) << "the control: another transform\n" << other;
}

// The training folder gone (evaluated on another machine): its classes and
// statistics are in the metadata, so --val-data alone still evaluates; for
// IDX, whose statistics come from its training images, the missing folder
// is named.
TEST_F(EvalImageFolderCliTest, AMissingTrainingFolderIsReplacedOrNamed) {
  const std::string weights = dir_.file("w.safetensors");
  const auto metrics = train("", weights);
  std::filesystem::rename(dir_.file("train"), dir_.file("elsewhere"));
  const std::string out = eval(weights);
  EXPECT_NE(out.find(printed_accuracy(metrics)), std::string::npos) << out;

  TempDir idx;
  testing::write_synthetic_idx(idx.path(), 256, 64);
  auto r = run_tandem("train --data idx:" + idx.path() + " --model mlp --epochs 1 --max-steps 2 --progress off "
                      "--export-weights " + dir_.file("idx.safetensors"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::filesystem::rename(idx.path(), idx.path() + "-moved");
  r = run_tandem("eval --weights " + dir_.file("idx.safetensors"));
  std::filesystem::rename(idx.path() + "-moved", idx.path());
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find(": trained on --data idx:" + idx.path() + " (its metadata), which is nothing here; give "
                          "--data: the training data (its statistics normalise the inputs)"),
            std::string::npos) << r.output;
}

// Flags that only some models take are accepted where they match the
// metadata's model; a model given that is not the metadata's is refused as
// such (exit 1), not for the metadata's settings; a value in the metadata
// that tandem cannot use is the file's fault (exit 1, the file named); a
// --data that is not the recorded one is said.
TEST_F(EvalImageFolderCliTest, FlagsAndMetadataThatDisagreeAreSaidOrRefused) {
  const std::string resnet = dir_.file("resnet.safetensors"), mobilenet = dir_.file("mobilenet.safetensors");
  train(" --model resnet18 --max-steps 1", resnet);
  train(" --model mobilenetv2 --width-mult 0.5 --max-steps 1", mobilenet);
  const auto file = checkpoint::read_safetensors(resnet);
  std::string out = eval(resnet, " --stem " + file.metadata.at("stem"));
  EXPECT_EQ(out.find("warning"), std::string::npos) << out;
  out = eval(mobilenet, " --width-mult 0.5");
  EXPECT_EQ(out.find("warning"), std::string::npos) << out;
  EXPECT_TRUE(testing::tandem_fails("eval --weights " + resnet + " --val-data imagefolder:" + dir_.file("val") +
                                        " --model convnet",
                                    2, "--model convnet: " + resnet + " holds the weights of resnet18 (its metadata)"));
  out = eval(resnet, " --data imagefolder:" + dir_.file("val"));
  EXPECT_NE(out.find("tandem: warning: --data imagefolder:" + dir_.file("val") + ": " + resnet +
                     " was trained with --data imagefolder:" + dir_.file("train") + " (its metadata)"),
            std::string::npos) << out;
  const struct {
    const char* key;
    const char* value;
    std::string message;
  } edits[] = {
      {"model", "nosuch", ": its metadata describes a run tandem cannot evaluate: --model: expected one of"},
      {"image_size", "99999999999999999999", ": its metadata's image_size '99999999999999999999' is not a whole "
                                             "number of pixels"},
      {"image_size", "100000", ": its metadata describes a run tandem cannot evaluate: --image-size"},
      {"stem", "garbage", ": its metadata describes a run tandem cannot evaluate"},
      {"num_classes", "x", ": its metadata's num_classes 'x' is not a number of classes"},
  };
  for (const auto& edit : edits) {
    auto metadata = file.metadata;
    metadata[edit.key] = edit.value;
    const std::string edited = dir_.file(std::string("edited-") + edit.key + ".safetensors");
    checkpoint::write_safetensors(edited, file.tensors, metadata);
    EXPECT_TRUE(testing::tandem_fails("eval --weights " + edited + " --val-data imagefolder:" + dir_.file("val"), 1,
                                      edited + edit.message))
        << edit.key << " " << edit.value;
  }
}

}  // namespace
}  // namespace tandem
