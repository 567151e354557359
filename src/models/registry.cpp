#include "tandem/models/registry.h"

#include <filesystem>
#include <map>
#include <mutex>
#include <set>

#include "tandem/models/convnet.h"
#include "language_models.h"
#include "tandem/models/mobilenetv2.h"
#include "tandem/models/resnet.h"
#include "tandem/util/check.h"

namespace tandem::models {

torch::nn::AnyModule make_norm(const NormFactory& factory, int64_t channels) {
  if (factory) return factory(channels);
  return torch::nn::AnyModule(torch::nn::BatchNorm2d(channels));
}

std::string resolved_stem(const ModelOptions& o) {
  TANDEM_CHECK(o.stem == "auto" || o.stem == "imagenet" || o.stem == "cifar",
               "resnet stem: expected auto, imagenet or cifar, got '", o.stem, "'");
  if (o.stem != "auto") return o.stem;
  return o.image_size <= 64 ? "cifar" : "imagenet";
}
namespace {

struct Entry {
  ModelFactory factory;
  ModelTraits traits;
};

struct Registry {
  std::mutex mutex;
  std::map<std::string, Entry> factories = [] {
    std::map<std::string, Entry> built_in{
        {"convnet", {convnet, {}}},   {"mlp", {mlp, {}}},  {"resnet18", {resnet18, {}}}, {"resnet34", {resnet34, {}}},
        {"resnet50", {resnet50, {}}}, {"mobilenetv2", {mobilenetv2, {}}},
    };
    for (auto& [name, model] : language_models()) built_in.emplace(name, Entry{model.first, model.second});
    return built_in;
  }();
};

Registry& registry() {
  static Registry instance;
  return instance;
}

std::string joined_names() {
  std::string out;
  for (const auto& name : model_names()) out += (out.empty() ? "" : ", ") + name;
  return out;
}

Entry find(const std::string& name) {
  Entry entry;
  for (int pass = 0; pass < 2 && !entry.factory; ++pass) {
    if (pass == 1 && !resolve_model_name(name)) break;
    std::lock_guard<std::mutex> lock(registry().mutex);
    auto it = registry().factories.find(name);
    if (it != registry().factories.end()) entry = it->second;
  }
  TANDEM_CHECK_USAGE(entry.factory, "unknown model '", name, "' (known: ", joined_names(), ")");
  return entry;
}

struct Resolvers {
  std::recursive_mutex mutex;  // held while one resolves: a name is read once
  std::map<std::string, ModelResolver> by_prefix;
  std::set<std::string> resolved;
};

Resolvers& resolvers() {
  static Resolvers instance;
  return instance;
}

}  // namespace

void add_model_resolver(const std::string& prefix, ModelResolver resolver) {
  std::lock_guard<std::recursive_mutex> lock(resolvers().mutex);
  resolvers().by_prefix[prefix] = std::move(resolver);
}

bool resolve_model_name(const std::string& name) {
  auto& r = resolvers();
  std::lock_guard<std::recursive_mutex> lock(r.mutex);
  for (const auto& [prefix, resolve] : r.by_prefix) {
    if (name.rfind(prefix, 0) != 0) continue;
    if (r.resolved.count(name) == 0) {
      resolve(name);  // throws, naming what is wrong, or registers the name
      r.resolved.insert(name);
    }
    return true;
  }
  return false;
}

std::string canonical_model_name(const std::string& name) {
  if (name.rfind("hf:", 0) != 0 || name.size() == 3) return name;
  std::error_code ec;
  const auto path = std::filesystem::absolute(name.substr(3), ec);
  return ec ? name : "hf:" + path.lexically_normal().string();
}

void register_model(const std::string& name, ModelFactory factory, ModelTraits traits) {
  std::lock_guard<std::mutex> lock(registry().mutex);
  bool inserted = registry().factories.emplace(name, Entry{std::move(factory), std::move(traits)}).second;
  TANDEM_CHECK(inserted, "model '", name, "' is already registered");
}

Sequence make_model(const std::string& name, const ModelOptions& options) { return find(name).factory(options); }

std::unique_lock<std::mutex> hold_default_generator() {
  static std::mutex generator;
  return std::unique_lock<std::mutex>(generator);
}

Sequence make_seeded_model(const std::string& name, const ModelOptions& options, uint64_t seed) {
  auto held = hold_default_generator();
  torch::manual_seed(seed);
  return make_model(name, options);
}

ModelTraits model_traits(const std::string& name) { return find(name).traits; }

bool is_language_model(const std::string& name) { return model_traits(name).kind == ModelKind::kLanguageModel; }

std::vector<std::string> model_names() {
  std::lock_guard<std::mutex> lock(registry().mutex);
  std::vector<std::string> names;
  for (const auto& entry : registry().factories) names.push_back(entry.first);
  return names;
}

int64_t count_parameters(const torch::nn::Module& module) {
  int64_t total = 0;
  for (const auto& p : module.parameters()) total += p.numel();
  return total;
}

torch::ScalarType parameter_dtype(const torch::nn::Module& module) {
  auto parameters = module.parameters();
  return parameters.empty() ? torch::kFloat32 : parameters.front().scalar_type();
}

int64_t to_channels_last(torch::nn::Module& module) {
  torch::NoGradGuard no_grad;
  int64_t converted = 0;
  for (auto& p : module.parameters()) {
    if (p.dim() != 4) continue;
    p.set_data(p.data().contiguous(torch::MemoryFormat::ChannelsLast));
    ++converted;
  }
  return converted;
}

}  // namespace tandem::models
