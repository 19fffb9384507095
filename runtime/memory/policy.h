// The static memory policies of `memory.policy` (DESIGN.md "Memory policies"), configured once for
// the run the way Megatron-style systems do:
//   none:           keep every tensor saved for backward;
//   selective:      drop the outputs of the LayerNorms and of the GELUs after forward and rebuild
//                   them in backward (cheap to recompute, as large as the tensors they feed);
//   full_recompute: selective, plus every rebuildable tensor of the MoE layers (router
//                   probabilities, top-k, the expert buffers and the combined expert output); on
//                   an expert-parallel layout the expert buffers are rebuilt by re-running the
//                   expert all-to-all on every rank of the group together;
//   offload:        drop nothing; a fixed share (memory.offload_ratio) of each MoE layer's expert
//                   buffers goes to host memory through the copy engine after the layer's forward
//                   and comes back before its backward (GptMoe::SetOffload; copy_engine.h).
//   adaptive:       drop nothing up front; after each MoE layer's token-count exchange the model
//                   projects its peak and, only when it would not fit, offloads, compresses or
//                   drops the tensors that free bytes cheapest (planner.h; GptMoe::SetAdaptive).
//                   A tensor whose rebuild needs a collective it drops only by the ranks'
//                   agreement (GptMoe "Collective drops"), so every rank drops it alike.
// A policy is a pure function of a tensor's tag (its producer without the layer prefix, e.g.
// "moe.expert_hidden"), so every rank of a layout takes the same action on the same tensor in the
// same order: that is what lets a static policy drop a tensor whose rebuild needs a collective.
// Every tag a policy drops has a rebuild in its module (runtime/model); a stash refuses a policy
// that drops a tensor without one. Results do not change: a rebuild re-runs the forward's own
// kernels on the same inputs, and an offloaded tensor comes back byte for byte, so the losses and
// parameters are bit-identical to `none`.
//
// Thread-safety: pure functions. Errors: ParseMemoryPolicy returns InvalidArgument for a name that
// is no policy.
#pragma once

#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace furnace::memory {

enum class MemoryPolicy { kNone, kSelective, kFullRecompute, kOffload, kAdaptive };

// What becomes of a saved tensor once the forward of its module is done.
enum class SaveAction { kKeep, kDropAfterForward };

// "none", "selective", "full_recompute", "offload", "adaptive" (the names of the job spec's
// memory.policy).
absl::StatusOr<MemoryPolicy> ParseMemoryPolicy(std::string_view name);
const char* MemoryPolicyName(MemoryPolicy policy);

// "layers.3.moe.expert_hidden" -> "moe.expert_hidden"; a producer outside the layers ("lnf.out")
// is its own tag.
std::string_view TensorTag(std::string_view producer);

// The action `policy` takes on the tensor tagged `tag`.
SaveAction StaticSaveAction(MemoryPolicy policy, std::string_view tag);

// The policy `offload`'s choice among one MoE layer's expert buffers of `bytes` each (at most 16):
// the indices, ascending, of the non-empty subset whose total comes closest to `ratio` of all of
// them (ties: fewer bytes, then the earlier subset). A buffer is the unit that moves, so a ratio
// below the smallest buffer's share still moves that buffer rather than nothing. Empty when
// `ratio` <= 0 or every buffer is empty.
std::vector<size_t> OffloadShare(const std::vector<uint64_t>& bytes, double ratio);

}  // namespace furnace::memory
