// LazyLibrary on real shared libraries (zlib, present wherever gRPC is), and the cuBLAS forwarding
// functions against the toolkit's libcublas: no GPU needed, so labelled unit.
#include "kernels/cuda/lazy_library.h"

#include <cublas_v2.h>
#include <dlfcn.h>
#include <link.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cuda/cublas_library.h"

namespace furnace::kernels::cuda {
namespace {

using ::testing::HasSubstr;

// The file the loader maps for libz.so.1 here.
std::string ZlibPath() {
  void* handle = ::dlopen("libz.so.1", RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) return "";
  link_map* map = nullptr;
  if (::dlinfo(handle, RTLD_DI_LINKMAP, &map) != 0 || map == nullptr) return "";
  return map->l_name;
}

TEST(LazyLibraryTest, LoadsThroughTheLoadersSearchAndResolvesEverySymbol) {
  LazyLibrary zlib("libz.so.1", {}, {"zlibVersion", "crc32"});
  EXPECT_EQ(zlib.Load(), "");
  void* version = zlib.Symbol("zlibVersion");
  ASSERT_NE(version, nullptr);
  const char* text = reinterpret_cast<const char* (*)()>(version)();
  EXPECT_EQ(text[0], '1') << text;  // zlib 1.x
  EXPECT_NE(zlib.Symbol("crc32"), nullptr);
  // Only the names it was given: anything else is not for the forwarding functions.
  EXPECT_EQ(zlib.Symbol("adler32"), nullptr);
}

TEST(LazyLibraryTest, FallsBackToTheBuildsDirectory) {
  const std::string zlib_path = ZlibPath();
  ASSERT_FALSE(zlib_path.empty());
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("furnace_lazy_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  std::filesystem::create_symlink(zlib_path, dir / "libfurnace_lazy_test.so.1");
  LazyLibrary library("libfurnace_lazy_test.so.1", {"", dir.string()}, {"zlibVersion"});
  EXPECT_EQ(library.Load(), "");
  EXPECT_NE(library.Symbol("zlibVersion"), nullptr);
  std::filesystem::remove_all(dir);
}

TEST(LazyLibraryTest, AnAbsentLibraryNamesEveryPathTried) {
  LazyLibrary absent("libfurnace_absent.so.7", {"/nonexistent/a", "/nonexistent/b"}, {"anything"});
  const std::string error = absent.Load();
  EXPECT_THAT(error, HasSubstr("cannot load libfurnace_absent.so.7"));
  EXPECT_THAT(error, HasSubstr("/nonexistent/a/libfurnace_absent.so.7"));
  EXPECT_THAT(error, HasSubstr("/nonexistent/b/libfurnace_absent.so.7"));
  EXPECT_EQ(absent.Symbol("anything"), nullptr);
  EXPECT_EQ(absent.Load(), error);  // the first attempt's outcome holds
}

TEST(LazyLibraryTest, AMissingSymbolFailsTheWholeLibrary) {
  LazyLibrary zlib("libz.so.1", {}, {"zlibVersion", "furnace_no_such_entry_point"});
  EXPECT_THAT(zlib.Load(), HasSubstr("libz.so.1 has no furnace_no_such_entry_point"));
  EXPECT_EQ(zlib.Symbol("zlibVersion"), nullptr);
}

TEST(LazyLibraryTest, ConcurrentFirstCallsLoadOnce) {
  LazyLibrary zlib("libz.so.1", {}, {"zlibVersion"});
  std::vector<void*> seen(8, nullptr);
  std::vector<std::thread> threads;
  for (size_t i = 0; i < seen.size(); ++i) {
    threads.emplace_back([&, i] { seen[i] = zlib.Symbol("zlibVersion"); });
  }
  for (std::thread& t : threads) t.join();
  for (void* address : seen) EXPECT_EQ(address, seen[0]);
  EXPECT_NE(seen[0], nullptr);
}

// The toolkit this was built with has a libcublas with every entry point Furnace calls, and the
// forwarding functions reach it (no GPU needed for these two calls).
TEST(CublasLibraryTest, TheToolkitsCublasHasEveryEntryPoint) {
  const std::string error = LoadCublas();
  if (error.rfind("cannot load", 0) == 0) {
    GTEST_SKIP() << "no libcublas on this host (the programs still run on CPU devices): " << error;
  }
  ASSERT_EQ(error, "");
  const std::string text = cublasGetStatusString(CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_FALSE(text.empty());
  EXPECT_EQ(text.find("cannot load"), std::string::npos) << text;
}

}  // namespace
}  // namespace furnace::kernels::cuda
