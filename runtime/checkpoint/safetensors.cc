#include "runtime/checkpoint/safetensors.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <optional>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "nlohmann/json.hpp"
#include "runtime/base/status.h"
#include "runtime/checkpoint/durable_file.h"

namespace furnace::train {
namespace {

static_assert(std::endian::native == std::endian::little,
              "safetensors I/O writes host floats as little-endian");

constexpr uint64_t kMaxHeaderBytes = 100u << 20;

// The element count of `shape`, or nullopt when a dim is negative or the tensor's bytes would not
// fit in an int64 (a count that overflows is undefined behaviour, and wrapped it would describe a
// tensor the data does not hold; found by tests/fuzz).
std::optional<int64_t> Numel(const std::vector<int64_t>& shape) {
  constexpr int64_t kMax = INT64_MAX / static_cast<int64_t>(sizeof(float));
  if (std::any_of(shape.begin(), shape.end(), [](int64_t d) { return d < 0; })) {
    return std::nullopt;
  }
  if (std::find(shape.begin(), shape.end(), 0) != shape.end()) return 0;
  int64_t n = 1;
  for (int64_t d : shape) {
    if (n > kMax / d) return std::nullopt;
    n *= d;
  }
  return n;
}

}  // namespace

absl::Status WriteSafetensors(const std::string& path, const std::vector<TensorView>& tensors,
                              const std::map<std::string, std::string>& metadata) {
  nlohmann::json header = nlohmann::json::object();
  uint64_t offset = 0;
  for (const TensorView& t : tensors) {
    if (t.name == "__metadata__" || header.contains(t.name)) {
      return absl::InvalidArgumentError(
          absl::StrCat("safetensors ", path, ": duplicate or reserved tensor name ", t.name));
    }
    const std::optional<int64_t> numel = Numel(t.shape);
    if (!numel.has_value()) {
      return absl::InvalidArgumentError(
          absl::StrCat("safetensors ", path, ": tensor ", t.name, " has shape ", ShapeText(t.shape),
                       " (dims must be >= 0 and the bytes fit in 63 bits)"));
    }
    const uint64_t bytes = static_cast<uint64_t>(*numel) * sizeof(float);
    header[t.name] = {
        {"dtype", "F32"}, {"shape", t.shape}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::string json;
  try {  // the header is JSON, which holds only UTF-8 (dump throws on anything else)
    json = header.dump();
  } catch (const nlohmann::json::type_error& e) {
    return absl::InvalidArgumentError(absl::StrCat(
        "safetensors ", path, ": tensor names and metadata must be UTF-8 (", e.what(), ")"));
  }
  json.append((8 - json.size() % 8) % 8, ' ');
  unsigned char len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>(uint64_t{json.size()} >> (8 * i));

  DurableWriter writer(path);
  RETURN_IF_ERROR(writer.Open());
  RETURN_IF_ERROR(writer.Append(len, 8));
  RETURN_IF_ERROR(writer.Append(json.data(), json.size()));
  for (const TensorView& t : tensors) {
    RETURN_IF_ERROR(writer.Append(t.data, static_cast<size_t>(*Numel(t.shape)) * sizeof(float)));
  }
  return writer.Commit();
}

absl::StatusOr<SafetensorsFile> ReadSafetensors(const std::string& path) {
  std::string bytes;
  RETURN_IF_ERROR(ReadFileToString(path, &bytes));
  auto bad = [&](const std::string& what) {
    return absl::DataLossError(absl::StrCat("safetensors ", path, ": ", what));
  };
  if (bytes.size() < 8) return bad(absl::StrCat("truncated: ", bytes.size(), " bytes"));
  uint64_t header_len = 0;
  for (int i = 0; i < 8; ++i)
    header_len |= uint64_t{static_cast<unsigned char>(bytes[i])} << (8 * i);
  if (header_len > kMaxHeaderBytes || header_len > bytes.size() - 8) {
    return bad(absl::StrCat("header length ", header_len, " does not fit in the ", bytes.size(),
                            "-byte file"));
  }
  nlohmann::json header = nlohmann::json::parse(
      bytes.begin() + 8, bytes.begin() + 8 + static_cast<ptrdiff_t>(header_len), nullptr,
      /*allow_exceptions=*/false);
  if (header.is_discarded() || !header.is_object()) return bad("header is not a JSON object");
  const uint64_t data_begin = 8 + header_len;
  const uint64_t data_bytes = bytes.size() - data_begin;

  SafetensorsFile file;
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& name = it.key();
    const nlohmann::json& entry = it.value();
    if (name == "__metadata__") {
      if (!entry.is_object()) return bad("__metadata__ is not an object");
      for (auto m = entry.begin(); m != entry.end(); ++m) {
        if (!m.value().is_string())
          return bad(absl::StrCat("metadata ", m.key(), " is not a string"));
        file.metadata[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    if (!entry.is_object() || !entry.contains("dtype") || !entry.contains("shape") ||
        !entry.contains("data_offsets") || !entry["dtype"].is_string() ||
        !entry["shape"].is_array() || !entry["data_offsets"].is_array() ||
        entry["data_offsets"].size() != 2) {
      return bad(absl::StrCat("tensor ", name, ": malformed entry ", entry.dump()));
    }
    const std::string dtype = entry["dtype"].get<std::string>();
    if (dtype != "F32") {
      return absl::UnimplementedError(absl::StrCat("safetensors ", path, ": tensor ", name,
                                                   " has dtype ", dtype, "; only F32 is read"));
    }
    SafetensorsTensor tensor;
    for (const auto& d : entry["shape"]) {
      if (!d.is_number_unsigned() || d.get<uint64_t>() > uint64_t{INT64_MAX}) {
        return bad(absl::StrCat("tensor ", name, ": bad shape ", entry["shape"].dump()));
      }
      tensor.shape.push_back(d.get<int64_t>());
    }
    const std::optional<int64_t> numel = Numel(tensor.shape);
    if (!numel.has_value()) {
      return bad(absl::StrCat("tensor ", name, ": shape ", ShapeText(tensor.shape), " too large"));
    }
    const auto& off = entry["data_offsets"];
    if (!off[0].is_number_unsigned() || !off[1].is_number_unsigned()) {
      return bad(absl::StrCat("tensor ", name, ": bad data_offsets"));
    }
    const uint64_t b = off[0].get<uint64_t>(), e = off[1].get<uint64_t>();
    const uint64_t want = static_cast<uint64_t>(*numel) * sizeof(float);
    if (e < b || e - b != want) {
      return bad(absl::StrCat("tensor ", name, ": data_offsets [", b, ", ", e, ") hold ", e - b,
                              " bytes but shape ", ShapeText(tensor.shape), " needs ", want));
    }
    if (e > data_bytes) {
      return bad(absl::StrCat("truncated: tensor ", name, " ends at byte ", e,
                              " of the data section, which has ", data_bytes));
    }
    tensor.data.resize(static_cast<size_t>(want / sizeof(float)));
    if (want > 0) std::memcpy(tensor.data.data(), bytes.data() + data_begin + b, want);
    ranges.emplace_back(b, e);
    file.tensors.emplace(name, std::move(tensor));
  }
  std::sort(ranges.begin(), ranges.end());
  uint64_t cursor = 0;
  for (const auto& [b, e] : ranges) {
    if (b != cursor) return bad(absl::StrCat("data_offsets leave a gap or overlap at byte ", b));
    cursor = e;
  }
  if (cursor != data_bytes) {
    return bad(absl::StrCat("data section has ", data_bytes, " bytes; tensors cover ", cursor));
  }
  return file;
}

absl::Status ExportSafetensors(const std::string& path, const std::vector<ParamInfo>& params,
                               const float* data,
                               const std::map<std::string, std::string>& metadata) {
  std::vector<TensorView> views;
  views.reserve(params.size());
  for (const ParamInfo& p : params) views.push_back({p.name, p.shape, data + p.offset});
  return WriteSafetensors(path, views, metadata);
}

absl::Status ImportSafetensors(const std::string& path, const std::vector<ParamInfo>& params,
                               float* data) {
  ASSIGN_OR_RETURN(SafetensorsFile file, ReadSafetensors(path));
  std::set<std::string> expected;
  for (const ParamInfo& p : params) {
    expected.insert(p.name);
    auto it = file.tensors.find(p.name);
    if (it == file.tensors.end()) {
      return absl::NotFoundError(absl::StrCat("safetensors ", path, ": no tensor ", p.name));
    }
    if (it->second.shape != p.shape) {
      return absl::InvalidArgumentError(absl::StrCat("safetensors ", path, ": tensor ", p.name,
                                                     " has shape ", ShapeText(it->second.shape),
                                                     ", the model needs ", ShapeText(p.shape)));
    }
  }
  for (const auto& [name, t] : file.tensors) {
    if (!expected.count(name)) {
      return absl::InvalidArgumentError(
          absl::StrCat("safetensors ", path, ": tensor ", name, " is not a model parameter"));
    }
  }
  for (const ParamInfo& p : params) {
    const auto& t = file.tensors.at(p.name);
    std::copy(t.data.begin(), t.data.end(), data + p.offset);
  }
  return absl::OkStatus();
}

}  // namespace furnace::train
