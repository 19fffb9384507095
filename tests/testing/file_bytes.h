// Whole-file reads and writes for tests that inspect or corrupt what the code under test wrote.
// Test-only: a missing file reads as "" and a failed write is left for the test's own assertions
// on what the code under test then reports.
#pragma once

#include <fstream>
#include <iterator>
#include <string>

namespace furnace::testing_util {

inline std::string ReadAll(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

inline void WriteAll(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

}  // namespace furnace::testing_util
