#include "runtime/memory/codec.h"

#include <cmath>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"

namespace furnace::memory {
namespace {

struct Compressible {
  std::string_view suffix;
  bool fp8;  // bf16 is allowed for every entry
};

constexpr Compressible kWhitelist[] = {
    {"moe.expert_input", true}, {"moe.expert_hidden", true}, {"moe.expert_pre", false},
    {"mlp.hidden", true},       {"mlp.pre", false},
};

int64_t Fp8Blocks(int64_t n) { return (n + kFp8Block - 1) / kFp8Block; }

}  // namespace

const char* CodecName(Codec codec) { return codec == Codec::kBf16 ? "bf16" : "fp8_e4m3"; }

bool IsCompressible(std::string_view producer, Codec codec) {
  // "layers.<l>.<suffix>" exactly.
  constexpr std::string_view kLayers = "layers.";
  if (producer.substr(0, kLayers.size()) != kLayers) return false;
  producer.remove_prefix(kLayers.size());
  const size_t dot = producer.find('.');
  if (dot == 0 || dot == std::string_view::npos) return false;
  for (char ch : producer.substr(0, dot)) {
    if (ch < '0' || ch > '9') return false;
  }
  producer.remove_prefix(dot + 1);
  for (const Compressible& c : kWhitelist) {
    if (producer == c.suffix) return codec == Codec::kBf16 || c.fp8;
  }
  return false;
}

absl::Status CheckCompressible(std::string_view producer, tensor::DType dtype, Codec codec) {
  if (dtype != tensor::DType::kF32 || !IsCompressible(producer, codec)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "compress: '", std::string(producer), "' (", tensor::DTypeName(dtype),
        ") may not be stored as ", CodecName(codec),
        " (allowed: fp32 layers.<l>.moe.expert_input / moe.expert_hidden / mlp.hidden in bf16 or "
        "fp8, moe.expert_pre / mlp.pre in bf16; see runtime/memory/codec.h)"));
  }
  return absl::OkStatus();
}

uint64_t EncodedBytes(Codec codec, int64_t n) {
  if (codec == Codec::kBf16) return static_cast<uint64_t>(2 * n);
  return static_cast<uint64_t>(4 * Fp8Blocks(n) + n);
}

void Encode(const device::Backend& ops, Codec codec, const float* in, int64_t n, void* out) {
  if (codec == Codec::kBf16) {
    ops.cast_f32_to_bf16(static_cast<uint16_t*>(out), in, n);
    return;
  }
  float* scales = static_cast<float*>(out);
  uint8_t* codes = reinterpret_cast<uint8_t*>(scales + Fp8Blocks(n));
  ops.quantize_fp8_e4m3(codes, scales, in, n, kFp8Block);
}

void Decode(const device::Backend& ops, Codec codec, const void* in, int64_t n, float* out) {
  if (codec == Codec::kBf16) {
    ops.cast_bf16_to_f32(out, static_cast<const uint16_t*>(in), n);
    return;
  }
  const float* scales = static_cast<const float*>(in);
  const uint8_t* codes = reinterpret_cast<const uint8_t*>(scales + Fp8Blocks(n));
  ops.dequantize_fp8_e4m3(out, codes, scales, n, kFp8Block);
}

double ErrorBound(Codec codec, float x, float fp8_scale) {
  const double a = std::fabs(static_cast<double>(x));
  if (codec == Codec::kBf16) return std::ldexp(a, -8) + std::ldexp(1.0, -133);
  return (std::ldexp(a, -4) + std::ldexp(static_cast<double>(fp8_scale), -10)) *
         (1 + std::ldexp(1.0, -20));
}

}  // namespace furnace::memory
