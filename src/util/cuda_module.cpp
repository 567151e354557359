// Finding and loading the CUDA module (Note [CUDA as a module] in
// tandem/util/cuda_module.h).
#include "tandem/util/cuda_module.h"

#include <dlfcn.h>
#include <unistd.h>

#include <mutex>
#include <vector>

#include "tandem/util/env.h"

// The module's places, set by src/util/CMakeLists.txt: this build tree's,
// then the install's ("" where this build has no CUDA half).
#ifndef TANDEM_CUDA_MODULE_BUILD
#define TANDEM_CUDA_MODULE_BUILD ""
#endif
#ifndef TANDEM_CUDA_MODULE_INSTALL
#define TANDEM_CUDA_MODULE_INSTALL ""
#endif

namespace tandem::cuda {

namespace {

struct State {
  std::mutex mutex;
  bool tried = false;
  const void* parts = nullptr;  // a Parts (tandem/cuda/parts.h)
  std::string error;
};

State& state() {
  static State s;
  return s;
}

// The places to look, first to last: TANDEM_CUDA_MODULE (a file) alone
// when set, else this build tree's module, then the install's.
std::vector<std::string> candidates() {
  if (auto file = env::get("TANDEM_CUDA_MODULE"); file && !file->empty()) return {*file};
  std::vector<std::string> out;
  for (const char* path : {TANDEM_CUDA_MODULE_BUILD, TANDEM_CUDA_MODULE_INSTALL}) {
    if (*path != '\0' && ::access(path, R_OK) == 0) out.emplace_back(path);
  }
  return out;
}

// Loads the first candidate whose parts are of this tandem's version;
// returns why none was, or "".
std::string load_locked(State& s) {
  const auto files = candidates();
  if (files.empty()) {
    return std::string(*TANDEM_CUDA_MODULE_BUILD == '\0'
                           ? "this tandem was built against a libtorch without CUDA"
                           : "the CUDA module libtandem_cuda.so is missing (looked for " +
                                 std::string(TANDEM_CUDA_MODULE_BUILD) + " and " +
                                 TANDEM_CUDA_MODULE_INSTALL + "; set TANDEM_CUDA_MODULE to its file)");
  }
  std::string why;
  for (const auto& file : files) {
    // Global, as a library the program linked would be: what libtorch_cuda
    // defines is seen by everything loaded after it.
    void* handle = ::dlopen(file.c_str(), RTLD_NOW | RTLD_GLOBAL);
    if (handle == nullptr) {
      const char* error = ::dlerror();
      why += (why.empty() ? "" : "; ") + std::string("loading ") + file + ": " + (error ? error : "unknown error");
      continue;
    }
    auto version = reinterpret_cast<int (*)()>(::dlsym(handle, "tandem_cuda_parts_version"));
    auto entry = reinterpret_cast<const void* (*)()>(::dlsym(handle, "tandem_cuda_parts"));
    const int found = version ? version() : -1;
    if (entry == nullptr || found != kPartsVersion) {
      why += (why.empty() ? "" : "; ") + file + " is not this tandem's CUDA module (its parts' version " +
             (version ? std::to_string(found) : std::string("missing")) + ", expected " +
             std::to_string(kPartsVersion) + ")";
      continue;  // left loaded: unloading libtorch_cuda is not safe
    }
    s.parts = entry();
    return "";
  }
  return why;
}

bool try_load(bool need_driver) {
  auto& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  if (s.parts != nullptr) return true;
  if (need_driver) {
    if (s.tried) return false;
    s.tried = true;
    // The driver is opened by libtorch_cuda anyway; held open here, it is
    // a lookup the module's load repeats for free.
    if (::dlopen("libcuda.so.1", RTLD_LAZY | RTLD_GLOBAL) == nullptr) return false;  // no error: no GPU
  }
  s.tried = true;
  s.error = load_locked(s);
  return s.parts != nullptr;
}

}  // namespace

bool load_when_present() { return try_load(/*need_driver=*/true); }

bool load() { return try_load(/*need_driver=*/false); }

bool loaded() {
  auto& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  return s.parts != nullptr;
}

std::string load_error() {
  auto& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  return s.parts != nullptr ? "" : s.error;
}

const Parts* parts() {
  load_when_present();
  auto& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  return static_cast<const Parts*>(s.parts);
}

}  // namespace tandem::cuda
