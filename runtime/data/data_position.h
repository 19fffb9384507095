// Where a sampler stands before a step (sampler.h): recorded in checkpoints (the manifest's "data"
// object) and checked on resume, so a resumed run reads exactly the sequences an uninterrupted run
// would or is refused with the reason.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace furnace::data {

// One dataset's own place in its epochs (a blend's datasets each have their own).
struct DatasetPosition {
  std::string path;
  int64_t epoch = 0;           // the epoch of its next sequence
  int64_t index_in_epoch = 0;  // ... and that sequence's index within it
  int64_t epoch_sequences = 0;
};

struct DataPosition {
  // What defines the order (source, content fingerprints, seq_len, seed, global batch, split).
  // A resumed run must have the same text, or it would read other sequences. Empty: unknown
  // (a checkpoint written before positions were recorded).
  std::string order;
  int64_t sequences = 0;        // sequences drawn by all earlier steps (step * global batch)
  int64_t epoch = 0;            // finite sources: the epoch of the next sequence (first dataset)
  int64_t index_in_epoch = 0;   // ... and its index within that epoch
  int64_t epoch_sequences = 0;  // sequences per epoch (first dataset); 0: endless (markov)
  // Every dataset's own place, in blend order (finite sources; empty: markov, or a checkpoint
  // written before they were recorded). Informative: a resume checks order and sequences.
  std::vector<DatasetPosition> datasets;
};

}  // namespace furnace::data
