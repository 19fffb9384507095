// A shared library the process loads on its first use instead of at exec: the CUDA libraries
// (cuBLAS here, NCCL in runtime/comm/nccl_library.cc) that only a rank on a CUDA device calls.
// Linked normally, cuBLAS alone cost every process that links the CUDA backend about 0.4 s and
// 150 MB resident (95 MB anonymous) at start-up (its static initialisers), CPU and emulated-device
// ranks included, and a host without the libraries could not start the programs at all. The
// functions that stand in for a library's entry points (kernels/cuda/cublas_library.cc) load it
// here. Plain C++ (no CUDA, no Abseil), so that the kernels stay the leaf of the tree.
#pragma once

#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace furnace::kernels::cuda {

class LazyLibrary {
 public:
  // `soname` ("libcublas.so.13") is tried first through the dynamic loader's own search
  // (LD_LIBRARY_PATH, the loader cache, the system directories), then as `<dir>/<soname>` for each
  // of `fallback_dirs` (where the build found it). `symbols` are every name the process will ask
  // for: a library that lacks one fails to load as a whole, with that name in the error.
  LazyLibrary(std::string soname, std::vector<std::string> fallback_dirs,
              std::vector<std::string> symbols);
  // The library itself stays loaded for the process's life (a forwarding function may run late).
  ~LazyLibrary() = default;
  LazyLibrary(const LazyLibrary&) = delete;
  LazyLibrary& operator=(const LazyLibrary&) = delete;

  // Loads the library and resolves every symbol on the first call (once, whichever thread calls
  // first; the others wait); every call returns that attempt's outcome: "" when loaded, else the
  // reason (each path tried and why it failed, or the missing symbol).
  const std::string& Load();

  // The address of `name` (one of `symbols`), loading first; nullptr when Load() failed or `name`
  // is not among `symbols`.
  void* Symbol(std::string_view name);

  const std::string& soname() const { return soname_; }

 private:
  void LoadOnce();

  const std::string soname_;
  const std::vector<std::string> fallback_dirs_;
  const std::vector<std::string> symbol_names_;
  std::once_flag once_;
  // Written once under once_, read-only afterwards.
  std::string error_;
  std::unordered_map<std::string, void*> symbols_;
};

// Calls the function at `address` (a LazyLibrary::Symbol) with a forwarding function's own
// arguments: the pointer's type is deduced from them, which are the declaration's parameters
// (cublas_api.h overloads some names for C++, so &name would be ambiguous).
template <typename R, typename... Args>
R CallAs(void* address, Args... args) {
  return reinterpret_cast<R (*)(Args...)>(address)(args...);
}

}  // namespace furnace::kernels::cuda
