#include "tandem/data/idx.h"

#include <zlib.h>

#include <array>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <tuple>

#include "tandem/util/check.h"
#include "tandem/util/file.h"
#include "tandem/util/table.h"

namespace tandem::data {
namespace {

namespace fs = std::filesystem;

// Note [gzip input]: an IDX file is plain or gzip (one member or several,
// as `cat a.gz b.gz` makes), told apart by gzip's magic bytes 1f 8b. zlib's
// inflate decompresses; the loop around it is ours so that bytes after the
// last member are refused: gzread skips them unseen.
class IdxInput {
 public:
  explicit IdxInput(const std::string& path) : path_(path), in_(path, std::ios::binary) {
    TANDEM_CHECK(in_.is_open(), path, ": cannot open");
    fill();
    gzip_ = available() >= 2 && next_[0] == 0x1f && next_[1] == 0x8b;
    if (gzip_) {
      TANDEM_CHECK(inflateInit2(&z_, 16 + MAX_WBITS) == Z_OK, path, ": cannot start zlib");
    }
  }
  ~IdxInput() {
    if (gzip_) inflateEnd(&z_);
  }
  IdxInput(const IdxInput&) = delete;
  IdxInput& operator=(const IdxInput&) = delete;

  // Reads up to `n` bytes, fewer only at the end of the data; throws on a
  // corrupt or cut gzip stream, or bytes after it.
  int64_t read(void* out, int64_t n) {
    auto* bytes = static_cast<unsigned char*>(out);
    int64_t done = 0;
    while (done < n) {
      if (available() == 0) fill();
      if (!gzip_) {
        if (available() == 0) break;
        const int64_t take = std::min<int64_t>(n - done, available());
        std::memcpy(bytes + done, next_, take);
        next_ += take;
        done += take;
        continue;
      }
      if (member_ended_) {  // another member, or the end of the file
        if (available() == 0) break;
        TANDEM_CHECK(available() >= 2 ? next_[0] == 0x1f && next_[1] == 0x8b : next_[0] == 0x1f, path_,
                     ": unexpected bytes after the gzip stream");
        TANDEM_CHECK(inflateReset(&z_) == Z_OK, path_, ": cannot restart zlib");
        member_ended_ = false;
      }
      TANDEM_CHECK(available() > 0, path_, ": truncated gzip stream");
      z_.next_in = next_;
      z_.avail_in = static_cast<uInt>(available());
      z_.next_out = bytes + done;
      z_.avail_out = static_cast<uInt>(std::min<int64_t>(n - done, int64_t(1) << 30));
      const uInt before = z_.avail_out;
      const int rc = inflate(&z_, Z_NO_FLUSH);
      next_ = z_.next_in;
      done += before - z_.avail_out;
      if (rc == Z_STREAM_END) {
        member_ended_ = true;
      } else {
        TANDEM_CHECK(rc == Z_OK || rc == Z_BUF_ERROR, path_, ": cannot read (",
                     z_.msg != nullptr ? z_.msg : "corrupt gzip data", ")");
      }
    }
    return done;
  }

 private:
  int64_t available() const { return end_ - next_; }
  void fill() {
    in_.read(reinterpret_cast<char*>(buffer_.data()), static_cast<std::streamsize>(buffer_.size()));
    TANDEM_CHECK(!in_.bad(), path_, ": cannot read");
    next_ = buffer_.data();
    end_ = next_ + in_.gcount();
  }

  std::string path_;
  std::ifstream in_;
  std::array<unsigned char, 1 << 16> buffer_{};
  unsigned char* next_ = nullptr;
  unsigned char* end_ = nullptr;
  bool gzip_ = false;
  bool member_ended_ = false;
  z_stream z_{};
};

uint32_t big_endian(const unsigned char* p) {
  return (uint32_t(p[0]) << 24) | (uint32_t(p[1]) << 16) | (uint32_t(p[2]) << 8) | p[3];
}

std::string find_file(const fs::path& dir, const std::string& name) {
  // Whatever is there by that name, read_idx names it if it is not a file.
  for (const auto& candidate : {dir / name, dir / (name + ".gz")}) {
    if (path_kind(candidate.string()) != "nothing") return candidate.string();
  }
  TANDEM_FAIL("idx:", dir.string(), ": missing ", name, " (or ", name, ".gz)");
}

}  // namespace

torch::Tensor read_idx(const std::string& path, int64_t expected_dims) {
  check_regular_file(path, "an IDX file");  // Note [special files]
  IdxInput file(path);
  std::array<unsigned char, 4> magic{};
  TANDEM_CHECK(file.read(magic.data(), 4) == 4, path,
               ": truncated: expected a 4-byte IDX header");
  uint32_t expected_magic = 0x0800u | static_cast<uint32_t>(expected_dims);
  TANDEM_CHECK(big_endian(magic.data()) == expected_magic, path,
               ": not an IDX file of unsigned bytes with ", expected_dims,
               " dimensions: magic number ", format("0x%08x", big_endian(magic.data())),
               ", expected ", format("0x%08x", expected_magic));
  std::vector<int64_t> shape(expected_dims);
  int64_t count = 1;
  for (auto& dim : shape) {
    unsigned char raw[4];
    TANDEM_CHECK(file.read(raw, 4) == 4, path, ": truncated in the dimension sizes");
    dim = big_endian(raw);
    TANDEM_CHECK(dim > 0 && dim <= (int64_t(1) << 31), path, ": implausible dimension size ", dim);
    // Checked before multiplying: the product of three sizes up to 2^31
    // overflows int64 (a fuzzing find, fuzz/regressions/idx).
    TANDEM_CHECK(count <= (int64_t(1) << 36) / dim, path, ": implausible total size");
    count *= dim;
  }
  // The header's size is a claim: memory grows with the bytes that actually
  // arrive (doubling from 16 MiB), so a lying header cannot make the reader
  // allocate gigabytes before it finds the file truncated (a fuzzing find,
  // fuzz/regressions/idx).
  auto data = torch::empty({std::min<int64_t>(count, int64_t(1) << 24)}, torch::kUInt8);
  int64_t got = 0;
  while (got < count) {
    if (got == data.numel()) data.resize_({std::min<int64_t>(count, 2 * data.numel())});
    int64_t want = data.numel() - got;
    int64_t n = file.read(data.data_ptr<uint8_t>() + got, want);
    got += n;
    if (n < want) break;  // the end of the file
  }
  TANDEM_CHECK(got == count, path, ": truncated: expected ", count, " bytes of data, found ", got);
  auto tensor = data.view(shape);
  unsigned char extra;
  TANDEM_CHECK(file.read(&extra, 1) == 0, path, ": unexpected bytes after the ", count,
               " bytes of data");
  return tensor;
}

IdxDataset::IdxDataset(torch::Tensor images, torch::Tensor labels, double mean, double std,
                       std::string description)
    : images_(std::move(images)),
      labels_(std::move(labels)),
      mean_(mean),
      std_(std),
      description_(std::move(description)) {
  TANDEM_CHECK(images_.dim() == 3, description_, ": images must be [N, H, W]");
  TANDEM_CHECK(labels_.dim() == 1 && labels_.size(0) == images_.size(0), description_,
               ": ", images_.size(0), " images but ", labels_.size(0), " labels");
  num_classes_ = labels_.numel() ? labels_.max().item<int64_t>() + 1 : 0;
}

DatasetInfo IdxDataset::info() const {
  return {/*channels=*/1, images_.size(1), images_.size(2), num_classes_, /*class_names=*/{}};
}

Batch IdxDataset::get_batch(const std::vector<int64_t>& indices, int64_t /*epoch*/) const {
  auto index = torch::tensor(indices, torch::kInt64);
  auto images = images_.index_select(0, index).to(torch::kFloat32);
  images = images.div_(255.0).sub_(mean_).div_(std_).unsqueeze(1);
  return {images, labels_.index_select(0, index).to(torch::kInt64)};
}

uint32_t IdxDataset::content_digest() const { return data::content_digest(labels_, {}, images_); }

std::string IdxSource::name(int64_t index) const {
  return format("%s, image %lld", data_->describe().c_str(), static_cast<long long>(index));
}

namespace {

fs::path idx_root(const std::string& dir) {
  check_data_folder("idx", dir);
  return fs::path(dir);
}

// One split's images and labels ("train" or "t10k"), and the labels' path.
std::tuple<torch::Tensor, torch::Tensor, std::string> load_split(const fs::path& root, const std::string& prefix) {
  auto images_path = find_file(root, prefix + "-images-idx3-ubyte");
  auto labels_path = find_file(root, prefix + "-labels-idx1-ubyte");
  auto images = read_idx(images_path, 3);
  auto labels = read_idx(labels_path, 1);
  TANDEM_CHECK(images.size(0) == labels.size(0), images_path, " holds ", images.size(0),
               " images but ", labels_path, " holds ", labels.size(0), " labels");
  return {images, labels, labels_path};
}

std::string split_name(const std::string& dir, const char* split, const torch::Tensor& images) {
  return format("idx:%s %s (%lld images)", dir.c_str(), split, static_cast<long long>(images.size(0)));
}

}  // namespace

std::shared_ptr<const IdxDataset> open_idx_test(const std::string& dir, double mean, double std) {
  auto [images, labels, labels_path] = load_split(idx_root(dir), "t10k");
  return std::make_shared<IdxDataset>(images, labels, mean, std, split_name(dir, "test", images));
}

DataSplits open_idx(const std::string& dir) {
  const fs::path root = idx_root(dir);
  auto [train_images, train_labels, train_labels_path] = load_split(root, "train");
  auto [test_images, test_labels, test_labels_path] = load_split(root, "t10k");
  // IDX has no class count: it is the training labels' largest plus one. So
  // a damaged label byte (255) would silently make a 256-class model; the
  // classes 0..K-1 must each have a training image, and the test labels
  // must be among them.
  if (train_labels.numel() > 0) {
    const int64_t classes = train_labels.max().item<int64_t>() + 1;
    auto counts = torch::bincount(train_labels.to(torch::kInt64), {}, classes);
    auto empty = (counts == 0).nonzero();
    if (empty.numel() > 0) {
      const int64_t item = train_labels.argmax().item<int64_t>();
      TANDEM_FAIL(train_labels_path, ": item ", item, " has label ", classes - 1, ", but class ",
                  empty[0].item<int64_t>(), " has no training image (", empty.size(0),
                  " classes below it have none); expected labels 0..K-1, every class present "
                  "(a damaged label?)");
    }
    if (test_labels.numel() > 0) {
      const int64_t item = test_labels.argmax().item<int64_t>();
      const int64_t label = test_labels[item].item<int64_t>();
      TANDEM_CHECK(label < classes, test_labels_path, ": item ", item, " has label ", label,
                   ", but the training labels are 0..", classes - 1);
    }
  }
  TANDEM_CHECK(train_images.sizes().slice(1) == test_images.sizes().slice(1), "idx:", dir,
               ": training and test images differ in size");
  // The statistics from a histogram of the bytes: exact, and without a
  // float64 copy of every image (eight times the data set: 376 MB for
  // Fashion-MNIST, briefly, in every worker; Note [worker footprint]).
  double mean = 0.0, std = 0.0;
  {
    const auto counts = torch::bincount(train_images.flatten(), {}, 256).to(torch::kInt64).contiguous();
    const int64_t* c = counts.data_ptr<int64_t>();
    __int128 n = 0, sum = 0, squares = 0;
    for (int64_t v = 0; v < 256; ++v) {
      n += c[v];
      sum += static_cast<__int128>(c[v]) * v;
      squares += static_cast<__int128>(c[v]) * v * v;
    }
    if (n > 0) mean = static_cast<double>(static_cast<long double>(sum) / static_cast<long double>(n) / 255.0L);
    if (n > 1) {  // the unbiased variance, as torch's std()
      const __int128 numerator = n * squares - sum * sum;
      std = static_cast<double>(std::sqrt(static_cast<long double>(numerator) /
                                          (static_cast<long double>(n) * static_cast<long double>(n - 1))) /
                                255.0L);
    }
  }
  // Inputs are normalised by (x - mean) / std: images all of one value
  // would make every input NaN (or, with rounding, huge), as torchvision's
  // Normalize refuses. Compared exactly on the bytes.
  TANDEM_CHECK(train_images.numel() > 0 && train_images.max().item<int64_t>() > train_images.min().item<int64_t>(),
               find_file(root, "train-images-idx3-ubyte"), ": every pixel of the ", train_images.size(0),
               " training images is ", train_images.numel() ? train_images.max().item<int64_t>() : 0,
               ": images without any variance cannot be normalised (standard deviation 0); expected images "
               "that differ");
  DataSplits splits;
  splits.train = std::make_shared<IdxDataset>(train_images, train_labels, mean, std,
                                              split_name(dir, "train", train_images));
  splits.test = std::make_shared<IdxDataset>(test_images, test_labels, mean, std, split_name(dir, "test", test_images));
  splits.mean = {mean};
  splits.std = {std};
  return splits;
}

}  // namespace tandem::data
