// Weight mirrors: bf16 copies of fp32 weight arrays that a bf16 table's GEMMs read instead of
// rounding their weight operand afresh on every call (backend.h "Precision"). The rounding is the
// same (nearest even, cast.h), so the results are bit-identical to rounding per call; what it saves
// is the weight cast of every forward and input-gradient GEMM (6 bytes per weight element each
// time: on an 8-expert layer of d 2048, f 5632 about 0.55 GB of traffic per call), which is then
// paid once per optimizer step.
//
// Protocol: the owner of the weights (GptMoe) registers its fp32 array and a mirror of the same
// element count in the same device's memory (WeightMirror, RAII), and keeps the mirror current: it
// re-rounds it (cast_f32_to_bf16 on its compute stream) before the first GEMM after anyone could
// have written the weights. A bf16 table looks the weight operand of each GEMM up
// (FindWeightMirror) and, when the whole operand lies inside a registered array, reads the mirror
// at the same offset; anything else (activations, the head's transposed embedding) is rounded per
// call as before. The fp32 tables never look.
//
// Thread-safety: the registry is process-wide and locked (lookups share the lock). Ownership: the
// registry holds pointers only; the registration must end (WeightMirror's destructor) before the
// arrays are freed.
#pragma once

#include <cstdint>

namespace furnace::device {

// The mirror element of weights[0] when [weight, weight + n) lies inside one registered array,
// else nullptr.
const uint16_t* FindWeightMirror(const float* weight, int64_t n);

class WeightMirror {
 public:
  WeightMirror() = default;
  // Registers mirror[0, n) as the bf16 copy of weights[0, n) (both device memory of one device).
  WeightMirror(const float* weights, const uint16_t* mirror, int64_t n);
  ~WeightMirror();
  WeightMirror(WeightMirror&& other) noexcept;
  WeightMirror& operator=(WeightMirror&& other) noexcept;
  WeightMirror(const WeightMirror&) = delete;
  WeightMirror& operator=(const WeightMirror&) = delete;
  bool registered() const { return weights_ != nullptr; }

 private:
  void Reset();
  const float* weights_ = nullptr;
};

}  // namespace furnace::device
