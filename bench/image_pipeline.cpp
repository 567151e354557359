// bench/image_pipeline: images per second out of tandem's loader.
//
// Iterates a DataLoader over --data with the training transforms of
// --augment at --image-size, shuffled, --workers threads, and prints one JSON
// line. bench/image_pipeline.sh runs it against torchvision's DataLoader
// (bench/image_pipeline.py) on the same files.
//
//   image_pipeline --data imagefolder:DIR --augment heavy --image-size 224 --workers 2
#include <cstdio>

#include "bench_main.h"
#include "tandem/util/cuda_module.h"
#include "tandem/cli/flags.h"
#include "tandem/data/loader.h"
#include "tandem/data/source.h"
#include "tandem/util/allocator.h"
#include "tandem/util/stopwatch.h"

using namespace tandem;

int main(int argc, char** argv) {
  tune_malloc_for_training();
  tandem::cuda::load_when_present();  // Note [CUDA as a module]
  std::string spec, augment = "heavy";
  int64_t image_size = 224, workers = 1, batch = 64, batches = 20;
  cli::FlagSet flags("image_pipeline", "Images per second out of tandem's loader.");
  flags.add_string("data", "SPEC", &spec, "cifar10:DIR or imagefolder:DIR");
  flags.add_string("augment", "NAME", &augment, "transform preset");
  flags.add_int("image-size", "N", &image_size, "output size", 1);
  flags.add_int("workers", "N", &workers, "loader threads", 1);
  flags.add_int("batch", "N", &batch, "batch size", 1);
  flags.add_int("batches", "N", &batches, "timed batches (after one untimed)", 1);
  return bench::run("image_pipeline", flags, argc, argv, [&] {
    data::DataOptions options;
    options.augment = augment;
    options.image_size = image_size;
    auto dataset = data::open_data(spec, options).train;
    data::LoaderOptions lo;
    lo.batch_size = batch;
    lo.workers = workers;
    lo.drop_last = true;
    data::DataLoader loader(dataset, std::make_shared<data::RandomSampler>(dataset->size(), 0), lo);
    TANDEM_CHECK(loader.num_batches() > batches, spec, ": needs more than ", batches + 1,
                 " batches of ", batch);
    auto it = loader.epoch(0);
    it->next();  // workers started and warm, as on the Python side
    Stopwatch clock;
    int64_t n = 0;
    for (int64_t b = 0; b < batches; ++b) n += it->next()->size();
    double seconds = clock.seconds();
    std::printf("{\"impl\": \"tandem\", \"data\": \"%s\", \"augment\": \"%s\", \"size\": %lld, "
                "\"workers\": %lld, \"images_per_second\": %.1f}\n",
                spec.substr(0, spec.find(':')).c_str(), augment.c_str(),
                static_cast<long long>(image_size), static_cast<long long>(workers), n / seconds);
  });
}
