// tandem/engine/run_setup.h: what a run is made of before any parallelism:
// its job's process group, its data, its model from the factory, and its
// weights files. The Trainer builds on these; `tandem eval` uses them alone
// (a model evaluated needs no optimizer, strategy or checkpoints).
#pragma once

#include <cstdio>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "tandem/checkpoint/safetensors.h"
#include "tandem/data/dataset.h"
#include "tandem/data/source.h"
#include "tandem/dist/process_group.h"
#include "tandem/engine/train_options.h"
#include "tandem/models/registry.h"
#include "tandem/models/sequence.h"

namespace tandem::engine {

// Parses "cpu", "cuda", "cuda:N"; throws tandem::Error naming --device if the
// text is bad or CUDA is asked for but absent.
torch::Device parse_device(const std::string& text);

// --amp's autocast dtype (optim/amp.h's AutocastGuard takes it): none for off.
std::optional<torch::ScalarType> autocast_dtype(AmpMode amp);

// Joins the job the environment names (tandem launch, torchrun, srun,
// mpirun), with --dist-backend and --dist-timeout; null when it names none.
// A plain --device cuda becomes cuda:LOCAL_RANK, made the current device.
std::shared_ptr<dist::ProcessGroup> join_job(const TrainOptions& o, torch::Device& device);

// The data's options from the flags (--augment, --image-size, --seed,
// --skip-bad-images).
data::DataOptions data_options_for(const TrainOptions& o);

// --data (and --val-data as the evaluation split), checked to agree in
// image shape and classes.
data::DataSplits open_run_data(const TrainOptions& o);

// The factory's options for --model on data of `info`.
models::ModelOptions model_options_for(const TrainOptions& o, const data::DatasetInfo& info);

// The model from the factory, drawn from --seed (Note [seeded model] in
// models/registry.h), on `device` in --dtype; what the factory
// refuses (a convnet's images smaller than 4 x 4) is a UsageError in the
// flags' words.
models::Sequence build_model(const TrainOptions& o, const data::DatasetInfo& info,
                             const models::ModelOptions& options, const torch::Device& device);

// The settings other than --model and the classes that shape the model's
// tensors, as an export's metadata records them: "image_size", "width_mult"
// (mobilenetv2) and "stem" (resnets, --stem auto resolved).
std::map<std::string, std::string> shape_settings(const TrainOptions& o, const data::DataSplits& data);

// What --export-weights writes beside the weights (docs/DATA.md): the
// model, its classes ("classes" for class folders, "labels" for numbered
// ones), the shape settings, the inputs' normalisation and transforms.
std::map<std::string, std::string> weights_metadata(const TrainOptions& o, const data::DataSplits& data);

// Refuses weights whose metadata says they are of another model, for other
// classes or other input statistics than --data's; a key the file lacks
// (an older export) is not checked. Throws tandem::Error naming `path`.
void check_weights_metadata(const TrainOptions& o, const data::DataSplits& data,
                            const std::map<std::string, std::string>& metadata, const std::string& path);

// engine::load_weights into `model`, leaving out the names under `except`;
// a file whose tensors do not fit also has its shape settings that differ
// from this run's named as flags (Note [shape settings]).
void load_run_weights(const TrainOptions& o, const data::DataSplits& data, const checkpoint::SafetensorsFile& file,
                      const std::string& path, torch::nn::Module& model, const std::vector<std::string>& except = {});

// Prints, on `to`, the data's warnings not yet printed (the images left out
// by --skip-bad-images), this process's own.
void report_data_warnings(const data::DataSplits& data, std::FILE* to);

}  // namespace tandem::engine
