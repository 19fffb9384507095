// The safetensors writer (runtime/checkpoint/safetensors.h) on arbitrary caller data: the bytes
// are decoded into tensors (names of any bytes, shapes with zero, negative and huge dims, float
// bit patterns including NaNs) and metadata, as `furnace export` passes a model's parameters.
// Beyond not crashing:
//  - a write either succeeds, and then ReadSafetensors returns exactly what was written (names,
//    shapes, metadata, every float bit for bit), or is refused with InvalidArgument and leaves
//    no file behind;
//  - shapes whose element count overflows are refused (the caller cannot hold such a tensor).
// Inputs whose tensors would need more than kMaxFloats floats are skipped: a caller must hold
// numel(shape) floats, and the fuzzer cannot.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "runtime/checkpoint/safetensors.h"
#include "tests/fuzz/fuzz_check.h"
#include "tests/fuzz/scratch_dir.h"

namespace {

constexpr int64_t kMaxFloats = 4096;

// Reads the input front to back; past the end every read gives zeros.
class Bytes {
 public:
  Bytes(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  uint8_t Byte() { return pos_ < size_ ? data_[pos_++] : 0; }
  std::string String(size_t max_len) {
    const size_t len = Byte() % (max_len + 1);
    std::string s;
    for (size_t i = 0; i < len; ++i) s.push_back(static_cast<char>(Byte()));
    return s;
  }
  float Float() {
    uint32_t bits = 0;
    for (int i = 0; i < 4; ++i) bits |= uint32_t{Byte()} << (8 * i);
    float f;
    std::memcpy(&f, &bits, sizeof f);
    return f;
  }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
};

int64_t Dim(uint8_t b) {
  switch (b % 10) {
    case 7:
      return -1;
    case 8:
      return int64_t{1} << 32;
    case 9:
      return int64_t{1} << 62;
    default:
      return b % 7;  // 0..6
  }
}

// The element count, or -1 when it overflows int64 (0 when any dim is 0).
__int128 ExactNumel(const std::vector<int64_t>& shape) {
  __int128 n = 1;
  for (int64_t d : shape) {
    if (d == 0) return 0;
  }
  for (int64_t d : shape) {
    n *= d;
    if (n > INT64_MAX || n < -static_cast<__int128>(INT64_MAX)) return -1;
  }
  return n;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const furnace::fuzz::ScratchDir scratch;
  Bytes in(data, size);
  std::vector<furnace::train::TensorView> views;
  std::vector<std::vector<float>> storage;
  bool overflows = false, negative = false;
  int64_t floats = 0;
  const int n_tensors = in.Byte() % 5;
  for (int t = 0; t < n_tensors; ++t) {
    furnace::train::TensorView view;
    view.name = in.String(12);
    const int rank = in.Byte() % 4;
    for (int d = 0; d < rank; ++d) view.shape.push_back(Dim(in.Byte()));
    for (int64_t d : view.shape) negative = negative || d < 0;
    const __int128 numel = ExactNumel(view.shape);
    std::vector<float> values;
    if (numel < 0) {
      overflows = overflows || !negative;
    } else {
      if (numel > kMaxFloats - floats) return 0;
      floats += static_cast<int64_t>(numel);
      for (int64_t i = 0; i < static_cast<int64_t>(numel); ++i) values.push_back(in.Float());
    }
    storage.push_back(std::move(values));
    views.push_back(std::move(view));
  }
  for (size_t t = 0; t < views.size(); ++t) views[t].data = storage[t].data();
  std::map<std::string, std::string> metadata;
  const int n_meta = in.Byte() % 3;
  for (int i = 0; i < n_meta; ++i) {
    std::string key = in.String(8);
    metadata[key] = in.String(8);
  }

  const std::string path = scratch.path() + "/model.safetensors";
  std::error_code ec;
  std::filesystem::remove(path, ec);
  const absl::Status written = furnace::train::WriteSafetensors(path, views, metadata);
  if (!written.ok()) {
    FUZZ_CHECK(absl::IsInvalidArgument(written), "write refused with %s: %s",
               std::string(absl::StatusCodeToString(written.code())).c_str(),
               std::string(written.message()).c_str());
    FUZZ_CHECK(!std::filesystem::exists(path), "a refused write left %s", path.c_str());
    return 0;
  }
  FUZZ_CHECK(!overflows, "a tensor whose element count overflows was written");
  FUZZ_CHECK(!negative, "a tensor with a negative dim was written");
  const absl::StatusOr<furnace::train::SafetensorsFile> back =
      furnace::train::ReadSafetensors(path);
  FUZZ_CHECK(back.ok(), "a written file does not read back: %s",
             std::string(back.status().message()).c_str());
  FUZZ_CHECK(back->metadata == metadata, "metadata changes on a write/read round trip");
  FUZZ_CHECK(back->tensors.size() == views.size(), "%zu tensors written, %zu read", views.size(),
             back->tensors.size());
  for (size_t t = 0; t < views.size(); ++t) {
    const auto it = back->tensors.find(views[t].name);
    FUZZ_CHECK(it != back->tensors.end(), "tensor %zu is missing after a round trip", t);
    FUZZ_CHECK(it->second.shape == views[t].shape, "tensor %zu changes shape", t);
    FUZZ_CHECK(it->second.data.size() == storage[t].size() &&
                   (storage[t].empty() || std::memcmp(it->second.data.data(), storage[t].data(),
                                                      storage[t].size() * sizeof(float)) == 0),
               "tensor %zu changes value", t);
  }
  return 0;
}
