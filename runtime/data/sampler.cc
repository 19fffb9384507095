#include "runtime/data/sampler.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "runtime/data/counter_rng.h"

namespace furnace::data {
namespace {

// Keys the stream of one sequence; the constant separates the data streams from any other use of
// the same seed.
uint64_t SequenceKey(uint64_t seed, int64_t step, int dp_rank, int micro_batch, int b) {
  return HashKey({seed, 0x44415441ull, static_cast<uint64_t>(step), static_cast<uint64_t>(dp_rank),
                  static_cast<uint64_t>(micro_batch), static_cast<uint64_t>(b)});
}

absl::Status CheckConfig(const SamplerConfig& c) {
  if (c.batch < 1 || c.seq_len < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("sampler: batch ", c.batch, " and seq_len ", c.seq_len, " must be >= 1"));
  }
  return absl::OkStatus();
}

Batch EmptyBatch(const SamplerConfig& c) {
  Batch batch;
  batch.B = c.batch;
  batch.T = c.seq_len;
  batch.inputs.resize(static_cast<size_t>(c.batch) * c.seq_len);
  batch.targets.resize(batch.inputs.size());
  return batch;
}

class TokenFileSampler : public Sampler {
 public:
  TokenFileSampler(std::shared_ptr<const TokenFile> file, SamplerConfig config)
      : file_(std::move(file)), config_(config) {}

  Batch Sample(int64_t step, int dp_rank, int micro_batch) const override {
    Batch batch = EmptyBatch(config_);
    const int T = config_.seq_len;
    const uint64_t offsets = static_cast<uint64_t>(file_->size() - T);  // windows of T + 1
    std::vector<int32_t> window(T + 1);
    for (int b = 0; b < config_.batch; ++b) {
      CounterRng rng(SequenceKey(config_.seed, step, dp_rank, micro_batch, b));
      file_->Read(static_cast<int64_t>(rng.NextBelow(offsets)), T + 1, window.data());
      std::copy(window.begin(), window.end() - 1, batch.inputs.begin() + b * T);
      std::copy(window.begin() + 1, window.end(), batch.targets.begin() + b * T);
    }
    return batch;
  }
  int64_t vocab() const override { return file_->vocab(); }
  const SamplerConfig& config() const override { return config_; }

 private:
  std::shared_ptr<const TokenFile> file_;
  SamplerConfig config_;
};

class MarkovSampler : public Sampler {
 public:
  MarkovSampler(MarkovChain chain, SamplerConfig config)
      : chain_(std::move(chain)), config_(config) {}

  Batch Sample(int64_t step, int dp_rank, int micro_batch) const override {
    Batch batch = EmptyBatch(config_);
    const int T = config_.seq_len;
    for (int b = 0; b < config_.batch; ++b) {
      CounterRng rng(SequenceKey(config_.seed, step, dp_rank, micro_batch, b));
      int32_t* in = batch.inputs.data() + static_cast<size_t>(b) * T;
      int32_t* tg = batch.targets.data() + static_cast<size_t>(b) * T;
      int state = chain_.SampleInitial(rng);
      for (int t = 0; t < T; ++t) {
        in[t] = state;
        state = chain_.SampleNext(state, rng);
        tg[t] = state;
      }
    }
    return batch;
  }
  int64_t vocab() const override { return chain_.vocab(); }
  const SamplerConfig& config() const override { return config_; }

 private:
  MarkovChain chain_;
  SamplerConfig config_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Sampler>> MakeTokenFileSampler(std::shared_ptr<const TokenFile> file,
                                                              const SamplerConfig& config) {
  if (auto s = CheckConfig(config); !s.ok()) return s;
  if (file == nullptr) return absl::InvalidArgumentError("sampler: no token file");
  if (file->size() < static_cast<int64_t>(config.seq_len) + 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("token file ", file->path(), " has ", file->size(), " tokens; seq_len ",
                     config.seq_len, " needs at least ", config.seq_len + 1));
  }
  return std::make_unique<TokenFileSampler>(std::move(file), config);
}

absl::StatusOr<std::unique_ptr<Sampler>> MakeMarkovSampler(MarkovChain chain,
                                                           const SamplerConfig& config) {
  if (auto s = CheckConfig(config); !s.ok()) return s;
  return std::make_unique<MarkovSampler>(std::move(chain), config);
}

}  // namespace furnace::data
