// Replays a fuzz target's seed corpus and its regressions (inputs that once crashed it or broke
// one of its properties) through the same LLVMFuzzerTestOneInput, in the ordinary gcc build, so
// every fixed bug stays fixed without clang. Usage: <target>_replay CORPUS_DIR REGRESSIONS_DIR
// (ctest runs each of the two cases on its own, with --gtest_filter: tests/fuzz/CMakeLists.txt).
// A harness aborts on a broken property (fuzz_check.h), which fails this test with its message.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace {

std::vector<std::string> g_dirs;

std::vector<std::filesystem::path> FilesIn(const std::string& dir) {
  std::vector<std::filesystem::path> files;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    if (e.is_regular_file() && e.path().filename() != ".gitkeep") files.push_back(e.path());
  }
  std::sort(files.begin(), files.end());
  return files;
}

void Replay(const std::filesystem::path& file) {
  std::ifstream in(file, std::ios::binary);
  const std::vector<char> bytes((std::istreambuf_iterator<char>(in)),
                                std::istreambuf_iterator<char>());
  SCOPED_TRACE(file.string());
  LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
}

TEST(FuzzReplay, SeedCorpusRunsClean) {
  ASSERT_GE(g_dirs.size(), 1u);
  const auto files = FilesIn(g_dirs[0]);
  ASSERT_FALSE(files.empty()) << "no seed inputs in " << g_dirs[0];
  for (const auto& f : files) Replay(f);
}

// A target with no regression inputs yet (only the directory's .gitkeep) skips, saying so, rather
// than passing on nothing replayed; ctest registers this case on its own (CMakeLists.txt), so the
// skip is reported as one.
TEST(FuzzReplay, RegressionsRunClean) {
  ASSERT_GE(g_dirs.size(), 2u);
  ASSERT_TRUE(std::filesystem::is_directory(g_dirs[1])) << "no directory " << g_dirs[1];
  const auto files = FilesIn(g_dirs[1]);
  if (files.empty()) {
    std::filesystem::path dir(g_dirs[1]);  // <target>/regressions
    if (dir.filename().empty()) dir = dir.parent_path();
    GTEST_SKIP() << "no regression inputs for " << dir.parent_path().filename().string() << " yet ("
                 << g_dirs[1] << " holds none)";
  }
  for (const auto& f : files) Replay(f);
}

}  // namespace

int main(int argc, char** argv) {
  testing::InitGoogleTest(&argc, argv);
  for (int i = 1; i < argc; ++i) g_dirs.emplace_back(argv[i]);
  return RUN_ALL_TESTS();
}
