// The checkpoint file on its own (Checkpointer): fingerprints, the checks
// between a file and libtorch's reader, the files that count.
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

TEST(CheckpointTest, FieldsThatMayChangeAreLeftOutOfTheComparison) {
  EXPECT_EQ(checkpoint::without_fields("model=mlp lr=0.1 world=2 seed=3", {"world"}), "model=mlp lr=0.1 seed=3");
  EXPECT_EQ(checkpoint::without_fields("model=mlp world=2", {}), "model=mlp world=2");
  EXPECT_EQ(checkpoint::without_fields("world=2 worldly=1 x=world=2", {"world"}), "worldly=1 x=world=2");
  EXPECT_EQ(checkpoint::fingerprint_field("worldly=1 world=2 x=world=3", "world"), "2");
  EXPECT_EQ(checkpoint::fingerprint_field("model=mlp", "world"), std::nullopt);
  // A --data path with spaces is one value (one word of it that looks like
  // KEY=VALUE, such as "/a world=3", would still start a field).
  const std::string spaced = "data=idx:/my data/Fashion MNIST world=2";
  EXPECT_EQ(checkpoint::fingerprint_field(spaced, "data"), "idx:/my data/Fashion MNIST");
  EXPECT_EQ(checkpoint::fingerprint_field(spaced, "world"), "2");
  EXPECT_EQ(checkpoint::without_fields(spaced, {"world"}), "data=idx:/my data/Fashion MNIST");

  TempDir dir;
  torch::manual_seed(1);
  torch::nn::Linear model(3, 2);
  torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.1));
  checkpoint::Checkpointer plain({dir.path()});
  auto path = plain.save(checkpoint::TrainPosition{}, *model, sgd, "model=linear lr=0.1 world=2");
  checkpoint::Checkpointer elastic({dir.path(), 2, {"world"}});
  auto position = elastic.load(path, *model, sgd, "model=linear lr=0.1 world=4");
  EXPECT_EQ(position.fingerprint, "model=linear lr=0.1 world=2");
  EXPECT_THROW(plain.load(path, *model, sgd, "model=linear lr=0.1 world=4"), Error);
  EXPECT_THROW(elastic.load(path, *model, sgd, "model=linear lr=0.2 world=2"), Error);
}

// The refusal of a checkpoint written under other settings names the fields
// that differ, not only the two fingerprints.
TEST(CheckpointTest, FingerprintDifferencesNameTheFields) {
  EXPECT_EQ(checkpoint::fingerprint_differences("model=mlp lr=0.1 world=2", "model=mlp lr=0.1 world=4", {"world"}), "");
  EXPECT_EQ(checkpoint::fingerprint_differences("model=mlp lr=0.1 batch=32 world=2", "model=convnet lr=0.1 batch=64 world=4",
                                    {"world"}),
            "model=mlp in the checkpoint, model=convnet in this run, batch=32 in the checkpoint, "
            "batch=64 in this run");
  EXPECT_EQ(checkpoint::fingerprint_differences("model=mlp", "model=mlp clip=1", {}), "no clip in the checkpoint, clip=1 in this run");
  EXPECT_EQ(checkpoint::fingerprint_differences("data=idx:/a b model=mlp", "data=idx:/a c model=mlp", {}),
            "data=idx:/a b in the checkpoint, data=idx:/a c in this run");

  TempDir dir;
  torch::nn::Linear model(3, 2);
  torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.1));
  checkpoint::Checkpointer checkpointer({dir.path()});
  auto path = checkpointer.save(checkpoint::TrainPosition{}, *model, sgd, "model=linear lr=0.1");
  EXPECT_EQ(testing::error_of([&] { checkpointer.load(path, *model, sgd, "model=linear lr=0.2"); }),
            "cannot resume from " + path + ": it was written by a run with other settings (lr=0.1 in the "
            "checkpoint, lr=0.2 in this run); resume with the checkpoint's settings, or train afresh in "
            "another --checkpoint-dir (the checkpoint's: model=linear lr=0.1; this run's: model=linear lr=0.2)");
}

// A checkpoint's zip archive (without the trailer) with every record passed
// through `edit`, sealed again: a file whose CRC holds, as a tampered one's would.
std::string rewritten_checkpoint(const std::string& path,
                                 const std::function<void(const std::string&, std::string&)>& edit) {
  std::string sealed = testing::read_text(path);
  std::istringstream zip(sealed.substr(0, sealed.size() - 20));  // Note [checkpoint trailer]: 20 bytes
  caffe2::serialize::PyTorchStreamReader reader(&zip);
  std::string out;
  caffe2::serialize::PyTorchStreamWriter writer([&](const void* data, size_t size) {
    out.append(static_cast<const char*>(data), size);
    return size;
  });
  for (const auto& name : reader.getAllRecords()) {
    // The writer's own records, written at its end.
    if (name == "version" || name == "byteorder" || name.rfind(".data/", 0) == 0) continue;
    auto [data, size] = reader.getRecord(name);
    std::string bytes(static_cast<const char*>(data.get()), size);
    edit(name, bytes);
    writer.writeRecord(name, bytes.data(), bytes.size());
  }
  writer.writeEndOfFile();
  return checkpoint::seal_checkpoint(out);
}

// A checkpoint of a Linear(3, 2) with momentum, saved in `dir`.
struct SavedLinear {
  explicit SavedLinear(const TempDir& dir) : checkpointer({dir.path()}) {
    model->forward(torch::ones({1, 3})).sum().backward();
    sgd.step();  // momentum buffers to save
    path = checkpointer.save(checkpoint::TrainPosition{}, *model, sgd, "model=linear");
  }
  // The message of the error loading `file` throws; a test failure if none.
  std::string load_error(const std::string& file) {
    return testing::error_of([&] { checkpointer.load(file, *model, sgd, "model=linear"); });
  }
  torch::nn::Linear model{3, 2};
  torch::optim::SGD sgd{model->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9)};
  checkpoint::Checkpointer checkpointer;
  std::string path;
};

// Replaces the first `from` in `bytes` by `to`; fails the test when absent.
void replace_first(std::string& bytes, const std::string& from, const std::string& to) {
  auto at = bytes.find(from);
  ASSERT_NE(at, std::string::npos);
  bytes.replace(at, from.size(), to);
}

// libtorch's unpickler makes a storage as long as data.pkl declares around
// whatever its record holds: a record cut short (with a matching CRC: a
// tampered file) was read past its end, NaN weights or a crash. Refused
// before libtorch reads the archive, naming the storage and its record.
TEST(CheckpointTest, AStorageLongerThanItsRecordIsRefused) {
  TempDir dir;
  SavedLinear saved(dir);
  ASSERT_NO_THROW(saved.checkpointer.load(saved.path, *saved.model, saved.sgd, "model=linear"));
  // The weight (and its momentum) are 6 floats, the bias (and its) 2.
  for (const auto& [elements, record_size] : std::vector<std::pair<int, size_t>>{{6, 24}, {2, 8}}) {
    const size_t size = record_size;  // a variable the lambda can capture (C++17)
    const std::string cut = dir.file("cut-" + std::to_string(size) + ".pt");
    std::ofstream(cut, std::ios::binary) << rewritten_checkpoint(saved.path, [&](const std::string& record, std::string& bytes) {
      if (record.rfind("data/", 0) == 0 && bytes.size() == size) bytes.resize(4);
    });
    std::string message = saved.load_error(cut);
    EXPECT_NE(message.find("cannot resume from " + cut + ": not a readable tandem checkpoint (data.pkl: storage "),
              std::string::npos) << message;
    EXPECT_NE(message.find(" declares " + std::to_string(elements) +
                           " elements of torch.FloatStorage (4 bytes each), but its record data/"),
              std::string::npos) << message;
    EXPECT_NE(message.find(" holds 4 bytes: a record cut short, or a reference altered"), std::string::npos) << message;
  }
}

// Strides are 64-bit integers of the file's choosing: one of 2^62 made the
// reach of the weight (2^62 + 2 floats) wrap around to 8 bytes, inside its
// 24-byte storage; the check's arithmetic does not overflow.
TEST(CheckpointTest, ATensorWhoseReachOverflowsIsRefused) {
  TempDir dir;
  SavedLinear saved(dir);
  const std::string big = dir.file("big-stride.pt");
  std::string huge("\x8a\x08", 2);  // LONG1 of 8 bytes: 2^62
  for (int i = 0; i < 8; ++i) huge.push_back(static_cast<char>(i == 7 ? 0x40 : 0));
  std::ofstream(big, std::ios::binary) << rewritten_checkpoint(saved.path, [&](const std::string& record, std::string& bytes) {
    // The weight's strides (3, 1): MARK, BININT1 3, BININT1 1, TUPLE.
    if (record == "data.pkl") replace_first(bytes, std::string("(K\x03K\x01t", 6), "(" + huge + std::string("K\x01t", 3));
  });
  std::string message = saved.load_error(big);
  EXPECT_NE(message.find("cannot resume from " + big + ": model.weight: its storage holds 24 bytes, the tensor ([2, 3], "
                         "[4611686018427387904, 1], offset 0, Float) reaches past it"),
            std::string::npos) << message;
}

// A random state of stride 0 (1 byte, repeated) is refused as damaged,
// naming the checkpoint's field (libtorch's own words: "RNG state must be
// contiguous").
TEST(CheckpointTest, ARandomStateThatIsNotPackedBytesIsRefused) {
  TempDir dir;
  SavedLinear saved(dir);
  const std::string repeated = dir.file("rng-stride-0.pt");
  std::ofstream(repeated, std::ios::binary) << rewritten_checkpoint(saved.path, [&](const std::string& record, std::string& bytes) {
    if (record != "data.pkl") return;
    // The state's strides (1,), after its size (5056,): BININT2 5056, TUPLE, MARK, BININT1 1, TUPLE.
    replace_first(bytes, std::string("M\xc0\x13t(K\x01t", 8), std::string("M\xc0\x13t(K\x00t", 8));
  });
  std::string message = saved.load_error(repeated);
  EXPECT_NE(message.find("cannot resume from " + repeated + ": damaged: its random-number state (cpu_rng: [5056], "
                         "Byte) is not the 5056 packed bytes of a CPU generator's state"),
            std::string::npos) << message;
}

// Only regular files named checkpoint-<step>.pt count: a directory or a FIFO
// of that name is neither resumed from (the FIFO would block the read) nor
// kept in place of a real checkpoint when older ones are removed.
TEST(CheckpointTest, OnlyRegularFilesCountAsCheckpoints) {
  TempDir dir;
  std::filesystem::create_directory(dir.file("checkpoint-00000050.pt"));
  ASSERT_EQ(::mkfifo(dir.file("checkpoint-00000060.pt").c_str(), 0600), 0);
  std::ofstream(dir.file("checkpoint-99999999999999999999.pt")) << "too large a step";
  torch::nn::Linear model(3, 2);
  torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.1));
  checkpoint::Checkpointer checkpointer({dir.path()});
  checkpoint::TrainPosition p;
  for (p.step = 1; p.step <= 3; ++p.step) checkpointer.save(p, *model, sgd, "model=linear");
  EXPECT_FALSE(std::filesystem::exists(dir.file("checkpoint-00000001.pt")));
  EXPECT_TRUE(std::filesystem::exists(dir.file("checkpoint-00000002.pt")));
  EXPECT_EQ(checkpointer.latest(), dir.file("checkpoint-00000003.pt"));
  checkpoint::TrainPosition loaded;
  std::vector<std::string> warnings;
  EXPECT_EQ(checkpointer.load_newest_good(loaded, *model, sgd, "model=linear", &warnings),
            dir.file("checkpoint-00000003.pt"));
  EXPECT_EQ(loaded.step, 3);
  EXPECT_TRUE(warnings.empty());
}

// Resumed from checkpoint 2 because 4 is damaged, a run that then writes
// checkpoint 6 removes the damaged 4 and keeps the good 2 it resumed from
// (the newest two by default): what was saved and good is never lost to a
// damaged file's kept slot. The control is the order the damaged one had
// taken: without it, 6 and 4 were kept and 2 removed.
TEST(CheckpointTest, AfterAFallbackTheGoodCheckpointIsKeptNotTheDamaged) {
  TempDir dir;
  torch::nn::Linear model(3, 2);
  torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.1));
  checkpoint::TrainPosition p;
  {
    checkpoint::Checkpointer first({dir.path()});
    for (p.step = 2; p.step <= 4; p.step += 2) first.save(p, *model, sgd, "model=linear");
  }
  std::ofstream(dir.file("checkpoint-00000004.pt"), std::ios::app) << "damage";
  checkpoint::Checkpointer resumed({dir.path()});
  checkpoint::TrainPosition loaded;
  std::vector<std::string> warnings;
  EXPECT_EQ(resumed.load_newest_good(loaded, *model, sgd, "model=linear", &warnings),
            dir.file("checkpoint-00000002.pt"));
  ASSERT_EQ(warnings.size(), 1u);
  p.step = 6;
  resumed.save(p, *model, sgd, "model=linear");
  EXPECT_TRUE(std::filesystem::exists(dir.file("checkpoint-00000006.pt")));
  EXPECT_TRUE(std::filesystem::exists(dir.file("checkpoint-00000002.pt"))) << "the good one resumed from";
  EXPECT_FALSE(std::filesystem::exists(dir.file("checkpoint-00000004.pt"))) << "the damaged one passed over";
}

// Three fuzz findings (fuzz/regressions/checkpoint): a data.pkl that
// stores into memo slot 1.6 billion; a code record's .debug_pkl (unpickled
// by libtorch when the archive's code fails to parse) declaring a
// 3.4e18-byte string; and the random state's storage key changed to the
// 16-byte weight's (libtorch read 5056 bytes from it: a crash). All are
// refused (Note [pickle bounds], Note [storage references]) before
// libtorch reads them.
TEST(CheckpointTest, ArchivesTheFuzzerFoundAreRefusedBeforeLibtorchReadsThem) {
  for (const auto& [file, why] : std::vector<std::pair<std::string, std::string>>{
           {"memo-index-1.6-billion", "data.pkl: memo index "},
           {"debug-pkl-string-3e18", ".debug_pkl: "},
           {"storage-key-of-a-smaller-record",
            "data.pkl: storage 0 declares 5056 elements of torch.ByteStorage (1 byte each), but its record "
            "data/0 holds 16 bytes"}}) {
    std::ifstream in(std::string(TANDEM_SOURCE_DIR) + "/fuzz/regressions/checkpoint/" + file, std::ios::binary);
    std::string input((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    ASSERT_GT(input.size(), 1u) << file;
    ASSERT_EQ(input[0] % 2, 1) << file;  // the fuzzer's "archive, sealed" path
    TempDir dir;
    auto path = dir.file("checkpoint-00000001.pt");
    std::ofstream(path, std::ios::binary) << checkpoint::seal_checkpoint(input.substr(1));
    torch::nn::Linear model(2, 2);
    torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
    try {
      checkpoint::Checkpointer({dir.path()}).load(path, *model, sgd, "fuzz");
      ADD_FAILURE() << file << ": the archive loaded";
    } catch (const tandem::Error& e) {
      std::string message = e.what();
      EXPECT_NE(message.find("cannot resume from " + path + ": not a readable tandem checkpoint ("),
                std::string::npos) << message;
      EXPECT_NE(message.find(why), std::string::npos) << message;
    }
  }
}

// Issue 7: a checkpoint cut short or altered on disk is caught by its
// checksum, before anything is loaded; resume falls back to the one before
// it (atomic writes keep it intact) and still ends with the uninterrupted
// run's weights.

}  // namespace
}  // namespace tandem::engine
