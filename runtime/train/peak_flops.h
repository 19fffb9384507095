// The peak for MFU (MODEL.md "FLOPs and MFU"). On the CPU (and on the emulated device, which runs
// the CPU kernels) it is measured with the BLAS library's own large SGEMM in this process, with its
// current thread setting. On a GPU it is the datasheet's dense figure for the precision the GEMMs
// run at: bf16 tensor cores for model.precision bf16, plain fp32 (no TF32: the fp32 table's GEMMs
// are full fp32) for fp32.
#pragma once

#include <string>

#include "runtime/device/backend.h"

namespace furnace::train {

// FLOP/s of an n x n x n SGEMM, best of `reps` after one warm-up. About 2n^3 * (reps + 1) FLOPs:
// n = 2048, reps = 2 costs ~0.3 s at 130 GFLOP/s.
double MeasureSgemmPeakFlops(int n = 2048, int reps = 2);

// The datasheet's dense peak of the GPU whose name (as CUDA reports it, e.g. "NVIDIA H200") is
// `gpu_name`, at `precision`; 0 for a GPU this table does not know (MFU is then not reported).
// `source` (may be nullptr) receives where the figure comes from, for the rank's log.
double DatasheetPeakFlops(const std::string& gpu_name, device::Precision precision,
                          std::string* source = nullptr);

}  // namespace furnace::train
