// Out-of-memory escalation: the memory policy of the next attempt after an attempt that ran out of
// memory. Routing spikes are seeded by step, so a restart from the last checkpoint replays the
// same spike under the same policy and would fail again forever; the controller instead does
// what an operator would after such a crash and restarts with a policy that needs less:
//   - with a memory.device_budget (the budget ran out): every policy but adaptive -> adaptive, at
//     the same budget. Adaptive needs the least of all (it trains at every budget from the floor no
//     policy goes below, acting only on the steps that would not fit, bit-identical to none
//     without a codec), so no static rung can fit a step it cannot. An adaptive attempt that ran
//     out has nothing left: the step's routing needed more than the budget holds.
//   - without one (the device's own memory ran out; adaptive needs a budget to plan against):
//     none -> selective -> full_recompute, offload -> full_recompute; nothing after
//     full_recompute.
// Before, adaptive and offload went to full_recompute, which needs more than adaptive (often
// more than the budget on ordinary steps) and spent a restart on a certain failure.
// Policies are the `memory.policy` words of the job spec; an empty policy means "none".
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace furnace::controller {

// The policy to restart with after an out-of-memory exit under `policy` with the job's
// memory.device_budget (0: none set); nullopt when nothing needs less (or a word this ladder does
// not know).
std::optional<std::string> EscalatedMemoryPolicy(const std::string& policy, uint64_t device_budget);

}  // namespace furnace::controller
