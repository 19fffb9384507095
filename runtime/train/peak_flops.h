// The CPU's peak for MFU (MODEL.md "FLOPs and MFU"): measured with the BLAS library's own large
// SGEMM in this process, with its current thread setting. On a GPU the datasheet figure is used
// instead.
#pragma once

namespace furnace::train {

// FLOP/s of an n x n x n SGEMM, best of `reps` after one warm-up. About 2n^3 * (reps + 1) FLOPs:
// n = 2048, reps = 2 costs ~0.3 s at 130 GFLOP/s.
double MeasureSgemmPeakFlops(int n = 2048, int reps = 2);

}  // namespace furnace::train
