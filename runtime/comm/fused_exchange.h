// The fused all-to-all + all-gather (Parm's "SAA"): an all-to-all over one group (`a2a`, usually
// the ranks of one node) followed by an all-gather of its result over another (`ag`, the ranks at
// the same position on the other nodes), pipelined so that the two kinds of traffic overlap.
//
// Why fused: done one after the other, the all-gather waits for the whole all-to-all. Here the
// all-to-all runs as G pairwise steps (step i sends chunk (a+i)%G of `in` to a2a rank (a+i)%G and
// receives from a2a rank (a-i+G)%G; step 0 is the self copy), and the chunk received at step i is
// all-gathered over `ag` on a second thread while step i+1 is exchanged on the caller's thread.
// Every member of `ag` runs the same steps, so the all-gather of step i collects, from every
// member q, the chunk q received at ITS step i; the caller says where each of those lands in `out`.
//
// On device communicators (both StreamCommunicators of one device, stream_communicator.h, with
// `in` and `out` in its memory: NCCL on a GPU, the emulated device's transport elsewhere) the same
// steps overlap on the device instead of on host threads: the calling thread enqueues everything,
// the all-to-all's steps on a2a's communication stream and step i's all-gather (and the copies
// that place its chunks) on ag's, which waits, per step, for an event recorded on a2a's stream
// after step i's Recv. Both streams first wait for the caller's current stream (the producer of
// `in`), and the caller's stream waits for both at the end, so `out` is ready in its order, as for
// any collective on a StreamCommunicator; the call returns once everything is enqueued.
//
// Communication, per call and rank: on `a2a` G-1 Sends and G-1 Recvs (tags kFusedExchangeTagBase
// + step; a pair's messages with one tag stay in order, so back-to-back calls do not mix) and one
// WaitSends (not on device communicators: there each step's sends are posted with its Recv and
// complete in a2a's stream order, which the caller's stream joins); on `ag` exactly G AllGatherV
// calls (one per step, zero-byte ones included), each with recv_bytes {chunk_bytes[q][i] for q}.
// The byte counters follow communicator.h.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "runtime/comm/communicator.h"

namespace furnace::comm {

// Point-to-point tags [kFusedExchangeTagBase, kFusedExchangeTagBase + G) on `a2a` belong to
// FusedAllToAllAllGather; other users of the same communicator must stay below the base.
inline constexpr uint32_t kFusedExchangeTagBase = 0x7F000000u;

// Where the fused op puts things. G = a2a.size(), a = a2a.rank(); n = ag.size(), q0 = ag.rank().
struct FusedLayout {
  // (G): chunk j of `in` (the chunks back to back) goes to a2a rank j.
  std::vector<int64_t> send_bytes;
  // (n)(G): the bytes ag member q received at its step i.
  std::vector<std::vector<int64_t>> chunk_bytes;
  // (n)(G): the byte offset in `out` where that chunk lands.
  std::vector<std::vector<int64_t>> chunk_offset;
};

// out (out_bytes): every chunk that any member of `ag` received in the all-to-all over its `a2a`,
// the chunk member q received at step i at out + chunk_offset[q][i] (= an all-to-all over a2a,
// then an all-gather over ag of its result, the result's pieces placed where the caller says).
// Bytes of `out` outside the chunks are left alone. in: sum(send_bytes) bytes.
//
// The caller guarantees what only the peers know: chunk_bytes[q0][i] equals what a2a rank
// (a-i+G)%G sends to this rank, and chunk_bytes/chunk_offset are the same on every member of
// `ag`. Every member of both groups calls this together (it is a collective on both).
//
// Errors: InvalidArgument, before anything is sent, when `a2a` and `ag` are the same object, a
// vector has the wrong size, a size or offset is negative, a chunk lies outside out_bytes, two
// non-empty chunks overlap, chunk_bytes[q0][0] != send_bytes[a], or a buffer is null where bytes
// are due. Otherwise the first failure of either communicator (the peers' ones reach this rank as
// their timeouts, communicator.h), with `out` partly written. A failed exchange stops the call:
// the gather thread stops waiting for steps that will not land and is joined (on every path). A
// failed all-gather does not stop the exchange, which completes on the healthy `a2a` (its peers
// are not left waiting, and no message of this call stays behind to be taken by the next one).
// Neither communicator is aborted here: a local failure is returned, not spread.
//
// Thread-safety: `a2a` is driven by the calling thread and `ag` by a thread this call starts and
// joins before it returns (on device communicators, both by the calling thread); neither may be
// used by anyone else during the call. `in` must not overlap `out`.
absl::Status FusedAllToAllAllGather(Communicator& a2a, Communicator& ag, const void* in, void* out,
                                    int64_t out_bytes, const FusedLayout& layout);

// Whether FusedAllToAllAllGather runs on the two communicators' streams (both StreamCommunicators
// of one device), so `in` and `out` are to be that device's memory; otherwise it moves its chunks
// with host copies and they must be host memory (a caller on a discrete device stages them).
bool FusedExchangeOnStreams(Communicator& a2a, Communicator& ag);

}  // namespace furnace::comm
