#include "tandem/data/source.h"

#include <filesystem>

#include "tandem/data/augment.h"
#include "tandem/data/cifar.h"
#include "tandem/data/idx.h"
#include "tandem/data/image_folder.h"
#include "tandem/data/tokens.h"
#include "tandem/util/file.h"
#include "tandem/util/check.h"

namespace tandem::data {

namespace {

constexpr const char* kFashionMnistDir = "/usr/share/datasets/fashion-mnist";

// Per-channel statistics the presets normalise with.
const std::vector<double> kCifar10Mean = {0.4914, 0.4822, 0.4465};
const std::vector<double> kCifar10Std = {0.2470, 0.2435, 0.2616};
const std::vector<double> kCifar100Mean = {0.5071, 0.4865, 0.4409};
const std::vector<double> kCifar100Std = {0.2673, 0.2564, 0.2762};
const std::vector<double> kImageNetMean = {0.485, 0.456, 0.406};
const std::vector<double> kImageNetStd = {0.229, 0.224, 0.225};

struct Spec {
  std::string kind, path;
};

Spec parse_spec(const std::string& spec) {
  if (spec == "fashion-mnist") return {"idx", kFashionMnistDir};
  auto colon = spec.find(':');
  Spec s{spec.substr(0, colon), colon == std::string::npos ? "" : spec.substr(colon + 1)};
  bool known = s.kind == "idx" || s.kind == "cifar10" || s.kind == "cifar100" ||
               s.kind == "imagefolder" || s.kind == "text" || s.kind == "tokens";
  TANDEM_CHECK_USAGE(known, "unknown data spec '", spec,
               "': expected fashion-mnist, idx:DIR, cifar10:DIR, cifar100:DIR, imagefolder:DIR, text:FILE or "
               "tokens:PATH");
  TANDEM_CHECK_USAGE(!s.path.empty(), "data spec '", spec, "': expected ", s.kind,
                     s.kind == "text" ? ":FILE" : s.kind == "tokens" ? ":PATH" : ":DIR");
  return s;
}

AugmentOptions augment_options(const DataOptions& o, const std::string& default_augment,
                               int64_t default_size, std::vector<double> mean,
                               std::vector<double> std) {
  TANDEM_CHECK(o.image_size >= 0 && o.image_size <= kMaxImageSize, "--image-size: expected 1 to ", kMaxImageSize,
               " pixels (0: the format's default), got ", o.image_size);
  AugmentOptions a;
  a.name = o.augment.empty() ? default_augment : o.augment;
  a.image_size = o.image_size > 0 ? o.image_size : default_size;
  a.mean = std::move(mean);
  a.std = std::move(std);
  return a;
}

TransformedDatasetOptions dataset_options(const DataOptions& o) {
  return {/*seed=*/o.seed, /*skip_bad_images=*/o.skip_bad_images};
}

std::shared_ptr<const Dataset> transformed(std::shared_ptr<const ImageSource> source,
                                           TransformPtr transform, const DataOptions& o) {
  return std::make_shared<TransformedDataset>(std::move(source), std::move(transform),
                                              dataset_options(o));
}

// A transform's description on one line: "Compose(\n    A\n    B\n)" as
// "Compose(A, B)".
std::string one_line(const std::string& text) {
  std::string out;
  bool in_space = false;
  for (char c : text) {
    if (c == '\n' || c == ' ') {
      in_space = in_space || c == '\n';
      if (c == ' ' && !in_space) out.push_back(c);
      continue;
    }
    if (in_space && !out.empty() && out.back() != '(' && c != ')') out += ", ";
    in_space = false;
    out.push_back(c);
  }
  return out;
}

// IDX without a preset or another size: the in-memory fast path, no transforms.
bool idx_plain(const DataOptions& o, const DatasetInfo& info) {
  return (o.augment.empty() || o.augment == "none") &&
         (o.image_size == 0 || (o.image_size == info.height && o.image_size == info.width));
}

// IDX: the in-memory fast path unless a preset or a size asks for transforms.
DataSplits open_idx_spec(const std::string& dir, const DataOptions& o) {
  auto splits = open_idx(dir);
  auto train = std::static_pointer_cast<const IdxDataset>(splits.train);
  auto info = train->info();
  splits.default_augment = "none";
  splits.default_image_size = info.height;
  const bool plain = idx_plain(o, info);
  auto a = augment_options(o, "none", 0, {train->mean()}, {train->std()});
  splits.eval_transform = one_line(make_eval_transform(a, info.height, info.width)->describe());
  if (plain) return splits;  // the same arithmetic, in memory
  auto test = std::static_pointer_cast<const IdxDataset>(splits.test);
  splits.train = transformed(std::make_shared<IdxSource>(train), make_train_transform(a, info.height, info.width), o);
  splits.test = transformed(std::make_shared<IdxSource>(test), make_eval_transform(a, info.height, info.width), o);
  return splits;
}

// --val-data idx:DIR after IDX training data: DIR's test split alone,
// normalised (and transformed) as the training data's own test split is.
std::shared_ptr<const Dataset> open_idx_eval(const std::string& dir, const DataSplits& training,
                                             const DataOptions& o) {
  auto test = open_idx_test(dir, training.mean.at(0), training.std.at(0));
  const auto info = test->info();
  const bool plain = idx_plain(o, info);
  if (plain) return test;
  auto a = augment_options(o, "none", 0, training.mean, training.std);
  return transformed(std::make_shared<IdxSource>(test), make_eval_transform(a, info.height, info.width), o);
}

DataSplits open_cifar_spec(const std::string& dir, CifarKind kind, const DataOptions& o) {
  auto cifar = open_cifar(dir, kind);
  bool ten = kind == CifarKind::kCifar10;
  auto a = augment_options(o, "cifar", 32, ten ? kCifar10Mean : kCifar100Mean,
                           ten ? kCifar10Std : kCifar100Std);
  auto eval = make_eval_transform(a, 32, 32);
  const std::string eval_text = one_line(eval->describe());
  return {transformed(cifar.train, make_train_transform(a, 32, 32), o), transformed(cifar.test, std::move(eval), o),
          "cifar", 32, a.mean, a.std, eval_text};
}

AugmentOptions image_folder_augment(const DataOptions& o) {
  return augment_options(o, "imagenet", 224, kImageNetMean, kImageNetStd);
}

TokenOptions token_options(const DataOptions& o) {
  TokenOptions t;
  t.seq_len = o.seq_len;
  t.vocab_size = o.vocab_size;
  t.tokenizer = o.tokenizer;
  return t;
}

}  // namespace

bool is_token_spec(const std::string& spec) {
  const auto kind = parse_spec(spec).kind;
  return kind == "text" || kind == "tokens";
}

DataSplits open_data(const std::string& spec, const DataOptions& options) {
  auto s = parse_spec(spec);
  if (s.kind == "text" || s.kind == "tokens") return open_tokens(s.kind, s.path, token_options(options));
  if (s.kind == "idx") return open_idx_spec(s.path, options);
  if (s.kind == "cifar10") return open_cifar_spec(s.path, CifarKind::kCifar10, options);
  if (s.kind == "cifar100") return open_cifar_spec(s.path, CifarKind::kCifar100, options);
  // imagefolder: native size unknown (it varies by image), hence 0.
  auto a = image_folder_augment(options);
  return {transformed(std::make_shared<ImageFolderSource>(s.path), make_train_transform(a, 0, 0),
                      options),
          nullptr, "imagenet", 224, a.mean, a.std, one_line(make_eval_transform(a, 0, 0)->describe())};
}

std::shared_ptr<const Dataset> open_eval_data(const std::string& spec, const DataOptions& options,
                                              const DataSplits* training) {
  auto s = parse_spec(spec);
  if (s.kind == "text" || s.kind == "tokens") return open_token_eval(s.kind, s.path, token_options(options));
  if (s.kind == "idx" && training != nullptr && training->std.size() == 1) return open_idx_eval(s.path, *training, options);
  if (s.kind != "imagefolder") return open_data(spec, options).test;
  return transformed(std::make_shared<ImageFolderSource>(s.path),
                     make_eval_transform(image_folder_augment(options), 0, 0), options);
}

std::string data_format(const std::string& spec) { return parse_spec(spec).kind; }

std::string absolute_spec(const std::string& spec) {
  const auto s = parse_spec(spec);
  if (spec == "fashion-mnist") return spec;
  auto absolute = [](const std::string& path) {
    std::error_code ec;
    const auto made = std::filesystem::absolute(path, ec).lexically_normal().string();
    return ec ? path : made;
  };
  if (s.kind != "text") return s.kind + ":" + absolute(s.path);
  std::string paths;  // text:A,B names several files
  size_t start = 0;
  while (true) {
    const size_t comma = s.path.find(',', start);
    paths += (start ? "," : "") + absolute(s.path.substr(start, comma - start));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return s.kind + ":" + paths;
}

void check_spec_folder(const std::string& spec) {
  const auto s = parse_spec(spec);
  if (s.kind == "text" || s.kind == "tokens") {
    token_spec_files(s.kind, s.path);
    return;
  }
  check_data_folder(s.kind, s.path);  // the reader's own words (fashion-mnist as idx:DIR)
}

std::string class_list(const std::vector<std::string>& names) {
  std::string text;
  for (size_t i = 0; i < names.size() && i < 8; ++i) text += (i ? ", " : "") + names[i];
  return names.size() > 8 ? text + ", ... (" + std::to_string(names.size()) + ")" : text;
}

void check_same_label_kind(const std::string& train_spec, const DatasetInfo& train, const std::string& eval_spec,
                           const std::string& flag) {
  if (eval_spec == train_spec || data_format(eval_spec) == "imagefolder") return;  // named: see check_same_classes
  const std::string what = flag + eval_spec;
  TANDEM_CHECK(train.class_names.empty(), what, ": its labels are numbers (", data_format(eval_spec),
               " data) while --data ", train_spec, " names its classes by folder (", class_list(train.class_names),
               "): nothing says which number is which class; evaluate on an imagefolder with the same "
               "class folders");
  TANDEM_CHECK(data_format(train_spec) == data_format(eval_spec), what, ": ", data_format(eval_spec),
               " labels, but --data ", train_spec, " is ", data_format(train_spec),
               " data: the same numbers name other classes; evaluate on data of the same kind");
}

void check_same_classes(const std::string& train_spec, const DatasetInfo& train,
                        const std::string& eval_spec, const DatasetInfo& eval, const std::string& flag) {
  if (eval_spec == train_spec) return;
  const std::string what = flag + eval_spec;
  const bool train_named = !train.class_names.empty(), eval_named = !eval.class_names.empty();
  if (train_named && eval_named) {
    // Labels are the index of the class folder, so both must list the same.
    TANDEM_CHECK(train.class_names == eval.class_names, what, ": its classes (", class_list(eval.class_names),
                 ") are not those of --data ", train_spec, " (", class_list(train.class_names),
                 "); labels are class folder indices, so both need the same class folders");
    return;
  }
  TANDEM_CHECK(!eval_named, what, ": it names its classes by folder (", class_list(eval.class_names),
               ") while --data ", train_spec, " numbers them (", data_format(train_spec), " data): nothing "
               "says which folder is which number; evaluate on data of the training data's kind");
  check_same_label_kind(train_spec, train, eval_spec, flag);
  TANDEM_CHECK(eval.num_classes <= train.num_classes, what, ": labels up to ", eval.num_classes - 1,
               ", but --data ", train_spec, " has ", train.num_classes, " classes (labels 0 to ",
               train.num_classes - 1, "), which the model's outputs are");
}

std::vector<std::string> data_spec_help() {
  return {"fashion-mnist     Fashion-MNIST from Debian's dataset-fashion-mnist",
          "idx:DIR           MNIST-layout IDX files in DIR (plain or .gz)",
          "cifar10:DIR       CIFAR-10 binary batches (data_batch_1..5.bin, test_batch.bin)",
          "cifar100:DIR      CIFAR-100 binary (train.bin, test.bin), fine labels",
          "imagefolder:DIR   DIR/<class>/<image>, JPEG or PNG (evaluate with --val-data)",
          "text:FILE         UTF-8 bytes as tokens (also text:A,B or text:DIR), the last tenth held out",
          "tokens:PATH       llm.c token shards or nanoGPT .bin files (a file, folder or glob; *_val_*",
          "                  and val.bin are the validation split)"};
}

}  // namespace tandem::data
