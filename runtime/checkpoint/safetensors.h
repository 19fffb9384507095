// The safetensors format (huggingface/safetensors), F32 only: an 8-byte little-endian header
// length N, N bytes of JSON {"name": {"dtype": "F32", "shape": [...], "data_offsets": [b, e]},
// ..., "__metadata__": {"key": "value"}} padded with spaces to a multiple of 8, then the tensor
// bytes, offsets relative to the end of the header. Furnace exports use MODEL.md names and [in,
// out] shapes, so `safetensors.torch.load_file` opens them with no conversion code.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/trainable/param_info.h"

namespace furnace::train {

struct TensorView {
  std::string name;
  std::vector<int64_t> shape;
  const float* data = nullptr;  // numel(shape) floats, borrowed
};

struct SafetensorsTensor {
  std::vector<int64_t> shape;
  std::vector<float> data;
};

struct SafetensorsFile {
  std::map<std::string, SafetensorsTensor> tensors;
  std::map<std::string, std::string> metadata;
};

// Writes atomically (temp file, fsync, rename). Names must be unique and not "__metadata__".
absl::Status WriteSafetensors(const std::string& path, const std::vector<TensorView>& tensors,
                              const std::map<std::string, std::string>& metadata = {});

// Reads and validates a whole file: header length, JSON, dtype (F32 only), shapes against byte
// ranges, ranges inside the file, contiguous and non-overlapping. Errors name the file and tensor.
absl::StatusOr<SafetensorsFile> ReadSafetensors(const std::string& path);

// A model's parameters (a Trainable's params() over its flat array) as one tensor each.
absl::Status ExportSafetensors(const std::string& path, const std::vector<ParamInfo>& params,
                               const float* data,
                               const std::map<std::string, std::string>& metadata = {});

// The inverse: every parameter must be present with its shape; extra tensors are an error.
absl::Status ImportSafetensors(const std::string& path, const std::vector<ParamInfo>& params,
                               float* data);

}  // namespace furnace::train
