// A fresh, empty directory per test under gtest's temp dir, removed when the test ends (TestDir),
// or when the test program exits (RemovedAtExit).
#pragma once

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace furnace::testing_util {

class TestDir {
 public:
  TestDir() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    path_ = std::filesystem::path(::testing::TempDir()) /
            (std::string("furnace_") + info->test_suite_name() + "_" + info->name() + "_" +
             std::to_string(::getpid()));
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~TestDir() { std::filesystem::remove_all(path_); }
  std::string path() const { return path_.string(); }
  std::string operator/(const std::string& name) const { return (path_ / name).string(); }

 private:
  std::filesystem::path path_;
};

// For helpers that hand out a path rather than an object: a fresh, empty directory named after
// the running test (`prefix`-<pid>-<test>) under the system temp dir, removed when the test
// program exits.
inline std::filesystem::path RemovedAtExit(const std::string& prefix) {
  static std::mutex mu;
  static std::vector<std::filesystem::path>* dirs = nullptr;
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() /
      (prefix + "-" + std::to_string(::getpid()) + "-" + (info != nullptr ? info->name() : "x"));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  std::lock_guard<std::mutex> lock(mu);
  if (dirs == nullptr) {
    dirs = new std::vector<std::filesystem::path>();
    std::atexit([] {
      for (const auto& d : *dirs) {
        std::error_code ignored;
        std::filesystem::remove_all(d, ignored);
      }
    });
  }
  dirs->push_back(dir);
  return dir;
}

}  // namespace furnace::testing_util
