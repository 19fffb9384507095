// Runs one real process per rank for the distributed benchmarks (the approach of
// tests/runtime/parallel/layout_run.cc): RunForked forks `world` children; child r runs body(r)
// and _exit()s with its return value (0 = ok), never returning into the caller. The parent waits
// for all of them up to deadline_s, then SIGKILLs what is left.
//
// Call only from a single-threaded parent (no Gloo context, no BLAS or torch thread pool alive):
// a child inherits nothing but the calling thread. Returns, per rank, "" or what went wrong.
#pragma once

#include <functional>
#include <string>
#include <vector>

namespace furnace::bench {

std::vector<std::string> RunForked(int world, const std::function<int(int rank)>& body,
                                   double deadline_s);

}  // namespace furnace::bench
