// A private temporary directory for fuzz targets whose code under test reads files: made once per
// process under $TMPDIR (or /tmp), removed with everything in it at exit.
#pragma once

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "tests/fuzz/fuzz_check.h"

namespace furnace::fuzz {

class ScratchDir {
 public:
  ScratchDir() {
    const char* tmp = std::getenv("TMPDIR");
    std::string pattern =
        std::string(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") + "/furnace-fuzz-XXXXXX";
    FUZZ_CHECK(mkdtemp(pattern.data()) != nullptr, "cannot make a scratch directory");
    path_ = pattern;
  }
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;

  const std::string& path() const { return path_; }

  // Writes `size` bytes to `name` (directories made as needed) and returns its path.
  std::string Write(const std::string& name, const void* data, size_t size) const {
    const std::filesystem::path file = std::filesystem::path(path_) / name;
    std::error_code ec;
    std::filesystem::create_directories(file.parent_path(), ec);
    std::ofstream out(file, std::ios::binary | std::ios::trunc);
    out.write(static_cast<const char*>(data), static_cast<std::streamsize>(size));
    FUZZ_CHECK(out.good(), "cannot write %s", file.c_str());
    return file.string();
  }

 private:
  std::string path_;
};

}  // namespace furnace::fuzz
