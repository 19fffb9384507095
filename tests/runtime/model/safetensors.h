// A small reader of the safetensors format for tests: 8-byte little-endian header length, a JSON
// header {name: {dtype, shape, data_offsets}, "__metadata__": {string: string}}, then the data.
// Reads F32 and I32 tensors. Errors: NotFound when the file is missing, InvalidArgument when it is
// malformed or a tensor has another dtype than asked.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace furnace::testing {

struct SafetensorsEntry {
  std::string dtype;
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;  // byte range in the data section
};

class SafetensorsFile {
 public:
  static absl::StatusOr<SafetensorsFile> Open(const std::string& path);

  bool Has(const std::string& name) const { return entries_.count(name) > 0; }
  const std::map<std::string, SafetensorsEntry>& entries() const { return entries_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  absl::StatusOr<std::string> Meta(const std::string& key) const;

  absl::StatusOr<std::vector<float>> F32(const std::string& name,
                                         std::vector<int64_t>* shape = nullptr) const;
  absl::StatusOr<std::vector<int32_t>> I32(const std::string& name,
                                           std::vector<int64_t>* shape = nullptr) const;

 private:
  absl::StatusOr<const SafetensorsEntry*> Find(const std::string& name,
                                               const std::string& dtype) const;

  std::map<std::string, SafetensorsEntry> entries_;
  std::map<std::string, std::string> metadata_;
  std::string data_;
};

}  // namespace furnace::testing
