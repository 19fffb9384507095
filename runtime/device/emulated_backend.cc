// The emulated device's backend: every op is the kernels::cpu function of its name, enqueued on the
// calling thread's current stream (current_stream.h; else the default stream of the device whose
// memory the op's first pointer names) and run there with its pointers translated to the device's
// read-write view. Ops return at once, as CUDA launches do; results are in device memory when the
// stream gets past them (SynchronizeStream, or an event).
//
// Arguments: every pointer is device memory of that device, checked at enqueue; one that is not
// sets the device's sticky error and the op is skipped (a CUDA kernel given a host pointer faults
// and poisons the context the same way). Host arguments, as in the CUDA kernels: the grouped GEMMs'
// offsets (copied at enqueue, as cuBLAS reads them at launch), add_row's row and the dispatch plan
// (copied).
// aux_loss_forward and sum_of_squares return a host scalar, so they synchronize the stream (as
// the CUDA ops must copy the scalar back); NaN when the device has a sticky error.
// Two tables: fp32 (EmulatedBackend) and bf16 (EmulatedBf16Backend: the GEMMs and attention are
// the bf16 oracle kernels of kernels/matmul_bf16.h and attention_bf16.h, everything else shared).
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <initializer_list>
#include <limits>
#include <memory>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "kernels/attention.h"
#include "kernels/attention_bf16.h"
#include "kernels/cast.h"
#include "kernels/cross_entropy.h"
#include "kernels/elementwise.h"
#include "kernels/encoder.h"
#include "kernels/gelu.h"
#include "kernels/layernorm.h"
#include "kernels/matmul.h"
#include "kernels/matmul_bf16.h"
#include "kernels/optimizer.h"
#include "kernels/permute.h"
#include "kernels/router.h"
#include "runtime/device/backend.h"
#include "runtime/device/backend_op_names.h"
#include "runtime/device/current_stream.h"
#include "runtime/device/emulated_device.h"
#include "runtime/device/weight_mirror.h"

namespace furnace::device {
namespace {

namespace k = kernels::cpu;

struct Target {
  EmulatedDevice* device = nullptr;
  Stream* stream = nullptr;
};

// The device and stream an op runs on, its device pointers checked; {} (op skipped) when one is
// not that device's memory. With no device to report to (no emulated current stream and no
// argument in an emulated device's memory) the program is as broken as a GPU kernel launched on
// host pointers would make it, and it stops with the op's name.
Target Resolve(const char* op, std::initializer_list<const void*> pointers) {
  Target t;
  if (Stream* current = CurrentStream(); current != nullptr) {
    t.device = EmulatedDeviceOf(*current);
    t.stream = current;
  }
  if (t.device == nullptr) {
    for (const void* p : pointers) {
      if (p == nullptr) continue;
      t.device = EmulatedDeviceOwning(p);
      if (t.device != nullptr) t.stream = &t.device->default_stream();
      break;
    }
  }
  if (t.device == nullptr) {
    std::fprintf(stderr,
                 "emulated backend: %s called with neither an emulated current stream nor an "
                 "emulated device's memory as its first pointer\n",
                 op);
    std::abort();
  }
  int index = 0;
  for (const void* p : pointers) {
    if (p != nullptr && !t.device->Owns(p)) {
      t.device->SetStickyError(absl::InvalidArgumentError(
          absl::StrFormat("emulated backend: %s: pointer argument %d (%p) is not memory of "
                          "device '%s'",
                          op, index, p, t.device->name())));
      return {};
    }
    ++index;
  }
  return t;
}

template <typename A>
const void* PointerOf(const A& arg) {
  if constexpr (std::is_pointer_v<A>) {
    return arg;
  } else {
    return nullptr;
  }
}

template <typename A>
A Translated(EmulatedDevice* device, const A& arg) {
  if constexpr (std::is_pointer_v<A>) {
    return static_cast<A>(device->Translate(arg));
  } else {
    return arg;
  }
}

void LaunchOrRecord(const Target& t, const char* op, std::function<void()> body) {
  absl::Status s = t.device->Launch(*t.stream, std::move(body));
  if (!s.ok()) {
    t.device->SetStickyError(absl::Status(s.code(), absl::StrCat(op, ": ", s.message())));
  }
}

// An op whose pointer arguments are all device memory: enqueued with them translated.
template <const char* Name, auto Fn>
struct Async;
template <const char* Name, typename... P, void (*Fn)(P...)>
struct Async<Name, Fn> {
  static void Run(P... args) {
    const Target t = Resolve(Name, {PointerOf(args)...});
    if (t.device == nullptr) return;
    auto bound = std::make_tuple(Translated(t.device, args)...);
    LaunchOrRecord(t, Name, [bound] { std::apply(Fn, bound); });
  }
};

// An op returning a host scalar: enqueued, then the stream synchronized for the value.
template <typename R, typename F>
R RunAndWait(const Target& t, const char* op, F body) {
  if (t.device == nullptr) return std::numeric_limits<R>::quiet_NaN();
  auto result = std::make_shared<R>(std::numeric_limits<R>::quiet_NaN());
  LaunchOrRecord(t, op, [result, body] { *result = body(); });
  if (!t.device->SynchronizeStream(*t.stream).ok()) return std::numeric_limits<R>::quiet_NaN();
  return *result;
}

float AuxLossForward(const float* probs, const int32_t* indices, int N, int E, int kk,
                     float alpha) {
  const Target t = Resolve("aux_loss_forward", {probs, indices});
  if (t.device == nullptr) return std::numeric_limits<float>::quiet_NaN();
  const float* p = Translated(t.device, probs);
  const int32_t* i = Translated(t.device, indices);
  return RunAndWait<float>(t, "aux_loss_forward",
                           [=] { return k::AuxLossForward<float>(p, i, N, E, kk, alpha); });
}

double SumOfSquares(const float* x, int64_t n) {
  const Target t = Resolve("sum_of_squares", {x});
  if (t.device == nullptr) return std::numeric_limits<double>::quiet_NaN();
  const float* tx = Translated(t.device, x);
  return RunAndWait<double>(t, "sum_of_squares", [=] { return k::SumOfSquares(tx, n); });
}

double SumOfSquaresRanges(const float* x, const int64_t* begin, const int64_t* count, int ranges) {
  const Target t = Resolve("sum_of_squares_ranges", {x});
  if (t.device == nullptr) return std::numeric_limits<double>::quiet_NaN();
  const float* tx = Translated(t.device, x);
  // The host arrays are the caller's until return, and RunAndWait returns after the op ran.
  return RunAndWait<double>(t, "sum_of_squares_ranges",
                            [=] { return k::SumOfSquaresRanges(tx, begin, count, ranges); });
}

// The grouped GEMMs read `offsets` (E + 1) from the host at launch, as cuBLAS does. Fn: the fp32
// or the bf16 kernel.
template <auto Fn>
void GroupedMatmulForward(float* out, const float* inp, const float* weight, const float* bias,
                          const int64_t* offsets, int E, int C, int OC) {
  const Target t = Resolve("grouped_matmul_forward", {out, inp, weight, bias});
  if (t.device == nullptr) return;
  auto bound = std::make_tuple(Translated(t.device, out), Translated(t.device, inp),
                               Translated(t.device, weight), Translated(t.device, bias));
  std::vector<int64_t> host_offsets(offsets, offsets + E + 1);
  LaunchOrRecord(t, "grouped_matmul_forward", [=] {
    auto [o, i, w, b] = bound;
    Fn(o, i, w, b, host_offsets.data(), E, C, OC);
  });
}

template <auto Fn>
void GroupedMatmulBackward(float* dinp, float* dweight, float* dbias, const float* dout,
                           const float* inp, const float* weight, const int64_t* offsets, int E,
                           int C, int OC) {
  const Target t = Resolve("grouped_matmul_backward", {dinp, dweight, dbias, dout, inp, weight});
  if (t.device == nullptr) return;
  auto bound = std::make_tuple(Translated(t.device, dinp), Translated(t.device, dweight),
                               Translated(t.device, dbias), Translated(t.device, dout),
                               Translated(t.device, inp), Translated(t.device, weight));
  std::vector<int64_t> host_offsets(offsets, offsets + E + 1);
  LaunchOrRecord(t, "grouped_matmul_backward", [=] {
    auto [di, dw, db, dout_, in, w] = bound;
    Fn(di, dw, db, dout_, in, w, host_offsets.data(), E, C, OC);
  });
}

// The bf16 GEMMs, reading the weight operand's mirror when it has one (weight_mirror.h): the
// mirror is decoded to fp32 on the stream (exact: every bf16 is an fp32), which the oracle's
// rounding leaves as it is, so the result is the per-call rounding's when the mirror is current and
// visibly not when it is stale (what tests of the model's mirror upkeep rely on).
const float* WeightOperand(const uint16_t* mirror, const float* weight, int64_t n,
                           std::vector<float>& decoded) {
  if (mirror == nullptr) return weight;
  decoded.resize(static_cast<size_t>(n));
  k::CastBf16ToF32(decoded.data(), mirror, n);
  return decoded.data();
}

void MatmulForwardBf16(float* out, const float* inp, const float* weight, const float* bias, int N,
                       int C, int OC) {
  const Target t = Resolve("matmul_forward (bf16)", {out, inp, weight, bias});
  if (t.device == nullptr) return;
  const int64_t n = int64_t{C} * OC;
  const uint16_t* mirror = Translated(t.device, FindWeightMirror(weight, n));
  auto bound = std::make_tuple(Translated(t.device, out), Translated(t.device, inp),
                               Translated(t.device, weight), Translated(t.device, bias));
  LaunchOrRecord(t, "matmul_forward (bf16)", [=] {
    auto [o, i, w, b] = bound;
    std::vector<float> decoded;
    k::MatmulForwardBf16(o, i, WeightOperand(mirror, w, n, decoded), b, N, C, OC);
  });
}

void MatmulBackwardBf16(float* dinp, float* dweight, float* dbias, const float* dout,
                        const float* inp, const float* weight, int N, int C, int OC) {
  const Target t = Resolve("matmul_backward (bf16)", {dinp, dweight, dbias, dout, inp, weight});
  if (t.device == nullptr) return;
  const int64_t n = int64_t{C} * OC;
  const uint16_t* mirror = Translated(t.device, FindWeightMirror(weight, n));
  auto bound = std::make_tuple(Translated(t.device, dinp), Translated(t.device, dweight),
                               Translated(t.device, dbias), Translated(t.device, dout),
                               Translated(t.device, inp), Translated(t.device, weight));
  LaunchOrRecord(t, "matmul_backward (bf16)", [=] {
    auto [di, dw, db, dout_, in, w] = bound;
    std::vector<float> decoded;
    const float* wv = di != nullptr ? WeightOperand(mirror, w, n, decoded) : w;
    k::MatmulBackwardBf16(di, dw, db, dout_, in, wv, N, C, OC);
  });
}

void GroupedMatmulForwardBf16(float* out, const float* inp, const float* weight, const float* bias,
                              const int64_t* offsets, int E, int C, int OC) {
  const Target t = Resolve("grouped_matmul_forward (bf16)", {out, inp, weight, bias});
  if (t.device == nullptr) return;
  const int64_t n = int64_t{E} * C * OC;
  const uint16_t* mirror = Translated(t.device, FindWeightMirror(weight, n));
  auto bound = std::make_tuple(Translated(t.device, out), Translated(t.device, inp),
                               Translated(t.device, weight), Translated(t.device, bias));
  std::vector<int64_t> host_offsets(offsets, offsets + E + 1);
  LaunchOrRecord(t, "grouped_matmul_forward (bf16)", [=] {
    auto [o, i, w, b] = bound;
    std::vector<float> decoded;
    k::GroupedMatmulForwardBf16(o, i, WeightOperand(mirror, w, n, decoded), b, host_offsets.data(),
                                E, C, OC);
  });
}

void GroupedMatmulBackwardBf16(float* dinp, float* dweight, float* dbias, const float* dout,
                               const float* inp, const float* weight, const int64_t* offsets, int E,
                               int C, int OC) {
  const Target t =
      Resolve("grouped_matmul_backward (bf16)", {dinp, dweight, dbias, dout, inp, weight});
  if (t.device == nullptr) return;
  const int64_t n = int64_t{E} * C * OC;
  const uint16_t* mirror = Translated(t.device, FindWeightMirror(weight, n));
  auto bound = std::make_tuple(Translated(t.device, dinp), Translated(t.device, dweight),
                               Translated(t.device, dbias), Translated(t.device, dout),
                               Translated(t.device, inp), Translated(t.device, weight));
  std::vector<int64_t> host_offsets(offsets, offsets + E + 1);
  LaunchOrRecord(t, "grouped_matmul_backward (bf16)", [=] {
    auto [di, dw, db, dout_, in, w] = bound;
    std::vector<float> decoded;
    const float* wv = di != nullptr ? WeightOperand(mirror, w, n, decoded) : w;
    k::GroupedMatmulBackwardBf16(di, dw, db, dout_, in, wv, host_offsets.data(), E, C, OC);
  });
}

// add_row's `row` (C) is host memory, copied at enqueue.
void AddRow(float* out, const float* row, int64_t N, int C) {
  const Target t = Resolve("add_row", {out});
  if (t.device == nullptr) return;
  float* o = Translated(t.device, out);
  std::vector<float> host_row(row, row + C);
  LaunchOrRecord(t, "add_row", [=] { k::AddRow<float>(o, host_row.data(), N, C); });
}

namespace op = op_names;

constexpr Backend kEmulatedBackend = {
    .name = "emulated",
    .precision = Precision::kFp32,
    .matmul_forward = &Async<op::kMatmulForward, &k::MatmulForward<float>>::Run,
    .matmul_backward = &Async<op::kMatmulBackward, &k::MatmulBackward<float>>::Run,
    .grouped_matmul_forward = &GroupedMatmulForward<&k::GroupedMatmulForward<float>>,
    .grouped_matmul_backward = &GroupedMatmulBackward<&k::GroupedMatmulBackward<float>>,
    .attention_forward = &Async<op::kAttentionForward, &k::AttentionForward<float>>::Run,
    .attention_backward = &Async<op::kAttentionBackward, &k::AttentionBackward<float>>::Run,
    .attention_forward_row_stats =
        &Async<op::kAttentionForwardRowStats, &k::AttentionForwardRowStats<float>>::Run,
    .attention_backward_row_stats =
        &Async<op::kAttentionBackwardRowStats, &k::AttentionBackwardRowStats<float>>::Run,
    .attention_probs = &Async<op::kAttentionProbs, &k::AttentionProbs<float>>::Run,
    .layernorm_forward = &Async<op::kLayernormForward, &k::LayerNormForward<float>>::Run,
    .layernorm_backward = &Async<op::kLayernormBackward, &k::LayerNormBackward<float>>::Run,
    .gelu_forward = &Async<op::kGeluForward, &k::GeluForward<float>>::Run,
    .gelu_backward = &Async<op::kGeluBackward, &k::GeluBackward<float>>::Run,
    .add_inplace = &Async<op::kAddInPlace, &k::AddInPlace<float>>::Run,
    .bias_residual = &Async<op::kBiasResidual, &k::BiasResidual<float>>::Run,
    .add_row = &AddRow,
    .transpose = &Async<op::kTranspose, &k::Transpose<float>>::Run,
    .embedding_forward = &Async<op::kEmbeddingForward, &k::EmbeddingForward<float>>::Run,
    .embedding_backward = &Async<op::kEmbeddingBackward, &k::EmbeddingBackward<float>>::Run,
    .cross_entropy_forward = &Async<op::kCrossEntropyForward, &k::CrossEntropyForward<float>>::Run,
    .cross_entropy_backward =
        &Async<op::kCrossEntropyBackward, &k::CrossEntropyBackward<float>>::Run,
    .softmax_forward = &Async<op::kSoftmaxForward, &k::SoftmaxForward<float>>::Run,
    .softmax_backward = &Async<op::kSoftmaxBackward, &k::SoftmaxBackward<float>>::Run,
    .topk_forward = &Async<op::kTopkForward, &k::TopKForward<float>>::Run,
    .topk_backward = &Async<op::kTopkBackward, &k::TopKBackward<float>>::Run,
    .aux_loss_forward = &AuxLossForward,
    .aux_loss_backward = &Async<op::kAuxLossBackward, &k::AuxLossBackward<float>>::Run,
    .make_dispatch_plan = &k::MakeDispatchPlan,  // host: built from host routing indices
    .make_dispatch_plan_slice = &k::MakeDispatchPlanSlice,
    .permute_forward = &Async<op::kPermuteForward, &k::PermuteForward<float>>::Run,
    .permute_backward = &Async<op::kPermuteBackward, &k::PermuteBackward<float>>::Run,
    .unpermute_forward = &Async<op::kUnpermuteForward, &k::UnpermuteForward<float>>::Run,
    .unpermute_backward = &Async<op::kUnpermuteBackward, &k::UnpermuteBackward<float>>::Run,
    .adamw_update = &Async<op::kAdamwUpdate, &k::AdamWUpdate>::Run,
    .sum_of_squares = &SumOfSquares,
    .sum_of_squares_ranges = &SumOfSquaresRanges,
    .scale = &Async<op::kScale, &k::Scale>::Run,
    .cast_f32_to_bf16 = &Async<op::kCastF32ToBf16, &k::CastF32ToBf16>::Run,
    .cast_bf16_to_f32 = &Async<op::kCastBf16ToF32, &k::CastBf16ToF32>::Run,
    .quantize_fp8_e4m3 = &Async<op::kQuantizeFp8, &k::QuantizeFp8E4M3>::Run,
    .dequantize_fp8_e4m3 = &Async<op::kDequantizeFp8, &k::DequantizeFp8E4M3>::Run,
};

// The bf16 table (backend.h "Precision"): the fp32 table with the GEMMs and attention replaced by
// the bf16 oracle kernels (kernels/matmul_bf16.h, attention_bf16.h), on the same streams.
constexpr Backend MakeEmulatedBf16Backend() {
  Backend b = kEmulatedBackend;
  b.name = "emulated/bf16";
  b.precision = Precision::kBf16;
  b.matmul_forward = &MatmulForwardBf16;
  b.matmul_backward = &MatmulBackwardBf16;
  b.grouped_matmul_forward = &GroupedMatmulForwardBf16;
  b.grouped_matmul_backward = &GroupedMatmulBackwardBf16;
  b.attention_forward = &Async<op::kAttentionForwardBf16, &k::AttentionForwardBf16>::Run;
  b.attention_backward = &Async<op::kAttentionBackwardBf16, &k::AttentionBackwardBf16>::Run;
  b.attention_forward_row_stats =
      &Async<op::kAttentionForwardRowStatsBf16, &k::AttentionForwardRowStatsBf16>::Run;
  b.attention_backward_row_stats =
      &Async<op::kAttentionBackwardRowStatsBf16, &k::AttentionBackwardRowStatsBf16>::Run;
  b.attention_probs = &Async<op::kAttentionProbsBf16, &k::AttentionProbsBf16>::Run;
  return b;
}
constexpr Backend kEmulatedBf16Backend = MakeEmulatedBf16Backend();

}  // namespace

const Backend& EmulatedBackend() { return kEmulatedBackend; }
const Backend& EmulatedBf16Backend() { return kEmulatedBf16Backend; }

}  // namespace furnace::device
