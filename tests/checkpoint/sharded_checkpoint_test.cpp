// Sharded checkpoints (Note [sharded checkpoints] in
// checkpoint/sharded_checkpoint.h): pieces in any memory order assemble into
// the whole tensors, or fill the parts a reader holds; a manifest that does
// not describe its pieces is refused, and the Checkpointer's sharded
// checkpoint loads as its one-file checkpoint does.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>

#include <nlohmann/json.hpp>


#include "tandem/checkpoint/checkpoint.h"
#include "tandem/checkpoint/sharded_checkpoint.h"
#include "tandem/optim/adamw.h"
#include "tandem/optim/state_tensors.h"
#include "counting_allocator.h"
#include "testing.h"

namespace tandem::checkpoint {
namespace {

namespace fs = std::filesystem;
using testing::TempDir;

// A channels-last 4-D tensor cut into three runs of its memory order over
// two files, and a vector whole in the second: read back whole.
TEST(ShardedCheckpointTest, PiecesInAnyMemoryOrderAssembleWhole) {
  TempDir dir;
  auto conv = torch::randn({2, 3, 4, 5}).contiguous(torch::MemoryFormat::ChannelsLast);
  auto bias = torch::randn({7}, torch::kFloat64);
  // The channels-last tensor's memory, in order.
  auto memory = conv.permute({0, 2, 3, 1}).reshape({-1});
  const std::vector<int64_t> shape = conv.sizes().vec(), strides = conv.strides().vec();
  std::vector<StatePiece> first = {{"model.conv", 0, shape, strides, 0, memory.narrow(0, 0, 50)},
                                   {"model.conv", 0, shape, strides, 90, memory.narrow(0, 90, 30)}};
  std::vector<StatePiece> second = {{"model.conv", 0, shape, strides, 50, memory.narrow(0, 50, 40)},
                                    {"model.bias", 1, {7}, {1}, 0, bias}};
  const sharded::Identity identity{"test@1", 2, 3};
  std::vector<std::string> indexes = {
      sharded::write_rank_file(dir.path(), 0, identity, first, {{"step", c10::IValue(int64_t(3))}}, true),
      sharded::write_rank_file(dir.path(), 1, identity, second, {}, false)};
  sharded::write_manifest(dir.path(), identity, indexes);
  EXPECT_EQ(sharded::manifest_step(dir.path()), 3);
  auto read = sharded::read(dir.path());
  ASSERT_EQ(read.tensors.size(), 2u);
  EXPECT_EQ(read.tensors[0].first, "model.conv");
  EXPECT_TRUE(torch::equal(read.tensors[0].second, conv.contiguous()));
  EXPECT_TRUE(read.tensors[0].second.is_contiguous());
  EXPECT_EQ(read.tensors[1].first, "model.bias");
  EXPECT_TRUE(torch::equal(read.tensors[1].second, bias));
  EXPECT_EQ(read.header.at("step").toInt(), 3);
  EXPECT_TRUE(read.cpu_rng.defined());

  // Control: pieces that overlap, or leave a gap, are no checkpoint.
  second[0].offset = 49;
  indexes[1] = sharded::write_rank_file(dir.path(), 1, identity, second, {}, false);
  EXPECT_EQ(testing::error_of([&] { sharded::write_manifest(dir.path(), identity, indexes); }),
            "sharded checkpoint: model.conv: its pieces overlap at element 49");
  second[0].offset = 51;
  indexes[1] = sharded::write_rank_file(dir.path(), 1, identity, second, {}, false);
  EXPECT_EQ(testing::error_of([&] { sharded::write_manifest(dir.path(), identity, indexes); }),
            "sharded checkpoint: model.conv: its pieces leave a gap at element 50");
}

// Note [loading by overlap]: a matrix written as two ranks' column runs
// (the cut dimension outermost, as tensor parallelism writes it) read into
// row-major halves (FSDP's dim-0 shards), an unaligned run of the writer's
// own order, and a scalar whole; each wanted element is the written one,
// every written piece is inspected, a name the checkpoint lacks is
// returned, and a wanted shape that is not the checkpoint's is refused.
TEST(ShardedCheckpointTest, PartsAreReadFromThePiecesThatOverlapThemInAnyOrder) {
  TempDir dir;
  const auto w = torch::arange(24, torch::kFloat64).reshape({6, 4}) * 1.5;
  const auto step = torch::tensor(7, torch::kInt64);
  const std::vector<int64_t> columns_outermost = {1, 6};
  auto column_run = [&](int64_t first) { return w.narrow(1, first, 2).t().contiguous().reshape({-1}); };
  const sharded::Identity identity{"overlap@1", 2, 3};
  std::vector<std::string> indexes = {
      sharded::write_rank_file(dir.path(), 0, identity,
                               {{"model.w", 0, {6, 4}, columns_outermost, 0, column_run(0)},
                                {"optimizer.w.step", 1, {}, {}, 0, step.reshape({-1})}},
                               {{"step", c10::IValue(int64_t(3))}}, true),
      sharded::write_rank_file(dir.path(), 1, identity, {{"model.w", 0, {6, 4}, columns_outermost, 12, column_run(2)}},
                               {}, false)};
  sharded::write_manifest(dir.path(), identity, indexes);
  auto nan = [](int64_t n) { return torch::full({n}, std::nan(""), torch::kFloat64); };
  std::vector<StatePiece> wanted = {{"model.w", 0, {6, 4}, {4, 1}, 0, nan(12)},
                                    {"model.w", 0, {6, 4}, {4, 1}, 12, nan(12)},
                                    {"model.w", 0, {6, 4}, columns_outermost, 6, nan(10)},
                                    {"optimizer.w.step", 1, {}, {}, 0, torch::zeros({1}, torch::kInt64)},
                                    {"optimizer.w.exp_avg", 2, {6, 4}, {4, 1}, 0, nan(24)}};
  int64_t inspected = 0, header_step = -1;
  const auto absent = sharded::read_into(
      dir.path(), wanted,
      [&](const std::map<std::string, c10::IValue>& header, const torch::Tensor& rng) {
        header_step = header.at("step").toInt();
        EXPECT_TRUE(rng.defined());
      },
      [&](const std::string&, const torch::Tensor&) { ++inspected; });
  EXPECT_EQ(header_step, 3);
  EXPECT_EQ(inspected, 3);
  EXPECT_EQ(absent, std::set<std::string>{"optimizer.w.exp_avg"});
  EXPECT_TRUE(torch::equal(wanted[0].data, w.narrow(0, 0, 3).reshape({-1})));
  EXPECT_TRUE(torch::equal(wanted[1].data, w.narrow(0, 3, 3).reshape({-1})));
  EXPECT_TRUE(torch::equal(wanted[2].data, w.t().contiguous().reshape({-1}).narrow(0, 6, 10)));
  EXPECT_EQ(wanted[3].data.item<int64_t>(), 7);
  EXPECT_TRUE(wanted[4].data.isnan().all().item<bool>());  // not in the checkpoint: left alone

  std::vector<StatePiece> other_shape = {{"model.w", 0, {4, 6}, {6, 1}, 0, nan(24)}};
  EXPECT_EQ(testing::error_of([&] { sharded::read_into(dir.path(), other_shape, {}, {}); }),
            "model.w is of shape [6, 4] in the checkpoint, [4, 6] in this run");
  // A manifest edited to that shape (or to another size of a file) is no
  // mismatch of the run's but damage: the files' sealed indexes say
  // otherwise, so --resume passes over it.
  const std::string manifest_path = dir.file(sharded::kManifest);
  const auto good = nlohmann::json::parse(testing::read_text(manifest_path));
  auto damaged = [&](const std::function<void(nlohmann::json&)>& edit) {
    auto edited = good;
    edit(edited);
    std::ofstream(manifest_path) << edited.dump();
    std::vector<StatePiece> whole = {{"model.w", 0, {6, 4}, {4, 1}, 0, nan(24)}};
    auto& into = edited["tensors"][0]["shape"] == good["tensors"][0]["shape"] ? whole : other_shape;
    try {
      sharded::read_into(dir.path(), into, {}, {});
      return std::string("<read>");
    } catch (const DamagedCheckpoint& e) {
      return std::string(e.what());
    }
  };
  EXPECT_NE(damaged([](auto& m) {
              m["tensors"][0]["shape"] = {4, 6};
              m["tensors"][0]["strides"] = {1, 4};
            }).find("damaged: manifest.json: model.w: piece p0 of rank-0.pt is not what the manifest says"),
            std::string::npos);
  EXPECT_NE(damaged([](auto& m) { m["files"][1]["bytes"] = 1; }).find("damaged: rank-1.pt: its "), std::string::npos);
  EXPECT_NE(damaged([](auto& m) { m["files"][1]["bytes"] = 1; }).find(" bytes are not the manifest's 1"),
            std::string::npos);
}

// What loading by overlap is for: a rank holds its part, not the whole.
// Four ranks' files hold dim-0 quarters of 8 matrices (8 MiB in all); a
// reader of one column quarter of each (as tp=4 cuts them, a quarter of
// the whole) reads them with a peak of tensor memory (the c10 allocator's:
// the files' bytes are read into strings) far below the whole, which
// assembling them whole holds and more (measured: 3.0 MiB, 10.0 MiB).
TEST(ShardedCheckpointTest, AReaderOfAPartHoldsThePartNotTheWhole) {
  TempDir dir;
  const int64_t rows = 512, columns = 256, count = 8;
  const int64_t whole_bytes = count * rows * columns * 8;
  std::vector<torch::Tensor> weights;
  for (int64_t i = 0; i < count; ++i) weights.push_back(torch::randn({rows, columns}, torch::kFloat64));
  const sharded::Identity identity{"part@1", 4, 1};
  std::vector<std::string> indexes;
  for (int64_t r = 0; r < 4; ++r) {
    std::vector<StatePiece> pieces;
    for (int64_t i = 0; i < count; ++i) {
      pieces.push_back({"model.w" + std::to_string(i), i, {rows, columns}, {columns, 1}, r * rows / 4 * columns,
                        weights[i].narrow(0, r * rows / 4, rows / 4).reshape({-1})});
    }
    std::map<std::string, c10::IValue> header;
    if (r == 0) header["step"] = c10::IValue(int64_t(1));
    indexes.push_back(sharded::write_rank_file(dir.path(), r, identity, pieces, header, r == 0));
  }
  sharded::write_manifest(dir.path(), identity, indexes);
  // Each file holds its pieces, not the whole matrices they are views of.
  for (int64_t r = 0; r < 4; ++r) EXPECT_LT(fs::file_size(dir.file(sharded::rank_file(r))), whole_bytes / 4 + 65536);
  const std::vector<int64_t> columns_outermost = {1, rows};
  const int64_t part = rows * columns / 4;
  std::vector<StatePiece> wanted;
  for (int64_t i = 0; i < count; ++i) {
    wanted.push_back({"model.w" + std::to_string(i), i, {rows, columns}, columns_outermost, part,
                      torch::zeros({part}, torch::kFloat64)});
  }
  testing::CountingCpuAllocator counting;
  auto peak_of = [&](const std::function<void()>& read) {
    counting->reset_peak();
    const int64_t before = counting->live();
    read();
    return counting->peak() - before;
  };
  const int64_t part_peak = peak_of([&] { sharded::read_into(dir.path(), wanted, {}, {}); });
  const int64_t whole_peak = peak_of([&] { sharded::read(dir.path()); });
  std::printf("peak of tensor memory reading %.1f MiB: %.2f MiB for a quarter, %.2f MiB whole\n",
              whole_bytes / 1048576.0, part_peak / 1048576.0, whole_peak / 1048576.0);
  for (int64_t i = 0; i < count; ++i) {
    EXPECT_TRUE(torch::equal(wanted[i].data, weights[i].narrow(1, columns / 4, columns / 4).t().reshape({-1})));
  }
  EXPECT_GE(whole_peak, whole_bytes);
  EXPECT_LT(part_peak, whole_bytes / 2);
}

// Anything that is not one whole checkpoint is damaged (so --resume falls
// back to the one before), saying what: a manifest edited to disagree with
// the files' own sealed indexes, or to leave a piece out (momentum silently
// missing), or naming a file outside the checkpoint; a rank file missing,
// swapped with another rank's, or of another checkpoint.
TEST(ShardedCheckpointTest, AnythingButOneWholeCheckpointIsDamaged) {
  TempDir dir;
  auto w = torch::randn({4, 4}), m = torch::randn({4});
  auto write = [&](const std::string& to, const std::string& id) {
    const sharded::Identity identity{id, 2, 1};
    std::vector<std::string> indexes = {
        sharded::write_rank_file(to, 0, identity, {{"model.w", 0, {4, 4}, {4, 1}, 0, w.reshape({-1}).narrow(0, 0, 8)}},
                                 {{"step", c10::IValue(int64_t(1))}}, true),
        sharded::write_rank_file(to, 1, identity,
                                 {{"model.w", 0, {4, 4}, {4, 1}, 8, w.reshape({-1}).narrow(0, 8, 8)},
                                  {"optimizer.w.momentum_buffer", 1, {4}, {1}, 0, m}},
                                 {}, false)};
    sharded::write_manifest(to, identity, indexes);
  };
  write(dir.path(), "one@1");
  const std::string manifest_path = dir.file(sharded::kManifest);
  const auto good = nlohmann::json::parse(testing::read_text(manifest_path));
  ASSERT_NO_THROW(sharded::read(dir.path()));
  auto damage = [&](const std::function<void()>& act) {
    act();
    try {
      sharded::read(dir.path());
      return std::string("<read>");
    } catch (const DamagedCheckpoint& e) {
      return std::string(e.what());
    }
  };
  auto with = [&](const std::function<void(nlohmann::json&)>& edit) {
    return damage([&] {
      auto edited = good;
      edit(edited);
      std::ofstream(manifest_path) << edited.dump();
    });
  };
  EXPECT_EQ(with([](auto& m) { m["tensors"][0]["pieces"][1]["offset"] = 7; }),
            "damaged: manifest.json: model.w: its pieces overlap at element 7");
  EXPECT_EQ(with([](auto& m) {
              m["tensors"][0]["pieces"][0]["offset"] = 8;
              m["tensors"][0]["pieces"][1]["offset"] = 0;
            }),
            "damaged: manifest.json: model.w: piece p0 of rank-0.pt is not what the manifest says ({\"dtype\":\"Float\","
            "\"key\":\"p0\",\"name\":\"model.w\",\"numel\":8,\"offset\":0,\"order\":0,\"shape\":[4,4],"
            "\"strides\":[4,1]})");
  EXPECT_NE(with([](auto& m) { m["tensors"][0]["strides"] = {1, 4}; }).find("piece p0 of rank-0.pt is not what"),
            std::string::npos);
  EXPECT_EQ(with([](auto& m) { m["tensors"][0]["strides"] = {4611686018427387904LL, 1}; }),
            "damaged: manifest.json: model.w: \"strides\" holds 4611686018427387904, not a size");
  EXPECT_EQ(with([](auto& m) { m["files"][1]["file"] = "../rank-1.pt"; }),
            "damaged: manifest.json: file 1 is \"../rank-1.pt\", expected rank-1.pt");
  EXPECT_EQ(with([](auto& m) { m["tensors"][0]["pieces"].erase(1); }),
            "damaged: manifest.json: model.w: its pieces hold 8 of its 16 elements");
  EXPECT_EQ(with([](auto& m) { m["tensors"].erase(1); }),
            "damaged: manifest.json: leaves out piece p1 of rank-1.pt (optimizer.w.momentum_buffer)");
  EXPECT_EQ(with([](auto& m) { m["tensors"][0]["dtype"] = "Float8"; }),
            "damaged: manifest.json: model.w: an unknown dtype 'Float8'");
  EXPECT_EQ(with([](auto& m) { m["tensors"][0]["pieces"][0]["numel"] = 8.5; }),
            "damaged: manifest.json: model.w: \"numel\" is number, expected an integer");
  EXPECT_NE(damage([&] { std::ofstream(manifest_path) << "{"; }).find("damaged: manifest.json: not valid JSON ("),
            std::string::npos);
  std::ofstream(manifest_path) << good.dump();
  ASSERT_NO_THROW(sharded::read(dir.path()));
  // Files swapped, or one from another checkpoint of the same shape.
  fs::rename(dir.file("rank-0.pt"), dir.file("swap"));
  fs::rename(dir.file("rank-1.pt"), dir.file("rank-0.pt"));
  fs::rename(dir.file("swap"), dir.file("rank-1.pt"));
  const auto swapped = damage([] {});  // the sizes differ first; same-sized files record their rank
  EXPECT_EQ(swapped.rfind("damaged: rank-0.pt: its ", 0), 0u) << swapped;
  EXPECT_NE(swapped.find(" bytes are not the manifest's "), std::string::npos) << swapped;
  TempDir other;
  write(other.path(), "two@2");
  fs::copy_file(other.file("rank-0.pt"), dir.file("rank-0.pt"), fs::copy_options::overwrite_existing);
  EXPECT_EQ(damage([] {}), "damaged: rank-0.pt is a file of another checkpoint (two@2, this one's: one@1)");
  EXPECT_NE(damage([&] { fs::remove(dir.file("rank-1.pt")); }).find("damaged: rank-0.pt"), std::string::npos);
  write(dir.path(), "one@1");
  EXPECT_EQ(damage([&] { fs::remove(dir.file("rank-1.pt")); }).rfind("damaged: rank-1.pt: ", 0), 0u);
}

// The Checkpointer's sharded checkpoint of one process loads as its
// one-file checkpoint does: the same weights, momentum and position; a
// folder without its manifest is named and passed over, and one left by a
// dead process's write is removed at the start.
TEST(ShardedCheckpointTest, TheCheckpointersShardedCheckpointLoadsAsItsFileDoes) {
  TempDir dir;
  torch::manual_seed(3);
  torch::nn::Linear model(3, 2);
  torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  model->forward(torch::ones({1, 3})).sum().backward();
  sgd.step();
  std::vector<StatePiece> pieces;
  int64_t order = 0;
  for (const auto& p : model->named_parameters()) {
    auto flat = p.value().detach().reshape({-1});
    pieces.push_back({"model." + p.key(), order++, p.value().sizes().vec(), p.value().strides().vec(), 0, flat});
  }
  for (const auto& p : model->named_parameters()) {
    auto* state = static_cast<torch::optim::SGDParamState*>(sgd.state().at(p.value().unsafeGetTensorImpl()).get());
    pieces.push_back({"optimizer." + p.key() + ".momentum_buffer", order++, p.value().sizes().vec(),
                      p.value().strides().vec(), 0, state->momentum_buffer().reshape({-1})});
  }
  Checkpointer checkpointer({dir.path()});
  TrainPosition at;
  at.step = 5;
  at.epoch = 1;
  at.epoch_loss_sum = 0.1 + 0.2;
  const auto path = checkpointer.save_sharded(at, pieces, sgd, "model=linear", {{"model", "linear"}}, nullptr,
                                              torch::kCPU);
  EXPECT_EQ(path, dir.file("checkpoint-00000005"));
  EXPECT_EQ(checkpointer.latest(), path);
  TrainPosition later = at;
  later.step = 6;  // kept beside the sharded one (an earlier step would prune it)
  const auto file = checkpointer.save(later, *model, sgd, "model=linear");

  auto load = [&](const std::string& from) {
    torch::manual_seed(4);
    torch::nn::Linear other(3, 2);
    torch::optim::SGD other_sgd(other->parameters(), torch::optim::SGDOptions(0.5));
    auto position = checkpointer.load(from, *other, other_sgd, "model=linear");
    return std::make_tuple(position, other, std::make_shared<torch::optim::SGD>(std::move(other_sgd)));
  };
  // A rank's file alone is a piece of it, named as such (tandem export --checkpoint).
  EXPECT_NE(testing::error_of([&] { read_checkpoint_weights(path + "/rank-0.pt"); })
                .find("a rank's file of a sharded checkpoint, not a checkpoint: give the checkpoint's folder"),
            std::string::npos);
  auto [position, loaded, loaded_sgd] = load(path);
  EXPECT_EQ(position.step, 5);
  EXPECT_EQ(position.epoch, 1);
  EXPECT_EQ(position.epoch_loss_sum, 0.1 + 0.2);
  for (const auto& p : model->named_parameters()) {
    EXPECT_TRUE(torch::equal(loaded->named_parameters()[p.key()], p.value())) << p.key();
  }
  auto [file_position, from_file, file_sgd] = load(file);
  (void)file_position;
  (void)from_file;
  EXPECT_EQ(static_cast<torch::optim::SGDOptions&>(loaded_sgd->param_groups()[0].options()).momentum(), 0.9);
  for (size_t i = 0; i < 2; ++i) {
    auto momentum = [](torch::optim::SGD& s, size_t k) {
      const auto& p = s.param_groups()[0].params()[k];
      return static_cast<torch::optim::SGDParamState*>(s.state().at(p.unsafeGetTensorImpl()).get())->momentum_buffer();
    };
    EXPECT_TRUE(torch::equal(momentum(*loaded_sgd, i), momentum(*file_sgd, i)));
  }
  // A folder so named without its manifest (which the rename that names it
  // follows) was damaged since: --resume names it and goes back to the one
  // before, and it is not a whole checkpoint to keep. A dead writer's
  // temporary is removed.
  fs::create_directory(dir.file("checkpoint-00000009"));
  fs::create_directory(dir.file("checkpoint-00000008.tmp-999999999"));
  EXPECT_EQ(checkpointer.latest(), dir.file("checkpoint-00000009"));
  {
    torch::nn::Linear other(3, 2);
    torch::optim::SGD other_sgd(other->parameters(), torch::optim::SGDOptions(0.5));
    TrainPosition resumed;
    std::vector<std::string> warnings;
    EXPECT_EQ(checkpointer.load_newest_good(resumed, *other, other_sgd, "model=linear", &warnings), file);
    EXPECT_EQ(resumed.step, 6);
    ASSERT_EQ(warnings.size(), 1u);
    EXPECT_EQ(warnings[0].rfind("cannot resume from " + dir.file("checkpoint-00000009") + ": damaged: ", 0), 0u)
        << warnings[0];
    EXPECT_NE(warnings[0].find("manifest.json"), std::string::npos) << warnings[0];
  }
  EXPECT_EQ(checkpointer.remove_stale_temporaries(), std::vector<std::string>{"checkpoint-00000008.tmp-999999999"});
  EXPECT_TRUE(fs::is_directory(dir.file("checkpoint-00000009")));
}

// A sharded checkpoint of another run's settings is refused in those terms
// (the fields that differ) before its state is assembled: another
// vocabulary's AdamW moments would otherwise fail on their shapes first.
TEST(ShardedCheckpointTest, AnotherRunsSettingsAreNamedBeforeTheStatesShapes) {
  TempDir dir;
  auto adamw_run = [](int64_t inputs, std::vector<StatePiece>* pieces) {
    torch::nn::Linear model(inputs, 2);
    const torch::optim::AdamWOptions options(1e-3);
    auto adamw = std::make_shared<optim::AdamW>(optim::decay_groups(model->named_parameters(), options), options);
    model->forward(torch::ones({1, inputs})).sum().backward();
    adamw->step();
    int64_t order = 0;
    for (const auto& p : model->named_parameters()) {
      if (pieces == nullptr) break;
      pieces->push_back({"model." + p.key(), order++, p.value().sizes().vec(), p.value().strides().vec(), 0,
                         p.value().detach().reshape({-1})});
      for (const auto& [slot, state] : optim::parameter_state(*adamw, p.value())) {
        pieces->push_back({"optimizer." + p.key() + "." + slot, order++, state.sizes().vec(),
                           state.strides().vec(), 0, state.reshape({-1})});
      }
    }
    return std::make_pair(model, adamw);
  };
  std::vector<StatePiece> pieces;
  auto [written, written_adamw] = adamw_run(3, &pieces);
  Checkpointer checkpointer({dir.path()});
  TrainPosition at;
  at.step = 2;
  const auto path = checkpointer.save_sharded(at, pieces, *written_adamw, "model=linear vocab=3",
                                              {{"model", "linear"}}, nullptr, torch::kCPU);
  auto [other, other_adamw] = adamw_run(4, nullptr);
  try {
    checkpointer.load(path, *other, *other_adamw, "model=linear vocab=4");
    FAIL() << "loaded";
  } catch (const std::exception& e) {
    EXPECT_EQ(std::string(e.what()).rfind("cannot resume from " + path + ": it was written by a run with other "
                                          "settings (vocab=3 in the checkpoint, vocab=4 in this run)", 0),
              0u)
        << e.what();
  }
}

}  // namespace
}  // namespace tandem::checkpoint
