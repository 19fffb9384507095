// Embedding: a grid-stride loop over (B, T, C) for the forward. The backward is deterministic
// and adds in the CPU kernel's order, so its results equal the CPU oracle's bit for bit: a stable
// radix sort (CUB) of the positions by token, then a run-length encoding of the sorted tokens and
// a scan of the run lengths give each token present its positions in position order; one thread
// per (token, column) adds its dout rows to dwte in that order (no atomics; the run's length is
// known up front, so its loads overlap). dwpe adds the batch's rows in batch order.
#include <algorithm>
#include <climits>
#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_run_length_encode.cuh>
#include <cub/device/device_scan.cuh>

#include "common.cuh"
#include "kernels/cuda/encoder.h"

namespace furnace::kernels::cuda {
namespace {

__global__ void EmbeddingForwardKernel(float* out, const int32_t* tokens, const float* wte,
                                       const float* wpe, int64_t BT, int Tlen, int C) {
  int64_t total = BT * C;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total;
       i += int64_t{gridDim.x} * blockDim.x) {
    int64_t bt = i / C;
    int c = static_cast<int>(i % C);
    int t = static_cast<int>(bt % Tlen);
    out[i] = wte[int64_t{tokens[bt]} * C + c] + wpe[int64_t{t} * C + c];
  }
}

__global__ void IotaKernel(uint32_t* out, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    out[i] = static_cast<uint32_t>(i);
  }
}

// Over (r, c) for the runs r of the sorted tokens: run r's token row gets the run's dout rows
// added in position order (the stable sort kept it), starting from dwte. Threads past the number
// of runs (known only on the device) have nothing to do.
__global__ void EmbeddingBackwardWteKernel(float* dwte, const float* dout,
                                           const uint32_t* run_tokens, const uint32_t* run_lengths,
                                           const uint32_t* run_offsets, const int* num_runs,
                                           const uint32_t* sorted_positions, int64_t BT, int C) {
  const int64_t runs = *num_runs;
  const int64_t total = (runs < BT ? runs : BT) * C;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t r = i / C;
    const int c = static_cast<int>(i % C);
    const uint32_t* positions = sorted_positions + run_offsets[r];
    const uint32_t length = run_lengths[r];
    float* row = dwte + int64_t{run_tokens[r]} * C;
    float acc = row[c];
#pragma unroll 8
    for (uint32_t m = 0; m < length; ++m) acc += dout[int64_t{positions[m]} * C + c];
    row[c] = acc;
  }
}

// dwpe[t, c] += dout[b, t, c] for b = 0, 1, ... in turn (the CPU kernel's order).
__global__ void EmbeddingBackwardWpeKernel(float* dwpe, const float* dout, int B, int Tlen, int C) {
  int64_t total = int64_t{Tlen} * C;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total;
       i += int64_t{gridDim.x} * blockDim.x) {
    float acc = dwpe[i];
    for (int b = 0; b < B; ++b) acc += dout[int64_t{b} * total + i];
    dwpe[i] = acc;
  }
}

// The pieces of the backward's workspace for n tokens (each 256-aligned, in this order).
struct BackwardWorkspace {
  uint32_t* positions = nullptr;         // 0, 1, ..., n - 1
  uint32_t* sorted_tokens = nullptr;     // the tokens, sorted (stable)
  uint32_t* sorted_positions = nullptr;  // their positions, in the same order
  uint32_t* run_tokens = nullptr;        // each run's token (the tokens present, ascending)
  uint32_t* run_lengths = nullptr;       // each run's length (zeroed past the runs)
  uint32_t* run_offsets = nullptr;       // each run's first index into sorted_positions
  int* num_runs = nullptr;               // one int
  void* temp = nullptr;                  // CUB's temporary storage
};

BackwardWorkspace CarveBackwardWorkspace(void* base, int n, size_t temp_bytes) {
  internal::WorkspaceCarver carve(base);
  BackwardWorkspace w;
  w.positions = carve.Take<uint32_t>(n);
  w.sorted_tokens = carve.Take<uint32_t>(n);
  w.sorted_positions = carve.Take<uint32_t>(n);
  w.run_tokens = carve.Take<uint32_t>(n);
  w.run_lengths = carve.Take<uint32_t>(n);
  w.run_offsets = carve.Take<uint32_t>(n);
  w.num_runs = carve.Take<int>(1);
  w.temp = carve.Take<char>(static_cast<int64_t>(temp_bytes));
  return w;
}

size_t WorkspaceBytes(int n, size_t temp_bytes) {
  return 6 * internal::AlignUp(static_cast<size_t>(n) * sizeof(uint32_t)) +
         internal::AlignUp(sizeof(int)) + internal::AlignUp(temp_bytes);
}

// CUB's stable sort of (token, position) by token, its run-length encoding of the sorted tokens
// and its exclusive scan of the run lengths, one after another on `stream` with one temporary
// storage. With w.temp null (CUB's size query: no device work), sets *temp_bytes to the largest
// of the three's needs; else runs them, with *temp_bytes the storage's size. The same calls
// either way, so the query is for exactly what runs. False on error (recorded).
bool SortAndEncode(const BackwardWorkspace& w, size_t* temp_bytes, const int32_t* tokens, int n,
                   cudaStream_t stream) {
  size_t sort = *temp_bytes, encode = *temp_bytes, scan = *temp_bytes;
  // Tokens are in [0, V), so their bits as unsigned sort as the values do.
  const bool ok =
      FURNACE_CHECK_CUDA(
          "EmbeddingBackward",
          cub::DeviceRadixSort::SortPairs(w.temp, sort, reinterpret_cast<const uint32_t*>(tokens),
                                          w.sorted_tokens, w.positions, w.sorted_positions, n, 0,
                                          static_cast<int>(sizeof(uint32_t) * 8), stream)) &&
      FURNACE_CHECK_CUDA("EmbeddingBackward", cub::DeviceRunLengthEncode::Encode(
                                                  w.temp, encode, w.sorted_tokens, w.run_tokens,
                                                  w.run_lengths, w.num_runs, n, stream)) &&
      FURNACE_CHECK_CUDA(
          "EmbeddingBackward",
          cub::DeviceScan::ExclusiveSum(w.temp, scan, w.run_lengths, w.run_offsets, n, stream));
  if (ok && w.temp == nullptr) *temp_bytes = std::max({sort, encode, scan});
  return ok;
}

size_t TempBytes(int n) {
  size_t bytes = 0;
  return SortAndEncode(BackwardWorkspace{}, &bytes, nullptr, n, nullptr) ? bytes : 0;
}

constexpr int kBlock = 256;

FURNACE_PRELOAD_KERNELS(EmbeddingForwardKernel, IotaKernel, EmbeddingBackwardWteKernel,
                        EmbeddingBackwardWpeKernel);

// CUB's kernels (the sort's, the encoding's, the scan's) are not this file's to list: they load
// when they run. So the backward runs once, small (C = 1, token 0 throughout), for one token and
// for 65,536 (past one tile CUB runs other kernels), on a stream of its own with stream-ordered
// memory, and only that stream is waited for.
std::string PreloadCubKernels() {
  cudaStream_t stream = nullptr;
  if (!FURNACE_CHECK_CUDA("PreloadCubKernels",
                          cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking))) {
    return TakeLastError();
  }
  for (int n : {1, 1 << 16}) {
    const size_t ws_bytes = EmbeddingBackwardWorkspaceBytes(1, n);
    const size_t bytes = ws_bytes + internal::AlignUp(sizeof(float)) +
                         2 * internal::AlignUp(sizeof(float) * n) +
                         internal::AlignUp(sizeof(int32_t) * n);
    void* base = nullptr;
    if (ws_bytes == 0 ||
        !FURNACE_CHECK_CUDA("PreloadCubKernels", cudaMallocAsync(&base, bytes, stream))) {
      break;
    }
    internal::WorkspaceCarver carve(base);
    void* workspace = carve.Take<char>(static_cast<int64_t>(ws_bytes));
    float* dwte = carve.Take<float>(1);
    float* dwpe = carve.Take<float>(n);
    float* dout = carve.Take<float>(n);
    int32_t* tokens = carve.Take<int32_t>(n);
    if (FURNACE_CHECK_CUDA("PreloadCubKernels", cudaMemsetAsync(base, 0, bytes, stream))) {
      EmbeddingBackward(dwte, dwpe, dout, tokens, 1, n, 1, workspace, stream);
    }
    FURNACE_CHECK_CUDA("PreloadCubKernels", cudaFreeAsync(base, stream));
  }
  FURNACE_CHECK_CUDA("PreloadCubKernels", cudaStreamSynchronize(stream));
  cudaStreamDestroy(stream);
  return TakeLastError();
}

FURNACE_PRELOAD_HOOK(PreloadCubKernels);

}  // namespace

void EmbeddingForward(float* out, const int32_t* tokens, const float* wte, const float* wpe, int B,
                      int Tlen, int C, cudaStream_t stream) {
  int64_t BT = int64_t{B} * Tlen;
  if (BT <= 0 || C <= 0) return;
  EmbeddingForwardKernel<<<internal::GridFor(BT * C, kBlock), kBlock, 0, stream>>>(
      out, tokens, wte, wpe, BT, Tlen, C);
  FURNACE_CHECK_LAUNCH("EmbeddingForward");
}

size_t EmbeddingBackwardWorkspaceBytes(int B, int Tlen) {
  const int64_t BT = int64_t{B} * Tlen;
  if (BT <= 0 || BT > INT_MAX) return 0;
  const int n = static_cast<int>(BT);
  return WorkspaceBytes(n, TempBytes(n));
}

void EmbeddingBackward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int B,
                       int Tlen, int C, void* workspace, cudaStream_t stream) {
  const int64_t BT = int64_t{B} * Tlen;
  if (BT <= 0 || C <= 0) return;
  if (BT > INT_MAX) {
    internal::RecordError("EmbeddingBackward", "B * T", "more than 2^31 - 1 tokens", __FILE__,
                          __LINE__);
    return;
  }
  const int n = static_cast<int>(BT);
  size_t temp_bytes = TempBytes(n);
  const BackwardWorkspace w = CarveBackwardWorkspace(workspace, n, temp_bytes);
  IotaKernel<<<internal::GridFor(n, kBlock), kBlock, 0, stream>>>(w.positions, n);
  const bool ok =
      FURNACE_CHECK_LAUNCH("EmbeddingBackward") &&
      FURNACE_CHECK_CUDA("EmbeddingBackward",
                         cudaMemsetAsync(w.run_lengths, 0, sizeof(uint32_t) * n, stream)) &&
      SortAndEncode(w, &temp_bytes, tokens, n, stream);
  if (!ok) return;
  EmbeddingBackwardWteKernel<<<internal::GridFor(BT * C, kBlock), kBlock, 0, stream>>>(
      dwte, dout, w.run_tokens, w.run_lengths, w.run_offsets, w.num_runs, w.sorted_positions, BT,
      C);
  if (!FURNACE_CHECK_LAUNCH("EmbeddingBackward")) return;
  EmbeddingBackwardWpeKernel<<<internal::GridFor(int64_t{Tlen} * C, kBlock), kBlock, 0, stream>>>(
      dwpe, dout, B, Tlen, C);
  FURNACE_CHECK_LAUNCH("EmbeddingBackward");
}

}  // namespace furnace::kernels::cuda
