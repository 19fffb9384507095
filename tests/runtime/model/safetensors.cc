#include "safetensors.h"

#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace furnace::testing {

absl::StatusOr<SafetensorsFile> SafetensorsFile::Open(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open ", path));
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string bytes = ss.str();
  if (bytes.size() < 8) return absl::InvalidArgumentError(absl::StrCat(path, ": too short"));
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(bytes[i]);
  if (8 + n > bytes.size()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": header length ", n, " past the end"));
  }
  const nlohmann::json header = nlohmann::json::parse(bytes.substr(8, n), nullptr, false);
  if (header.is_discarded() || !header.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": header is not a JSON object"));
  }
  SafetensorsFile f;
  f.data_ = bytes.substr(8 + n);
  for (const auto& [name, v] : header.items()) {
    if (name == "__metadata__") {
      for (const auto& [k, mv] : v.items()) {
        if (mv.is_string()) f.metadata_[k] = mv.get<std::string>();
      }
      continue;
    }
    if (!v.contains("dtype") || !v.contains("shape") || !v.contains("data_offsets")) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": tensor '", name, "' is incomplete"));
    }
    SafetensorsEntry e;
    e.dtype = v["dtype"].get<std::string>();
    e.shape = v["shape"].get<std::vector<int64_t>>();
    e.begin = v["data_offsets"][0].get<uint64_t>();
    e.end = v["data_offsets"][1].get<uint64_t>();
    if (e.end < e.begin || e.end > f.data_.size()) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": tensor '", name, "' out of range"));
    }
    f.entries_[name] = std::move(e);
  }
  return f;
}

absl::StatusOr<std::string> SafetensorsFile::Meta(const std::string& key) const {
  auto it = metadata_.find(key);
  if (it == metadata_.end()) return absl::NotFoundError(absl::StrCat("no metadata key ", key));
  return it->second;
}

absl::StatusOr<const SafetensorsEntry*> SafetensorsFile::Find(const std::string& name,
                                                              const std::string& dtype) const {
  auto it = entries_.find(name);
  if (it == entries_.end()) return absl::NotFoundError(absl::StrCat("no tensor '", name, "'"));
  if (it->second.dtype != dtype) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor '", name, "' is ", it->second.dtype, ", want ", dtype));
  }
  int64_t numel = 1;
  for (int64_t d : it->second.shape) numel *= d;
  if (static_cast<uint64_t>(numel) * 4 != it->second.end - it->second.begin) {
    return absl::InvalidArgumentError(absl::StrCat("tensor '", name, "' has a size mismatch"));
  }
  return &it->second;
}

absl::StatusOr<std::vector<float>> SafetensorsFile::F32(const std::string& name,
                                                        std::vector<int64_t>* shape) const {
  absl::StatusOr<const SafetensorsEntry*> e = Find(name, "F32");
  if (!e.ok()) return e.status();
  std::vector<float> out(((*e)->end - (*e)->begin) / 4);
  if (!out.empty()) std::memcpy(out.data(), data_.data() + (*e)->begin, out.size() * 4);
  if (shape != nullptr) *shape = (*e)->shape;
  return out;
}

absl::StatusOr<std::vector<int32_t>> SafetensorsFile::I32(const std::string& name,
                                                          std::vector<int64_t>* shape) const {
  absl::StatusOr<const SafetensorsEntry*> e = Find(name, "I32");
  if (!e.ok()) return e.status();
  std::vector<int32_t> out(((*e)->end - (*e)->begin) / 4);
  if (!out.empty()) std::memcpy(out.data(), data_.data() + (*e)->begin, out.size() * 4);
  if (shape != nullptr) *shape = (*e)->shape;
  return out;
}

}  // namespace furnace::testing
