#include "runtime/data/sampler.h"

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <thread>
#include <tuple>
#include <utility>

#include "absl/strings/cord.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "runtime/data/counter_rng.h"

namespace furnace::data {
namespace {

// The constants keep the training ("DATA") and held-out ("VALI") streams apart from each other
// and from any other use of the same seed.
constexpr uint64_t kTrainStream = 0x44415441ull;
constexpr uint64_t kValidationStream = 0x56414C49ull;

constexpr absl::string_view kDataErrorPayload = "furnace.data/error";

uint64_t SequenceKey(uint64_t seed, uint64_t stream, int64_t step, int dp_rank, int micro_batch,
                     int b) {
  return HashKey({seed, stream, static_cast<uint64_t>(step), static_cast<uint64_t>(dp_rank),
                  static_cast<uint64_t>(micro_batch), static_cast<uint64_t>(b)});
}

class MarkovSampler : public Sampler {
 public:
  MarkovSampler(std::shared_ptr<const MarkovChain> chain, SamplerConfig config, bool validation)
      : chain_(std::move(chain)),
        config_(config),
        stream_(validation ? kValidationStream : kTrainStream) {
    // The chain itself defines the order: its transitions, hashed bit for bit.
    uint64_t h = HashKey({static_cast<uint64_t>(chain_->vocab())});
    for (int i = 0; i < chain_->vocab(); ++i) {
      for (int j = 0; j < chain_->vocab(); ++j) {
        uint64_t bits;
        const double p = chain_->transition(i, j);
        std::memcpy(&bits, &p, sizeof(bits));
        h = HashKey({h, bits});
      }
    }
    // And the batch shape: a step's sequences are keyed by (micro-batch, row), so another B or
    // global batch reads other sequences at the same step (v1 left both out).
    order_ = absl::StrFormat(
        "markov v2: vocab %d, chain %016x, seed %d, seq_len %d, batch %d, global batch %d, %s",
        chain_->vocab(), h, config_.seed, config_.seq_len, config_.batch,
        config_.global_batch > 0 ? config_.global_batch : config_.batch,
        validation ? "validation" : "train");
  }

  absl::StatusOr<Batch> Sample(int64_t step, int dp_rank, int micro_batch) const override {
    Batch batch = EmptyBatch(config_);
    const int T = config_.seq_len;
    for (int b = 0; b < config_.batch; ++b) {
      CounterRng rng(SequenceKey(config_.seed, stream_, step, dp_rank, micro_batch, b));
      int32_t* in = batch.inputs.data() + static_cast<size_t>(b) * T;
      int32_t* tg = batch.targets.data() + static_cast<size_t>(b) * T;
      int state = chain_->SampleInitial(rng);
      for (int t = 0; t < T; ++t) {
        in[t] = state;
        state = chain_->SampleNext(state, rng);
        tg[t] = state;
      }
    }
    return batch;
  }
  int64_t vocab() const override { return chain_->vocab(); }
  const SamplerConfig& config() const override { return config_; }
  DataPosition PositionAt(int64_t step) const override {
    DataPosition p;
    p.order = order_;
    p.sequences = step * (config_.global_batch > 0 ? config_.global_batch : config_.batch);
    p.index_in_epoch = p.sequences;
    return p;
  }

 private:
  std::shared_ptr<const MarkovChain> chain_;
  SamplerConfig config_;
  uint64_t stream_;
  std::string order_;
};

// The prefetching wrapper (sampler.h). One background thread; `mu_` guards the rest.
class PrefetchingSampler : public Sampler {
 public:
  using Key = std::tuple<int64_t, int, int>;  // (step, dp_rank, micro-batch)

  PrefetchingSampler(std::unique_ptr<Sampler> inner, int first_micro, int micro_count, int depth)
      : inner_(std::move(inner)),
        first_(first_micro),
        count_(micro_count),
        depth_(depth),
        thread_([this] { Loop(); }) {}

  ~PrefetchingSampler() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }

  absl::StatusOr<Batch> Sample(int64_t step, int dp_rank, int micro_batch) const override {
    const Key key{step, dp_rank, micro_batch};
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return !working_ || *working_ != key; });
    std::optional<absl::StatusOr<Batch>> batch;
    if (auto it = ready_.find(key); it != ready_.end()) {
      batch = std::move(it->second);
      ready_.erase(it);
    }
    // Batches before this one will not be asked for again.
    ready_.erase(ready_.begin(), ready_.lower_bound(key));
    cursor_ = key;
    lock.unlock();
    cv_.notify_all();
    if (batch) return std::move(*batch);
    return inner_->Sample(step, dp_rank, micro_batch);
  }
  int64_t vocab() const override { return inner_->vocab(); }
  const SamplerConfig& config() const override { return inner_->config(); }
  DataPosition PositionAt(int64_t step) const override { return inner_->PositionAt(step); }

 private:
  Key Next(const Key& k) const {
    const auto [step, rank, micro] = k;
    if (micro + 1 < first_ + count_) return {step, rank, micro + 1};
    return {step + 1, rank, first_};
  }

  // The first of the `depth_` keys after the cursor that is neither prepared nor being prepared.
  std::optional<Key> Wanted() const {
    if (!cursor_) return std::nullopt;
    Key k = *cursor_;
    for (int i = 0; i < depth_; ++i) {
      k = Next(k);
      if (ready_.count(k) == 0) return k;
    }
    return std::nullopt;
  }

  void Loop() {
    std::unique_lock<std::mutex> lock(mu_);
    while (true) {
      cv_.wait(lock, [&] { return stop_ || Wanted().has_value(); });
      if (stop_) return;
      const Key key = *Wanted();
      working_ = key;
      lock.unlock();
      absl::StatusOr<Batch> batch =
          inner_->Sample(std::get<0>(key), std::get<1>(key), std::get<2>(key));
      lock.lock();
      working_.reset();
      if (!cursor_ || *cursor_ < key) ready_.emplace(key, std::move(batch));
      cv_.notify_all();
    }
  }

  std::unique_ptr<Sampler> inner_;
  const int first_, count_, depth_;
  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  mutable std::map<Key, absl::StatusOr<Batch>> ready_;
  mutable std::optional<Key> cursor_;   // the last key asked for
  mutable std::optional<Key> working_;  // the key the thread is computing
  bool stop_ = false;
  std::thread thread_;  // last: starts after the members it reads
};

}  // namespace

absl::Status DataError(absl::Status status) {
  if (!status.ok()) status.SetPayload(kDataErrorPayload, absl::Cord("data"));
  return status;
}

bool IsDataError(const absl::Status& status) {
  return status.GetPayload(kDataErrorPayload).has_value();
}

Batch EmptyBatch(const SamplerConfig& c) {
  Batch batch;
  batch.B = c.batch;
  batch.T = c.seq_len;
  batch.inputs.resize(static_cast<size_t>(c.batch) * c.seq_len);
  batch.targets.resize(batch.inputs.size());
  return batch;
}

absl::Status CheckSamplerConfig(const SamplerConfig& c) {
  if (c.batch < 1 || c.seq_len < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("sampler: batch ", c.batch, " and seq_len ", c.seq_len, " must be >= 1"));
  }
  if (c.global_batch < 0 || c.global_batch % c.batch != 0) {
    return absl::InvalidArgumentError(absl::StrCat("sampler: global batch ", c.global_batch,
                                                   " must be a multiple of the batch ", c.batch));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Sampler>> MakeMarkovSampler(std::shared_ptr<const MarkovChain> chain,
                                                           const SamplerConfig& config,
                                                           bool validation) {
  if (auto s = CheckSamplerConfig(config); !s.ok()) return s;
  if (chain == nullptr) return absl::InvalidArgumentError("sampler: no Markov chain");
  return std::make_unique<MarkovSampler>(std::move(chain), config, validation);
}

absl::StatusOr<std::unique_ptr<Sampler>> MakeMarkovSampler(MarkovChain chain,
                                                           const SamplerConfig& config,
                                                           bool validation) {
  return MakeMarkovSampler(std::make_shared<const MarkovChain>(std::move(chain)), config,
                           validation);
}

std::unique_ptr<Sampler> MakePrefetchingSampler(std::unique_ptr<Sampler> inner, int first_micro,
                                                int micro_count, int depth) {
  return std::make_unique<PrefetchingSampler>(std::move(inner), first_micro,
                                              std::max(micro_count, 1), std::max(depth, 1));
}

bool SameDataOrder(const std::string& recorded, const std::string& now) {
  if (recorded == now) return true;
  constexpr absl::string_view kV1 = "markov v1: ", kV2 = "markov v2: ";
  if (!absl::StartsWith(recorded, kV1) || !absl::StartsWith(now, kV2)) return false;
  // v2 (MarkovSampler): "..., seq_len T, batch B, global batch G, train|validation".
  const size_t batch = now.find(", batch ");
  const size_t end = now.rfind(", ");
  if (batch == std::string::npos || end == std::string::npos || end <= batch) return false;
  return recorded == absl::StrCat(kV1, now.substr(kV2.size(), batch - kV2.size()), now.substr(end));
}

std::string DataOrderDifference(const std::string& recorded, const std::string& now) {
  if (recorded == now) return "";
  // Words: what lies between spaces, commas, semicolons and brackets (a hash, a size, a setting).
  const auto words = [](const std::string& s) {
    std::vector<std::string> out = absl::StrSplit(s, absl::ByAnyChar(" ,;[]"), absl::SkipEmpty());
    return out;
  };
  const std::vector<std::string> a = words(recorded), b = words(now);
  if (a.size() == b.size()) {
    // The same shape: each word that changed, after the word before it (its name: "fraction",
    // "hash", "windows").
    std::vector<std::string> changes;
    for (size_t i = 0; i < a.size(); ++i) {
      if (a[i] == b[i]) continue;
      changes.push_back(absl::StrCat(i > 0 ? a[i - 1] + " " : "", a[i], " -> ", b[i]));
    }
    if (!changes.empty()) return absl::StrJoin(changes, ", ");
  }
  // Another shape (a dataset more or less): the differing span of each, in whole words.
  const auto is_break = [](char c) {
    return c == ' ' || c == ',' || c == ';' || c == '[' || c == ']';
  };
  size_t prefix = 0;
  while (prefix < recorded.size() && prefix < now.size() && recorded[prefix] == now[prefix]) {
    ++prefix;
  }
  while (prefix > 0 && !is_break(recorded[prefix - 1])) --prefix;
  size_t suffix = 0;
  while (suffix < recorded.size() - prefix && suffix < now.size() - prefix &&
         recorded[recorded.size() - 1 - suffix] == now[now.size() - 1 - suffix]) {
    ++suffix;
  }
  while (suffix > 0 && !is_break(recorded[recorded.size() - suffix])) --suffix;
  const auto span = [&](const std::string& s) {
    std::string out = s.substr(prefix, s.size() - prefix - suffix);
    return out.empty() ? std::string("(nothing)") : out;
  };
  return absl::StrCat("'", span(recorded), "' -> '", span(now), "'");
}

}  // namespace furnace::data
