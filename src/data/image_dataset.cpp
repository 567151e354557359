#include "tandem/data/image_dataset.h"

#include <zlib.h>

#include <algorithm>
#include <sstream>

#include "tandem/data/image_io.h"
#include "tandem/util/check.h"
#include "tandem/util/file.h"

namespace tandem::data {

namespace {
std::string shape_text(const torch::Tensor& t) {
  std::ostringstream out;
  out << t.sizes();
  return out.str();
}
}  // namespace

TransformedDataset::TransformedDataset(std::shared_ptr<const ImageSource> source,
                                       TransformPtr transform, TransformedDatasetOptions options)
    : source_(std::move(source)), transform_(std::move(transform)), options_(options) {
  TANDEM_CHECK(source_ && transform_, "TransformedDataset: source and transform are required");
  TANDEM_CHECK(source_->size() > 0, source_->describe(), ": no images");
  // Note [decoding only the crop]: find a leading crop.
  if (const auto* compose = dynamic_cast<const Compose*>(transform_.get())) {
    const auto& list = compose->transforms();
    if (!list.empty()) {
      crop_first_ = dynamic_cast<const CropFirst*>(list.front().get());
      if (crop_first_) rest_ = std::make_unique<Compose>(std::vector<TransformPtr>(list.begin() + 1, list.end()));
    }
  } else {
    crop_first_ = dynamic_cast<const CropFirst*>(transform_.get());
  }
  // The first readable sample fixes the batch shape.
  torch::Tensor first;
  for (int64_t i = 0; i < source_->size() && !first.defined(); ++i) {
    try {
      first = sample(i, /*epoch=*/0);
    } catch (const ImageError& e) {
      if (!options_.skip_bad_images) throw;
      // Nothing to train on: said as such, with the last image's reason.
      TANDEM_CHECK(i + 1 < source_->size(), source_->describe(), ": no image is readable, so "
                   "--skip-bad-images leaves nothing (the last: ", e.what(), ")");
    }
  }
  TANDEM_CHECK(first.dim() == 3 && first.scalar_type() == torch::kFloat32,
               source_->describe(), ": the transform must end in a float32 [C, H, W] tensor "
               "(ToTensor), got ", first.toString(), " ", shape_text(first));
  info_.channels = first.size(0);
  info_.height = first.size(1);
  info_.width = first.size(2);
  info_.num_classes = source_->num_classes();
  info_.class_names = source_->class_names();
}

torch::Tensor TransformedDataset::sample(int64_t index, int64_t epoch, const torch::Tensor& into) const {
  SampleRng rng(options_.seed, epoch, index);
  if (crop_first_ == nullptr) {
    const auto* compose = dynamic_cast<const Compose*>(transform_.get());
    auto image = source_->image(index);
    return compose ? compose->apply_into(image, rng, into) : transform_->apply(image, rng);
  }
  auto box = source_->image_box(
      index, [&](int64_t height, int64_t width) { return crop_first_->choose_box(height, width, rng); });
  auto image = crop_first_->after_crop(box, rng);
  return rest_ ? rest_->apply_into(image, rng, into) : image;
}

torch::Tensor TransformedDataset::sample_whole(int64_t index, int64_t epoch) const {
  SampleRng rng(options_.seed, epoch, index);
  return transform_->apply(source_->image(index), rng);
}

torch::Tensor ImageSource::image_box(int64_t index, const BoxChooser& choose) const {
  auto image = this->image(index);
  auto box = choose(image.size(1), image.size(2));
  return image.slice(1, box.top, box.top + box.height).slice(2, box.left, box.left + box.width);
}

// Each sample is made into its row of the batch where the pipeline can
// write it there (Note [tabulated finish]), else copied in: no stack of
// per-sample tensors at the end. A skipped sample leaves no gap; the rows
// used are the batch.
Batch TransformedDataset::get_batch(const std::vector<int64_t>& indices, int64_t epoch) const {
  auto inputs = torch::empty({static_cast<int64_t>(indices.size()), info_.channels, info_.height,
                              info_.width});
  std::vector<int64_t> labels;
  labels.reserve(indices.size());
  for (int64_t index : indices) {
    auto row = inputs[static_cast<int64_t>(labels.size())];
    torch::Tensor image;
    try {
      image = sample(index, epoch, row);
    } catch (const ImageError& e) {
      if (!options_.skip_bad_images) throw;
      skipped_.fetch_add(1);
      std::lock_guard<std::mutex> lock(mutex_);
      if (reported_.insert(index).second) warnings_.push_back(std::string("skipped ") + e.what());
      continue;
    }
    TANDEM_CHECK(image.dim() == 3 && image.size(0) == info_.channels &&
                     image.size(1) == info_.height && image.size(2) == info_.width,
                 source_->name(index), ": transformed to ", shape_text(image),
                 " but the first image to [", info_.channels, ", ", info_.height, ", ",
                 info_.width, "]; images of different sizes need a crop or resize to one "
                 "size (--image-size, --augment)");
    if (!image.is_same(row)) row.copy_(image);
    labels.push_back(source_->label(index));
  }
  auto count = static_cast<int64_t>(labels.size());
  if (count < inputs.size(0)) inputs = inputs.narrow(0, 0, count).clone();
  return {inputs, torch::tensor(labels, torch::kInt64)};
}

std::string TransformedDataset::describe() const { return source_->describe(); }

// Note [content digest]: the ranks of a job compare their settings before
// the first collective (Note [same settings] in src/engine/trainer_setup.cpp),
// the data by size, not by path, since a node may keep its copy elsewhere.
// Two data sets of one size then passed as one: a rank given MNIST and one
// given Fashion-MNIST (60000 and 10000 images both) trained one model on
// both, and reported either's score. So each split adds a digest: CRC-32
// (zlib's) of its labels in order (int64), its class names and, where the
// images are in memory (IDX, CIFAR), their bytes. zlib computes it at
// about 4 GB/s here, so Fashion-MNIST's 55 MB cost about 15 ms and
// CIFAR-10's 184 MB about 50 ms, once per rank. An image folder's files are
// not read for it (that would cost what an epoch costs): a folder whose
// images were replaced one for one under the same names and counts passes.
uint32_t content_digest(const torch::Tensor& labels, const std::vector<std::string>& class_names,
                        const torch::Tensor& images) {
  uLong crc = crc32(0L, Z_NULL, 0);
  auto add = [&crc](const void* data, size_t left) {
    const auto* bytes = static_cast<const Bytef*>(data);
    while (left > 0) {  // crc32 takes a uInt length
      const auto chunk = static_cast<uInt>(std::min<size_t>(left, 1u << 30));
      crc = crc32(crc, bytes, chunk);
      bytes += chunk;
      left -= chunk;
    }
  };
  const auto values = labels.to(torch::kCPU, torch::kInt64).contiguous();
  add(values.data_ptr<int64_t>(), static_cast<size_t>(values.numel()) * sizeof(int64_t));
  for (const auto& name : class_names) add(name.c_str(), name.size() + 1);
  if (images.defined()) {
    const auto pixels = images.to(torch::kCPU, torch::kUInt8).contiguous();
    add(pixels.data_ptr<uint8_t>(), static_cast<size_t>(pixels.numel()));
  }
  return static_cast<uint32_t>(crc);
}

uint32_t ImageSource::content_digest() const {
  std::vector<int64_t> labels(static_cast<size_t>(size()));
  for (int64_t i = 0; i < size(); ++i) labels[static_cast<size_t>(i)] = label(i);
  return data::content_digest(torch::from_blob(labels.data(), {size()}, torch::kInt64), class_names());
}

std::vector<std::string> TransformedDataset::drain_warnings() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<std::string> out;
  out.swap(warnings_);
  return out;
}

// The readers' first check (dataset.h); here, with the other pieces the
// readers share, so that a program of the readers alone (fuzz/) needs no
// more of the layer.
void check_data_folder(const std::string& kind, const std::string& dir) {
  const std::string what = path_kind(dir);
  TANDEM_CHECK(what == "a folder", kind, ":", printable(dir),
               what == "nothing" ? std::string(": no such directory") : ": is " + what + "; expected a folder");
}

}  // namespace tandem::data
