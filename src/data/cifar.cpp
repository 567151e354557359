#include "tandem/data/cifar.h"

#include <filesystem>
#include <cerrno>
#include <cstring>
#include <fstream>

#include "tandem/util/check.h"
#include "tandem/util/file.h"
#include "tandem/util/table.h"

namespace tandem::data {

namespace fs = std::filesystem;

namespace {

constexpr int64_t kPixels = 3 * 32 * 32;

struct Layout {
  const char* spec;        // "cifar10"
  const char* subdir;      // where the archive unpacks
  int64_t label_bytes;     // bytes before the pixels
  int64_t label_offset;    // which of them is the label
  int64_t num_classes;
  std::vector<std::string> train_files, test_files;
};

Layout layout(CifarKind kind) {
  if (kind == CifarKind::kCifar10) {
    return {"cifar10", "cifar-10-batches-bin", 1, 0, 10,
            {"data_batch_1.bin", "data_batch_2.bin", "data_batch_3.bin", "data_batch_4.bin",
             "data_batch_5.bin"},
            {"test_batch.bin"}};
  }
  return {"cifar100", "cifar-100-binary", 2, 1, 100, {"train.bin"}, {"test.bin"}};
}

torch::Tensor read_bytes(const std::string& path) {
  std::string bytes = read_regular_file(path, "a CIFAR binary batch file");  // Note [special files]
  return torch::from_blob(bytes.data(), {static_cast<int64_t>(bytes.size())}, torch::kUInt8).clone();
}

}  // namespace

CifarSource::CifarSource(torch::Tensor images, torch::Tensor labels, int64_t num_classes,
                         std::string description)
    : images_(std::move(images)),
      labels_(std::move(labels)),
      num_classes_(num_classes),
      description_(std::move(description)) {}

uint32_t CifarSource::content_digest() const { return data::content_digest(labels_, {}, images_); }

std::string CifarSource::name(int64_t index) const {
  return format("%s, record %lld", description_.c_str(), static_cast<long long>(index));
}

std::shared_ptr<CifarSource> read_cifar(const std::vector<std::string>& files, CifarKind kind,
                                        const std::string& description) {
  auto l = layout(kind);
  int64_t record = l.label_bytes + kPixels;
  std::vector<torch::Tensor> images, labels;
  for (const auto& path : files) {
    auto bytes = read_bytes(path);
    int64_t size = bytes.size(0);
    TANDEM_CHECK(size > 0 && size % record == 0, path, ": ", size,
                 " bytes is not a whole number of ", record, "-byte ", l.spec,
                 " records (truncated or not a ", l.spec, " binary file?)");
    auto records = bytes.view({size / record, record});
    auto label = records.select(1, l.label_offset).to(torch::kInt64);
    int64_t max_label = label.max().item<int64_t>();
    if (max_label >= l.num_classes) {
      int64_t at = label.argmax().item<int64_t>();
      TANDEM_FAIL(path, ": record ", at, " has label ", max_label, ", expected 0..",
                  l.num_classes - 1, " (not a ", l.spec, " binary file?)");
    }
    images.push_back(records.slice(1, l.label_bytes).reshape({-1, 3, 32, 32}));
    labels.push_back(label);
  }
  TANDEM_CHECK(!images.empty(), description, ": no files");
  auto all_images = torch::cat(images).contiguous();
  auto all_labels = torch::cat(labels);
  return std::make_shared<CifarSource>(
      all_images, all_labels, l.num_classes,
      format("%s (%lld images)", description.c_str(), static_cast<long long>(all_images.size(0))));
}

CifarSplits open_cifar(const std::string& dir, CifarKind kind) {
  auto l = layout(kind);
  fs::path root(dir);
  check_data_folder(l.spec, dir);
  if (fs::is_directory(root / l.subdir)) root /= l.subdir;
  auto paths = [&](const std::vector<std::string>& names) {
    std::vector<std::string> out;
    for (const auto& name : names) {
      auto path = root / name;
      const std::string kind = path_kind(path.string());
      if (kind != "nothing" && kind != "a link to nothing") check_regular_file(path.string(), "a CIFAR binary batch file");
      TANDEM_CHECK(kind == "a regular file", l.spec, ":", dir, ": missing ", path.string(),
                   " (expected ", l.spec == std::string("cifar10")
                                     ? "data_batch_1.bin .. data_batch_5.bin and test_batch.bin"
                                     : "train.bin and test.bin",
                   ")");
      out.push_back(path.string());
    }
    return out;
  };
  auto train_files = paths(l.train_files);
  auto test_files = paths(l.test_files);
  std::string base = std::string(l.spec) + ":" + dir;
  return {read_cifar(train_files, kind, base + " train"),
          read_cifar(test_files, kind, base + " test")};
}

}  // namespace tandem::data
