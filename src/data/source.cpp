#include "tandem/data/source.h"

#include "tandem/data/idx.h"
#include "tandem/util/check.h"

namespace tandem::data {

namespace {
constexpr const char* kFashionMnistDir = "/usr/share/datasets/fashion-mnist";
}

DataSplits open_data(const std::string& spec) {
  if (spec == "fashion-mnist") return open_idx(kFashionMnistDir);
  auto colon = spec.find(':');
  std::string kind = spec.substr(0, colon);
  std::string path = colon == std::string::npos ? "" : spec.substr(colon + 1);
  if (kind == "idx") {
    TANDEM_CHECK(!path.empty(), "data spec '", spec, "': expected idx:DIR");
    return open_idx(path);
  }
  TANDEM_FAIL("unknown data spec '", spec, "': expected fashion-mnist or idx:DIR");
}

std::vector<std::string> data_spec_help() {
  return {"fashion-mnist  Fashion-MNIST from Debian's dataset-fashion-mnist",
          "idx:DIR        MNIST-layout IDX files in DIR (plain or .gz)"};
}

}  // namespace tandem::data
