// Backend: the table of operations the model and the optimizer run, one table per kind of device,
// as ggml's backends. Model code never names a kernel library; it calls through the table its
// device gives (BackendFor), so a new backend is a new table plus one case in BackendFor, with no
// change to runtime/model.
//
// Every op has the signature and the contract of the CPU kernel it is named after (the shape and
// accumulate/overwrite comments in kernels/include/kernels/<op>.h): the CPU table points at
// kernels::cpu, so training through it is bit-identical to calling the kernels directly. Pointer
// arguments are memory of the table's device, except where the kernel header says host (the
// dispatch plan is built on the host from host routing indices, as the CUDA permute ops expect).
//
// Backends: cpu (kernels::cpu, always), emulated (kernels::cpu enqueued on the emulated device's
// streams, emulated_device.h; always) and cuda (kernels::cuda on the CUDA device's streams,
// cuda_backend.h; in builds with FURNACE_ENABLE_CUDA, else BackendFor refuses the kind).
//
// Precision (model.precision): a table computes either in fp32 throughout, or (kBf16) its GEMMs
// (matmul and grouped matmul, forward and backward, and the products inside attention) with bf16
// operands, fp32 accumulation and fp32 results, as the tensor cores do; every other op, the
// parameters (fp32 master weights), the gradients and the optimizer state stay fp32, and the
// signatures do not change (the table rounds the operands itself). So precision is a choice of
// table, and the model's code is the same for both, except the MoE router, whose small GEMM the
// model runs on the fp32 table of the same kind (MODEL.md: the router is fp32). The CPU trains in
// fp32 only. The arithmetic of a bf16 op is kernels/matmul_bf16.h and attention_bf16.h (the CPU
// oracle, which the emulated bf16 table runs); the CUDA bf16 table rounds the same way (round to
// nearest even) and differs from that oracle only in the order of its fp32 sums. Its bf16 copies of
// the operands live in scratch the table allocates and frees around each op (stream-ordered,
// Device::Allocate/Free): like cuBLAS's own workspace they are outside the job's activation budget
// (DeviceArena). How far bf16 results are from fp32 ones: kBf16*Tolerance below.
//
// Streams (the contract every device table follows, and the CUDA table must): an op runs on the
// calling thread's current stream (current_stream.h: StreamScope; none set: the device's default
// stream). On a device with streams an op ENQUEUES and returns, as a CUDA launch does (the CUDA
// kernels in kernels/cuda take a cudaStream_t and, for GEMMs, a cublasHandle_t: the CUDA table
// passes CurrentStream()->native() and a handle of its own per (thread, device, stream)), so its
// outputs may be read only after the stream passes it: SynchronizeStream, or an event recorded
// after it and waited by the consumer's stream. Work on two streams is ordered only by events.
// Host arguments (the grouped GEMMs' offsets, the dispatch plan, add_row's row, scalars) are read
// or copied at the call; the CUDA table copies the plan's slot/token arrays (and the row) to the
// device on the same stream (its kernels take a DeviceDispatchPlan). An op returning a host scalar
// (aux_loss_forward, sum_of_squares) synchronizes the current stream. The CPU table runs every op
// on the calling thread before returning, which satisfies the same contract.
//
// Errors: the ops return void (or a host scalar); a failure inside one is the device's sticky
// error (emulated_device.h, cuda_device.h), returned by its next SynchronizeStream/Event; a host
// scalar is then NaN. The CPU table's kernels cannot fail.
// Thread-safety: tables are immutable and live for the whole program; the ops are as reentrant as
// the kernels (CPU: any number of threads on disjoint outputs).
#pragma once

#include <cstdint>

#include "absl/status/statusor.h"
#include "kernels/permute.h"
#include "runtime/device/device.h"

namespace furnace::device {

// Where each (token, choice) of a MoE layer goes (kernels/permute.h). Built on the host.
using DispatchPlan = kernels::cpu::DispatchPlan;

// The arithmetic of a table's GEMMs (see the file comment).
enum class Precision { kFp32, kBf16 };
// "fp32", "bf16": the values of model.precision.
const char* PrecisionName(Precision precision);

// fp32 ops (the model is fp32; casts are the only other dtypes). Field names are the kernel names
// in snake_case; argument order is the kernel's.
struct Backend {
  const char* name;  // "cpu", "emulated", "cuda", with "/bf16" for a bf16 table
  Precision precision;

  // matmul.h: out (N, OC) = inp (N, C) @ weight (C, OC) [+ bias (OC)], and per expert group.
  void (*matmul_forward)(float* out, const float* inp, const float* weight, const float* bias,
                         int N, int C, int OC);
  void (*matmul_backward)(float* dinp, float* dweight, float* dbias, const float* dout,
                          const float* inp, const float* weight, int N, int C, int OC);
  void (*grouped_matmul_forward)(float* out, const float* inp, const float* weight,
                                 const float* bias, const int64_t* offsets, int E, int C, int OC);
  void (*grouped_matmul_backward)(float* dinp, float* dweight, float* dbias, const float* dout,
                                  const float* inp, const float* weight, const int64_t* offsets,
                                  int E, int C, int OC);

  // attention.h: causal multi-head attention over qkv (B, T, 3C).
  void (*attention_forward)(float* out, float* att, const float* qkv, int B, int T, int C, int NH);
  void (*attention_backward)(float* dqkv, const float* dout, const float* qkv, const float* att,
                             int B, int T, int C, int NH);
  // attention.h's RowStats pair (model.attention_probs: recomputed): (B, NH, T, 2) row statistics
  // saved instead of the probabilities, which backward rebuilds block by block.
  void (*attention_forward_row_stats)(float* out, float* stats, const float* qkv, int B, int T,
                                      int C, int NH);
  void (*attention_backward_row_stats)(float* dqkv, const float* dout, const float* qkv,
                                       const float* stats, int B, int T, int C, int NH);
  // attention.h's AttentionProbs: attention_forward's att alone, bit for bit (the rebuild of an
  // att the adaptive memory planner dropped).
  void (*attention_probs)(float* att, const float* qkv, int B, int T, int C, int NH);

  // layernorm.h
  void (*layernorm_forward)(float* out, float* mean, float* rstd, const float* inp,
                            const float* weight, const float* bias, int N, int C, float eps);
  void (*layernorm_backward)(float* dinp, float* dweight, float* dbias, const float* dout,
                             const float* inp, const float* weight, const float* mean,
                             const float* rstd, int N, int C);

  // gelu.h (tanh approximation).
  void (*gelu_forward)(float* out, const float* inp, int64_t n);
  void (*gelu_backward)(float* dinp, const float* inp, const float* dout, int64_t n);

  // elementwise.h: the residual stream's adds and the head's transpose. add_row's `row` is HOST
  // memory (C values, read at the call, as the grouped GEMMs' offsets).
  void (*add_inplace)(float* out, const float* x, int64_t n);
  void (*bias_residual)(float* out, const float* bias, const float* x, int64_t N, int C);
  void (*add_row)(float* out, const float* row, int64_t N, int C);
  void (*transpose)(float* out, const float* inp, int rows, int cols);

  // encoder.h: token + position embeddings.
  void (*embedding_forward)(float* out, const int32_t* tokens, const float* wte, const float* wpe,
                            int B, int T, int C);
  void (*embedding_backward)(float* dwte, float* dwpe, const float* dout, const int32_t* tokens,
                             int B, int T, int C);

  // cross_entropy.h
  void (*cross_entropy_forward)(float* losses, float* probs, const float* logits,
                                const int32_t* targets, int N, int V);
  void (*cross_entropy_backward)(float* dlogits, const float* probs, const int32_t* targets,
                                 float dloss, int N, int V);

  // router.h: softmax gate, top-k selection and the load-balancing loss.
  void (*softmax_forward)(float* probs, const float* logits, int N, int E);
  void (*softmax_backward)(float* dlogits, const float* dprobs, const float* probs, int N, int E);
  void (*topk_forward)(int32_t* indices, float* gates, const float* probs, int N, int E, int k,
                       bool normalize);
  void (*topk_backward)(float* dprobs, const float* dgates, const float* probs,
                        const int32_t* indices, int N, int E, int k, bool normalize);
  float (*aux_loss_forward)(const float* probs, const int32_t* indices, int N, int E, int k,
                            float alpha);
  void (*aux_loss_backward)(float* dprobs, const int32_t* indices, int N, int E, int k, float alpha,
                            float daux);

  // permute.h: token permutation by expert and the weighted combine back.
  DispatchPlan (*make_dispatch_plan)(const int32_t* indices, int N, int E, int k,
                                     double capacity_factor);
  DispatchPlan (*make_dispatch_plan_slice)(const int32_t* indices, int N, int E, int k,
                                           double capacity_factor, int64_t group_tokens,
                                           const int64_t* queued);
  void (*permute_forward)(float* out, const float* inp, const DispatchPlan& plan, int C);
  void (*permute_backward)(float* dinp, const float* dout, const DispatchPlan& plan, int C);
  void (*unpermute_forward)(float* out, const float* expert_out, const float* gates,
                            const DispatchPlan& plan, int C);
  void (*unpermute_backward)(float* dexpert_out, float* dgates, const float* dout,
                             const float* expert_out, const float* gates, const DispatchPlan& plan,
                             int C);

  // optimizer.h: AdamW and the global-norm helpers for clipping.
  void (*adamw_update)(float* param, const float* grad, float* m, float* v, int64_t n, float lr,
                       float beta1, float beta2, float eps, float weight_decay, int64_t step);
  double (*sum_of_squares)(const float* x, int64_t n);
  // Over several ranges of one array (host arrays begin, count), added in range order: one host
  // round trip for all of them (a layout's global norm over the parameters each rank counts).
  double (*sum_of_squares_ranges)(const float* x, const int64_t* begin, const int64_t* count,
                                  int ranges);
  void (*scale)(float* x, float s, int64_t n);

  // cast.h: bf16 and block-scaled fp8 (e4m3) storage for reduced-precision stashes.
  void (*cast_f32_to_bf16)(uint16_t* out, const float* inp, int64_t n);
  void (*cast_bf16_to_f32)(float* out, const uint16_t* inp, int64_t n);
  void (*quantize_fp8_e4m3)(uint8_t* out, float* scales, const float* inp, int64_t n, int block);
  void (*dequantize_fp8_e4m3)(float* out, const uint8_t* inp, const float* scales, int64_t n,
                              int block);
};

// The stated tolerance of a bf16 table against the fp32 CPU table, per op: ||out - ref|| / ||ref||
// over each output buffer (an accumulated gradient starting from zero), on random inputs
// (uniform in [-1, 1]) at the shapes of a 1B-class MoE (d 2048, f 5632, head width 128, T 1024).
// A NaN or an infinity never passes. Measured on the emulated bf16 table, whose roundings the
// CUDA bf16 table shares (only the order of its fp32 sums differs); `bf16_tolerance_test` prints
// the values. Measured (OPENBLAS_NUM_THREADS=1 build/bin/bf16_tolerance_test): matmul and grouped
// matmul forward and backward (both GEMMs of an expert, dinp and dweight) 2.1e-3 each; attention
// out 2.2e-3, att 6.2e-4, dqkv 2.3e-3; with qkv 3x larger (sharper softmax) out 5.0e-3, att
// 4.5e-3, dqkv 3.2e-3. The bounds leave 3x to 5x of headroom over those.
// Every op not listed computes in fp32 in a bf16 table too, as in the fp32 table.
inline constexpr double kBf16MatmulTolerance = 1e-2;       // matmul, grouped matmul: fwd and bwd
inline constexpr double kBf16AttentionTolerance = 1.5e-2;  // attention: out, att and dqkv

// The CPU table (kernels::cpu). Always available.
const Backend& CpuBackend();
// The emulated device's table: kernels::cpu enqueued on the current stream of an emulated device,
// pointers translated (emulated_backend.cc). Always available.
const Backend& EmulatedBackend();
// The emulated device's bf16 table: the bf16 oracle kernels (kernels/matmul_bf16.h,
// attention_bf16.h) for the GEMMs and attention, EmulatedBackend's ops for the rest.
const Backend& EmulatedBf16Backend();

// The table for a kind of device at a precision: the one place that decides which kinds have a
// backend. Errors name the kind and the precision: InvalidArgument for bf16 on the CPU (it trains
// in fp32), FailedPrecondition for CUDA in a build without CUDA.
absl::StatusOr<const Backend*> BackendFor(Kind kind, Precision precision = Precision::kFp32);
// The table `device` runs on; BackendFor(kind)'s errors, naming the device. A CUDA device's GPU
// gets every kernel loaded here (LoadCudaKernels, cuda_backend.h); a failure to is Internal.
absl::StatusOr<const Backend*> BackendFor(const Device& device,
                                          Precision precision = Precision::kFp32);

// "cpu", "cuda", "emulated".
const char* KindName(Kind kind);

}  // namespace furnace::device
