// Writing a sharded checkpoint (Checkpointer::save_sharded in
// checkpoint.h; Note [sharded checkpoints]): every rank its pieces, in
// parallel, then rank 0 the manifest and the rename that makes it whole.
#include <unistd.h>

#include <chrono>
#include <filesystem>

#include <nlohmann/json.hpp>

#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include "tandem/dist/collectives.h"

#include "tandem/checkpoint/checkpoint.h"
#include "tandem/checkpoint/sharded_checkpoint.h"
#include "tandem/util/check.h"
#include "tandem/util/table.h"

namespace tandem::checkpoint {

namespace fs = std::filesystem;

std::string Checkpointer::save_sharded(const TrainPosition& p, const std::vector<StatePiece>& mine,
                                       torch::optim::Optimizer& optimizer, const std::string& fingerprint,
                                       const std::map<std::string, std::string>& weights_metadata,
                                       dist::ProcessGroup* group, const torch::Device& device) const {
  const int64_t rank = group ? group->rank() : 0;
  const std::string name = format("checkpoint-%08lld", static_cast<long long>(p.step));
  const fs::path final_path = fs::path(options_.dir) / name;
  // Rank 0 makes the directory, named for its process until it is whole
  // (remove_stale_temporaries knows the form); every rank learns its name.
  // Its id: the folder's name and the time, drawn by rank 0 for this write.
  std::string tmp_name, id;
  if (rank == 0) {
    tmp_name = name + ".tmp-" + std::to_string(::getpid());
    std::error_code ec;
    fs::remove_all(fs::path(options_.dir) / tmp_name, ec);
    fs::create_directories(fs::path(options_.dir) / tmp_name, ec);
    TANDEM_CHECK(!ec, "--checkpoint-dir ", options_.dir, ": cannot create ", tmp_name, ": ", ec.message());
    id = tmp_name + "@" + std::to_string(std::chrono::system_clock::now().time_since_epoch().count());
  }
  if (group) id = dist::all_gather_text(id, *group, device)[0];
  tmp_name = id.substr(0, id.find('@'));
  const sharded::Identity identity{id, group ? group->size() : 1, p.step};
  const std::string tmp = (fs::path(options_.dir) / tmp_name).string();
  // Note [a failed write leaves nothing]: a full disk, or a rank that
  // failed, leaves the folder half written; each rank whose write fails
  // removes it (the others' writes into it then fail too, and the job
  // ends) rather than leaving it to the next run's start.
  struct RemovedOnFailure {
    const std::string& tmp;
    bool done = false;
    ~RemovedOnFailure() {
      std::error_code ec;
      if (!done) fs::remove_all(tmp, ec);
    }
  } removed_on_failure{tmp};
  std::map<std::string, c10::IValue> header;
  if (rank == 0) {
    for (const auto& [key, value] : header_fields(p, fingerprint)) header[key] = value;
    if (auto* adamw = dynamic_cast<torch::optim::AdamWOptions*>(&optimizer.param_groups().at(0).options())) {
      header["optimizer"] = std::string("adamw");
      header["lr"] = adamw->lr();
      header["beta1"] = std::get<0>(adamw->betas());
      header["beta2"] = std::get<1>(adamw->betas());
      header["eps"] = adamw->eps();
      header["weight_decay"] = adamw->weight_decay();
      header["amsgrad"] = adamw->amsgrad();
    } else {
      auto* sgd = dynamic_cast<torch::optim::SGDOptions*>(&optimizer.param_groups().at(0).options());
      TANDEM_CHECK(sgd, "sharded checkpoint: the optimizer is neither SGD nor AdamW");
      header["lr"] = sgd->lr();
      header["momentum"] = sgd->momentum();
      header["dampening"] = sgd->dampening();
      header["weight_decay"] = sgd->weight_decay();
      header["nesterov"] = sgd->nesterov();
    }
    if (!weights_metadata.empty()) header["weights_metadata"] = nlohmann::json(weights_metadata).dump();
  }
  const auto index = sharded::write_rank_file(tmp, rank, identity, mine, header, /*with_rng=*/rank == 0);
  // Every rank's file is written once every rank has its index.
  const auto indexes = group ? dist::all_gather_text(index, *group, device) : std::vector<std::string>{index};
  if (rank == 0) {
    sharded::write_manifest(tmp, identity, indexes);
    std::error_code ec;
    fs::remove_all(final_path, ec);  // a checkpoint of this step from before a restart
    fs::rename(tmp, final_path, ec);
    TANDEM_CHECK(!ec, "--checkpoint-dir ", options_.dir, ": cannot rename ", tmp_name, " to ", name, ": ",
                 ec.message());
    prune(p.step);
  }
  removed_on_failure.done = true;
  return final_path.string();
}

}  // namespace tandem::checkpoint
