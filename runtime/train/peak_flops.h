// The peak for MFU (MODEL.md "FLOPs and MFU"). On the CPU (and on the emulated device, which runs
// the CPU kernels) it is measured with the BLAS library's own large SGEMM in this process, with its
// current thread setting. On a GPU it is the datasheet's dense figure for the precision the GEMMs
// run at: bf16 tensor cores for model.precision bf16, plain fp32 (no TF32: the fp32 table's GEMMs
// are full fp32) for fp32.
#pragma once

#include <functional>
#include <string>

#include "absl/status/statusor.h"
#include "runtime/device/backend.h"

namespace furnace::train {

// FLOP/s of an n x n x n SGEMM, best of `reps` after one warm-up. About 2n^3 * (reps + 1) FLOPs:
// n = 2048, reps = 2 costs ~0.3 s at 130 GFLOP/s.
double MeasureSgemmPeakFlops(int n = 2048, int reps = 2);

// The machine's peak, measured once per machine (MODEL.md): read from
// `cache_dir`/peak_flops.<host>.txt, else measured with `measure` and written there. The first
// process of a machine that needs it measures while holding an exclusive lock on
// peak_flops.<host>.lock, and the others wait for it and read its figure: ranks started together
// never measure at once (each measurement would share the cores with the others, and ranks of one
// job got peaks 2x apart). `cached` (may be nullptr): the figure was read, not measured. Errors:
// the directory cannot be made or locked (the caller may measure without a cache).
absl::StatusOr<double> MachinePeakFlops(const std::string& cache_dir, const std::string& host,
                                        const std::function<double()>& measure,
                                        bool* cached = nullptr);

// The datasheet's dense peak of the GPU whose name (as CUDA reports it, e.g. "NVIDIA H200") is
// `gpu_name`, at `precision`; 0 for a GPU this table does not know (MFU is then not reported).
// `source` (may be nullptr) receives where the figure comes from, for the rank's log.
double DatasheetPeakFlops(const std::string& gpu_name, device::Precision precision,
                          std::string* source = nullptr);

}  // namespace furnace::train
