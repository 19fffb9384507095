#include "runtime/data/epoch_sampler.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "runtime/base/blend_slots.h"
#include "runtime/base/status.h"
#include "runtime/data/counter_rng.h"

namespace furnace::data {
namespace {

constexpr uint64_t kEpochStream = 0x45504F43ull;  // "EPOC": keys each epoch's permutation

// One dataset's windows in the requested part: [first, first + count).
struct Part {
  std::shared_ptr<const TokenStream> stream;
  std::string fingerprint;  // TokenStream::Fingerprint, for the order
  int64_t first = 0;
  int64_t count = 0;
  int64_t slots = 0;  // n_d: its slots per period of the blend
};

const char* PartName(SplitPart p) {
  switch (p) {
    case SplitPart::kAll:
      return "all";
    case SplitPart::kTrain:
      return "train";
    case SplitPart::kValidation:
      return "validation";
  }
  return "?";
}

class EpochSampler : public Sampler {
 public:
  EpochSampler(std::vector<Part> parts, std::vector<int> layout, SamplerConfig config,
               EpochSamplerOptions options)
      : parts_(std::move(parts)),
        layout_(std::move(layout)),
        config_(config),
        options_(options),
        global_batch_(config.global_batch > 0 ? config.global_batch : config.batch) {
    rank_.resize(layout_.size());
    std::vector<int64_t> seen(parts_.size(), 0);
    for (size_t s = 0; s < layout_.size(); ++s) rank_[s] = seen[layout_[s]]++;
    order_ = absl::StrFormat(
        "epoch sampler v1: seq_len %d, seed %d, global batch %d, part %s, fraction %g, %s",
        config_.seq_len, config_.seed, global_batch_, PartName(options_.part),
        options_.validation_fraction, options_.shuffle ? "shuffled per epoch" : "in order");
    for (const Part& p : parts_) {
      absl::StrAppendFormat(&order_, "; [%s: windows %d..%d, %d of %d slots]", p.fingerprint,
                            p.first, p.first + p.count, p.slots, layout_.size());
    }
  }

  absl::StatusOr<Batch> Sample(int64_t step,
                               int /*dp_rank: callers pass 0 and a global micro-batch*/,
                               int micro_batch) const override {
    // A training sampler's step holds global_batch / B micro-batches: one past them would read
    // the next step's sequences (SamplerConfig.global_batch left at 0 with several micro-batches).
    if (options_.shuffle &&
        (micro_batch < 0 || (int64_t{micro_batch} + 1) * config_.batch > global_batch_)) {
      return absl::InvalidArgumentError(
          absl::StrCat("sampler: micro-batch ", micro_batch, " of a step of ", global_batch_,
                       " sequences (micro_batch ", config_.batch,
                       "): SamplerConfig.global_batch must be micro_batch * micro_batches * dp"));
    }
    Batch batch = EmptyBatch(config_);
    const int T = config_.seq_len;
    std::vector<int32_t> window(T + 1);
    for (int b = 0; b < config_.batch; ++b) {
      const int64_t position = step * global_batch_ + int64_t{micro_batch} * config_.batch + b;
      const auto [d, q] = Locate(position);
      const Part& part = parts_[d];
      const int64_t w = WindowAt(d, q);
      if (absl::Status read = part.stream->Read(w * T, T + 1, window.data()); !read.ok()) {
        // Held-out samplers read in order (data_sources.h): their index is the eval batch.
        const std::string batch_name =
            options_.shuffle ? absl::StrCat("step ", step + 1, ", micro-batch ", micro_batch)
                             : absl::StrCat("held-out batch ", micro_batch);
        return DataError(
            absl::Status(read.code(), absl::StrCat(read.message(), " (window ", w, " of ", T + 1,
                                                   " tokens, read for ", batch_name, ")")));
      }
      std::copy(window.begin(), window.end() - 1, batch.inputs.begin() + b * T);
      std::copy(window.begin() + 1, window.end(), batch.targets.begin() + b * T);
    }
    return batch;
  }
  int64_t vocab() const override {
    int64_t v = 0;
    for (const Part& p : parts_) v = std::max(v, p.stream->vocab());
    return v;
  }
  const SamplerConfig& config() const override { return config_; }
  DataPosition PositionAt(int64_t step) const override {
    DataPosition p;
    p.order = order_;
    p.sequences = step * global_batch_;
    // Each dataset's own position: how many of the first `sequences` positions went to it.
    const int64_t K = static_cast<int64_t>(layout_.size());
    std::vector<int64_t> q(parts_.size(), 0);
    for (size_t d = 0; d < parts_.size(); ++d) q[d] = p.sequences / K * parts_[d].slots;
    for (int64_t s = 0; s < p.sequences % K; ++s) ++q[static_cast<size_t>(layout_[s])];
    for (size_t d = 0; d < parts_.size(); ++d) {
      const Part& part = parts_[d];
      p.datasets.push_back({.path = part.stream->path(),
                            .epoch = q[d] / part.count,
                            .index_in_epoch = q[d] % part.count,
                            .epoch_sequences = part.count});
    }
    p.epoch_sequences = p.datasets[0].epoch_sequences;
    p.epoch = p.datasets[0].epoch;
    p.index_in_epoch = p.datasets[0].index_in_epoch;
    return p;
  }

 private:
  // Global position -> (dataset, that dataset's own position).
  std::pair<int, int64_t> Locate(int64_t position) const {
    const int64_t K = static_cast<int64_t>(layout_.size());
    const int d = layout_[position % K];
    return {d, position / K * parts_[d].slots + rank_[position % K]};
  }
  // Dataset d's own position q -> its window index in the stream.
  int64_t WindowAt(int d, int64_t q) const {
    const Part& part = parts_[d];
    const int64_t epoch = q / part.count;
    const int64_t j = q % part.count;
    if (!options_.shuffle) return part.first + j;
    const FeistelPermutation perm(static_cast<uint64_t>(part.count),
                                  HashKey({config_.seed, kEpochStream, static_cast<uint64_t>(d),
                                           static_cast<uint64_t>(epoch)}));
    return part.first + static_cast<int64_t>(perm.At(static_cast<uint64_t>(j)));
  }

  std::vector<Part> parts_;
  std::vector<int> layout_;    // (K) the dataset of each slot of the period
  std::vector<int64_t> rank_;  // (K) how many earlier slots of the period hold the same dataset
  SamplerConfig config_;
  EpochSamplerOptions options_;
  int64_t global_batch_;
  std::string order_;
};

// Slot counts by largest remainder of K * w_d / sum(w), then spread by the smooth weighted
// round-robin (each slot goes to the dataset with the largest accumulated credit).
absl::StatusOr<std::vector<int>> BlendLayout(const std::vector<EpochSource>& sources,
                                             std::vector<Part>& parts) {
  if (sources.size() == 1) {
    parts[0].slots = 1;
    return std::vector<int>{0};
  }
  std::vector<double> weights;
  double total = 0;
  for (const EpochSource& s : sources) {
    weights.push_back(s.weight);
    total += s.weight;
  }
  for (size_t d = 0; d < sources.size(); ++d) {
    if (!(sources[d].weight > 0)) {
      return absl::InvalidArgumentError(
          absl::StrCat("data.blend: ", sources[d].stream->path(), " has weight ", sources[d].weight,
                       " (allowed: a positive number; only the weights' ratios matter)"));
    }
  }
  const std::optional<std::vector<int64_t>> counts = BlendSlotCounts(weights);
  if (!counts.has_value()) {
    return absl::InvalidArgumentError(absl::StrCat("data.blend: the weights sum to ", total,
                                                   " (allowed: positive weights whose sum is a "
                                                   "finite number; only their ratios matter)"));
  }
  for (size_t d = 0; d < sources.size(); ++d) {
    if ((*counts)[d] == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("data.blend: ", sources[d].stream->path(), " has weight ", sources[d].weight,
                       " of ", total, " in all, below 1/", kBlendSlots,
                       " of the blend (allowed: a share >= 1/", kBlendSlots, ")"));
    }
    parts[d].slots = (*counts)[d];
  }
  std::vector<int> layout(kBlendSlots);
  std::vector<int64_t> credit(sources.size(), 0);
  for (int64_t s = 0; s < kBlendSlots; ++s) {
    for (size_t d = 0; d < sources.size(); ++d) credit[d] += (*counts)[d];
    size_t best = 0;  // the largest credit, the lowest index on a tie
    for (size_t d = 1; d < sources.size(); ++d) {
      if (credit[d] > credit[best]) best = d;
    }
    credit[best] -= kBlendSlots;
    layout[s] = static_cast<int>(best);
  }
  return layout;
}

}  // namespace

FeistelPermutation::FeistelPermutation(uint64_t n, uint64_t key) : n_(n), key_(key) {
  while (half_bits_ < 32 && (uint64_t{1} << (2 * half_bits_)) < n_) ++half_bits_;
}

uint64_t FeistelPermutation::Encrypt(uint64_t x) const {
  const uint64_t mask = (uint64_t{1} << half_bits_) - 1;
  uint64_t left = x >> half_bits_, right = x & mask;
  for (uint64_t round = 0; round < 4; ++round) {
    const uint64_t f = SplitMix64(key_ ^ SplitMix64(round ^ (right << 2))) & mask;
    const uint64_t next = left ^ f;
    left = right;
    right = next;
  }
  return (left << half_bits_) | right;
}

uint64_t FeistelPermutation::At(uint64_t i) const {
  // Cycle walking: Encrypt permutes [0, 4^half_bits); re-encrypting until the value falls in
  // [0, n) is a bijection of [0, n) (n > a quarter of the domain: under 4 tries on average).
  uint64_t x = Encrypt(i);
  while (x >= n_) x = Encrypt(x);
  return x;
}

absl::StatusOr<std::unique_ptr<Sampler>> MakeEpochSampler(std::vector<EpochSource> sources,
                                                          const SamplerConfig& config,
                                                          const EpochSamplerOptions& options) {
  if (auto s = CheckSamplerConfig(config); !s.ok()) return s;
  if (sources.empty()) return absl::InvalidArgumentError("epoch sampler: no dataset");
  if (options.part != SplitPart::kAll &&
      !(options.validation_fraction > 0 && options.validation_fraction <= 0.5)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "data.validation.fraction: ", options.validation_fraction, " (allowed: (0, 0.5])"));
  }
  const int64_t T = config.seq_len;
  std::vector<Part> parts;
  for (const EpochSource& s : sources) {
    if (s.stream == nullptr) return absl::InvalidArgumentError("epoch sampler: null dataset");
    if (!(s.weight > 0)) {
      return absl::InvalidArgumentError(absl::StrCat("data.blend: ", s.stream->path(),
                                                     " has weight ", s.weight, " (allowed: > 0)"));
    }
    const int64_t windows = s.stream->size() > 0 ? (s.stream->size() - 1) / T : 0;
    ASSIGN_OR_RETURN(std::string fingerprint, s.stream->Fingerprint());
    Part part{.stream = s.stream, .fingerprint = std::move(fingerprint)};
    const int64_t held_out = std::max<int64_t>(
        1, std::llround(options.validation_fraction * static_cast<double>(windows)));
    switch (options.part) {
      case SplitPart::kAll:
        part.count = windows;
        break;
      case SplitPart::kTrain:
        part.count = windows - held_out - 1;  // the window before the held-out ones is dropped
        break;
      case SplitPart::kValidation:
        part.first = windows - held_out;
        part.count = windows >= held_out + 2 ? held_out : 0;
        break;
    }
    if (part.count < 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          s.stream->path(), ": ", s.stream->size(), " tokens make ", windows,
          " sequences of seq_len + 1 = ", T + 1, " tokens",
          options.part == SplitPart::kAll
              ? ""
              : absl::StrCat(", too few for a held-out fraction of ", options.validation_fraction,
                             " (", held_out, " held out, one dropped, the rest trained on)"),
          "; needs at least ", options.part == SplitPart::kAll ? 1 : held_out + 2));
    }
    parts.push_back(std::move(part));
  }
  absl::StatusOr<std::vector<int>> layout = BlendLayout(sources, parts);
  if (!layout.ok()) return layout.status();
  return std::make_unique<EpochSampler>(std::move(parts), std::move(*layout), config, options);
}

}  // namespace furnace::data
