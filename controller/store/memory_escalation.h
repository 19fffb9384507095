// Out-of-memory escalation: the memory policy of the next attempt after an attempt that ran out of
// memory. Routing spikes are seeded by step, so a restart from the last checkpoint replays the
// same spike under the same policy and would fail again forever; the controller instead does
// what an operator would after such a crash and restarts with a more conservative static policy:
//   none -> selective -> full_recompute
//   offload, adaptive -> full_recompute   (their own means did not suffice; the static policy
//                                          that keeps the fewest bytes is what is left)
//   full_recompute -> none left: the failure is permanent (a restart would fail the same way)
// Policies are the `memory.policy` words of the job spec; an empty policy means "none".
#pragma once

#include <optional>
#include <string>

namespace furnace::controller {

// The policy to restart with after an out-of-memory exit under `policy`; nullopt when `policy`
// is already the most conservative one (or a word this ladder does not know).
std::optional<std::string> EscalatedMemoryPolicy(const std::string& policy);

}  // namespace furnace::controller
