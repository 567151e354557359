#include "tandem/checkpoint/safetensors.h"

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <nlohmann/json.hpp>

#include "tandem/util/atomic_file.h"
#include "tandem/util/check.h"
#include "tandem/util/file.h"

namespace tandem::checkpoint {
namespace {

using json = nlohmann::json;

const std::vector<std::pair<torch::ScalarType, std::string>>& safetensors_dtype_names() {
  static const std::vector<std::pair<torch::ScalarType, std::string>> names = {
      {torch::kFloat64, "F64"}, {torch::kFloat32, "F32"}, {torch::kFloat16, "F16"},
      {torch::kBFloat16, "BF16"}, {torch::kInt64, "I64"}, {torch::kInt32, "I32"},
      {torch::kInt16, "I16"}, {torch::kInt8, "I8"}, {torch::kUInt8, "U8"},
      {torch::kBool, "BOOL"}};
  return names;
}

std::string dtype_name(torch::ScalarType type) {
  for (const auto& [t, name] : safetensors_dtype_names()) {
    if (t == type) return name;
  }
  TANDEM_FAIL("safetensors: unsupported tensor type ", c10::toString(type));
}

std::optional<torch::ScalarType> dtype_from(const std::string& name) {
  for (const auto& [t, n] : safetensors_dtype_names()) {
    if (n == name) return t;
  }
  return std::nullopt;
}

}  // namespace

void write_safetensors(const std::string& path, const NamedTensors& tensors,
                       const std::map<std::string, std::string>& metadata) {
  json header = json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::vector<torch::Tensor> contiguous;
  int64_t offset = 0;
  for (const auto& [name, tensor] : tensors) {
    TANDEM_CHECK(!header.contains(name), path, ": duplicate tensor name '", name, "'");
    auto t = tensor.detach().to(torch::kCPU).contiguous();
    int64_t bytes = t.numel() * static_cast<int64_t>(t.element_size());
    header[name] = {{"dtype", dtype_name(t.scalar_type())},
                    {"shape", t.sizes().vec()},
                    {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
    contiguous.push_back(t);
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // data starts 8-byte aligned
  write_atomically(path, [&](const std::string& tmp) {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    TANDEM_CHECK(out, tmp, ": cannot create: ", std::strerror(errno));
    uint64_t length = text.size();
    unsigned char le[8];
    for (int i = 0; i < 8; ++i) le[i] = static_cast<unsigned char>(length >> (8 * i));
    out.write(reinterpret_cast<const char*>(le), 8);
    out.write(text.data(), static_cast<std::streamsize>(text.size()));
    for (const auto& t : contiguous) {
      out.write(static_cast<const char*>(t.data_ptr()),
                static_cast<std::streamsize>(t.numel() * t.element_size()));
    }
    out.flush();
    TANDEM_CHECK(out, tmp, ": write failed (disk full?)");
  });
}

SafetensorsFile read_safetensors(const std::string& path) {
  std::error_code ec;
  check_regular_file(path, "a safetensors file");  // Note [special files]
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    const int why = errno;
    TANDEM_FAIL(path, ": cannot open: ", std::filesystem::exists(path, ec) ? std::strerror(why) : "no such file");
  }
  in.seekg(0, std::ios::end);
  int64_t file_size = in.tellg();
  in.seekg(0);
  TANDEM_CHECK(file_size >= 8, path, ": not a safetensors file (shorter than its 8-byte header length)");
  unsigned char le[8];
  in.read(reinterpret_cast<char*>(le), 8);
  // A zip archive ("PK\3\4"): a tandem checkpoint given where weights go.
  TANDEM_CHECK(!(le[0] == 'P' && le[1] == 'K' && le[2] == 3 && le[3] == 4), path,
               ": a zip archive (a --checkpoint-dir checkpoint?), not a safetensors file; "
               "weights are what --export-weights writes");
  uint64_t length = 0;
  for (int i = 7; i >= 0; --i) length = (length << 8) | le[i];
  TANDEM_CHECK(length <= static_cast<uint64_t>(file_size - 8) && length <= (100u << 20), path,
               ": header length ", length, " exceeds the file (", file_size, " bytes)");
  std::string text(length, '\0');
  in.read(text.data(), static_cast<std::streamsize>(length));
  json header;
  try {
    // A name given twice would silently load the last (the spec allows one).
    std::set<std::string> names;
    header = json::parse(text, [&](int depth, json::parse_event_t event, json& parsed) {
      if (depth == 1 && event == json::parse_event_t::key && !names.insert(parsed.get<std::string>()).second) {
        throw Error(path + ": tensor '" + parsed.get<std::string>() + "' is named twice in the header");
      }
      return true;
    });
  } catch (const json::exception& e) {
    TANDEM_FAIL(path, ": header is not valid JSON (", e.what(), ")");
  }
  TANDEM_CHECK(header.is_object(), path, ": header must be a JSON object");
  int64_t data_size = file_size - 8 - static_cast<int64_t>(length);
  SafetensorsFile result;
  std::vector<std::tuple<int64_t, std::string, torch::Tensor>> entries;
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") {
      TANDEM_CHECK(entry.is_object(), path, ": __metadata__ must be an object");
      for (const auto& [k, v] : entry.items()) {
        TANDEM_CHECK(v.is_string(), path, ": metadata value of '", k, "' must be a string");
        result.metadata[k] = v.get<std::string>();
      }
      continue;
    }
    const std::string& key = name;  // a lambda may not capture a structured binding (C++17)
    auto where = [&] { return path + ": tensor '" + key + "'"; };
    TANDEM_CHECK(entry.is_object() && entry.contains("dtype") && entry.contains("shape") &&
                     entry.contains("data_offsets"),
                 where(), ": expected dtype, shape and data_offsets");
    TANDEM_CHECK(entry["dtype"].is_string(), where(), ": dtype must be a string");
    auto dtype = dtype_from(entry["dtype"].get<std::string>());
    TANDEM_CHECK(dtype, where(), ": unsupported dtype ", entry["dtype"].dump());
    TANDEM_CHECK(entry["shape"].is_array(), where(), ": shape must be an array");
    std::vector<int64_t> shape;
    int64_t numel = 1;
    for (const auto& d : entry["shape"]) {
      TANDEM_CHECK(d.is_number_unsigned() && d.get<uint64_t>() < (uint64_t(1) << 40), where(),
                   ": bad dimension ", d.dump());
      shape.push_back(d.get<int64_t>());
      numel *= shape.back();
      TANDEM_CHECK(numel < (int64_t(1) << 40), where(), ": shape too large");
    }
    const auto& offsets = entry["data_offsets"];
    TANDEM_CHECK(offsets.is_array() && offsets.size() == 2 && offsets[0].is_number_unsigned() &&
                     offsets[1].is_number_unsigned(),
                 where(), ": data_offsets must be two non-negative integers");
    int64_t begin = offsets[0].get<int64_t>(), end = offsets[1].get<int64_t>();
    int64_t bytes = numel * static_cast<int64_t>(c10::elementSize(*dtype));
    TANDEM_CHECK(begin <= end && end <= data_size && end - begin == bytes, where(),
                 ": data_offsets [", begin, ", ", end, "] do not hold ", bytes,
                 " bytes within the ", data_size, " bytes of data");
    auto tensor = torch::empty(shape, torch::TensorOptions().dtype(*dtype));
    in.seekg(8 + static_cast<int64_t>(length) + begin);
    in.read(static_cast<char*>(tensor.data_ptr()), bytes);
    TANDEM_CHECK(in, where(), ": cannot read its data");
    entries.emplace_back(begin, name, tensor);
  }
  std::sort(entries.begin(), entries.end(),
            [](const auto& a, const auto& b) { return std::get<0>(a) < std::get<0>(b); });
  // The format's rule: the tensors cover the data exactly, in order, with no
  // overlap (one tensor's bytes read as another's), gap or bytes after.
  int64_t covered = 0;
  for (auto& [begin, name, tensor] : entries) {
    TANDEM_CHECK(begin == covered, path, ": tensor '", name, "' starts at byte ", begin, " of the data, "
                 "expected ", covered, " (tensors must cover the data in order, without overlap or gap)");
    covered += static_cast<int64_t>(tensor.nbytes());
    result.tensors.emplace_back(name, tensor);
  }
  TANDEM_CHECK(covered == data_size, path, ": ", data_size - covered,
               " bytes after the last tensor's data");
  return result;
}

namespace {
// Whether tensor `name` is `prefix` itself or lies in the module it names.
bool under(const std::string& name, const std::string& prefix) {
  return name == prefix || name.rfind(prefix + ".", 0) == 0;
}
bool ends_with(const std::string& name, const std::string& suffix) {
  return name.size() >= suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

void load_weights(const std::string& path, torch::nn::Module& module,
                  const std::vector<std::string>& except) {
  load_weights(read_safetensors(path), path, module, except);
}

void load_weights(const SafetensorsFile& file, const std::string& path, torch::nn::Module& module,
                  const std::vector<std::string>& except) {
  auto excepted = [&](const std::string& name) {
    return std::any_of(except.begin(), except.end(), [&](const auto& prefix) { return under(name, prefix); });
  };
  std::map<std::string, torch::Tensor> found;
  for (const auto& [name, tensor] : file.tensors) {
    if (!excepted(name)) found.emplace(name, tensor);
  }
  auto names = module.named_parameters().keys();
  for (const auto& b : module.named_buffers()) names.push_back(b.key());
  for (const auto& prefix : except) {  // a misspelt name would load what it meant to skip
    bool matches =
        std::any_of(names.begin(), names.end(), [&](const auto& name) { return under(name, prefix); });
    TANDEM_CHECK_USAGE(matches, "'", prefix, "' names no parameter or buffer of the model (loading ", path, ")");
  }
  std::vector<std::pair<torch::Tensor, torch::Tensor>> copies;  // (the module's, the file's)
  auto take = [&](const std::string& name, const torch::Tensor& target, const char* kind) {
    auto it = found.find(name);
    TANDEM_CHECK(it != found.end(), path, ": no tensor for the model's ", kind, " '", name, "'");
    TANDEM_CHECK(it->second.sizes() == target.sizes(), path, ": tensor '", name, "' has shape ",
                 it->second.sizes(), ", the model's ", kind, " has ", target.sizes());
    // A float tensor given as integers (or the other way) converts silently
    // to nonsense; a float one must also be finite.
    // BatchNorm's step count is the exception: an integer in PyTorch's
    // state_dict (torchvision's files), a float in tandem's models (libtorch's
    // Module::to converts every buffer); a count converts exactly.
    const bool count = ends_with(name, "num_batches_tracked") && !it->second.is_floating_point() &&
                       it->second.scalar_type() != torch::kBool;
    TANDEM_CHECK(count || it->second.is_floating_point() == target.is_floating_point(), path, ": tensor '", name,
                 "' is ", dtype_name(it->second.scalar_type()), ", the model's ", kind, " is ",
                 target.scalar_type());
    TANDEM_CHECK(!it->second.is_floating_point() || torch::isfinite(it->second).all().item<bool>(), path,
                 ": tensor '", name, "' holds NaN or infinite values");
    // A negative variance makes BatchNorm's output NaN (eval printed
    // "test loss -nan" and exited 0).
    TANDEM_CHECK(!ends_with(name, "running_var") || (it->second >= 0).all().item<bool>(), path, ": tensor '",
                 name, "' holds negative values; a running variance is >= 0");
    copies.emplace_back(target, it->second);
    found.erase(it);
  };
  for (const auto& p : module.named_parameters()) {
    if (!excepted(p.key())) take(p.key(), p.value(), "parameter");
  }
  for (const auto& b : module.named_buffers()) {
    if (!excepted(b.key())) take(b.key(), b.value(), "buffer");
  }
  TANDEM_CHECK(found.empty(), path, ": tensor '", found.empty() ? "" : found.begin()->first,
               "' is not a parameter or buffer of the model (", found.size(), " such)");
  torch::NoGradGuard no_grad;
  for (auto& [target, source] : copies) target.copy_(source);
}

}  // namespace tandem::checkpoint
