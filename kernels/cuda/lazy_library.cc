#include "kernels/cuda/lazy_library.h"

#include <dlfcn.h>

#include <utility>

namespace furnace::kernels::cuda {

LazyLibrary::LazyLibrary(std::string soname, std::vector<std::string> fallback_dirs,
                         std::vector<std::string> symbols)
    : soname_(std::move(soname)),
      fallback_dirs_(std::move(fallback_dirs)),
      symbol_names_(std::move(symbols)) {}

const std::string& LazyLibrary::Load() {
  std::call_once(once_, [this] { LoadOnce(); });
  return error_;
}

void* LazyLibrary::Symbol(std::string_view name) {
  if (!Load().empty()) return nullptr;
  const auto it = symbols_.find(std::string(name));
  return it == symbols_.end() ? nullptr : it->second;
}

void LazyLibrary::LoadOnce() {
  std::vector<std::string> candidates = {soname_};
  for (const std::string& dir : fallback_dirs_) {
    if (!dir.empty()) candidates.push_back(dir + "/" + soname_);
  }
  std::string tried;
  void* handle = nullptr;
  for (const std::string& path : candidates) {
    // RTLD_LOCAL: the library's symbols are not used to resolve later loads; RTLD_NOW: a broken
    // installation fails here, not mid-step. (The forwarding functions, which carry the library's
    // names, are hidden symbols: the library's own calls can never bind to them.)
    handle = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle != nullptr) break;
    const char* why = ::dlerror();
    tried += (tried.empty() ? "" : "; ") + path + " (" + (why != nullptr ? why : "not found") + ")";
  }
  if (handle == nullptr) {
    error_ = "cannot load " + soname_ + "; tried: " + tried;
    return;
  }
  for (const std::string& name : symbol_names_) {
    void* address = ::dlsym(handle, name.c_str());
    if (address == nullptr) {
      // The library stays mapped: one that was loaded and initialised is not safely unloaded.
      symbols_.clear();
      error_ = soname_ + " has no " + name + " (older than the headers Furnace was built with?)";
      return;
    }
    symbols_.emplace(name, address);
  }
}

}  // namespace furnace::kernels::cuda
