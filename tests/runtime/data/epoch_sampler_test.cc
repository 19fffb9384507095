// Epochs, blends, the held-out split and prefetching over in-memory token streams.
#include "runtime/data/epoch_sampler.h"

#include <algorithm>
#include <atomic>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace furnace::data {
namespace {

// Token i of stream `tag` is tag * 100000 + i: a window's first token says where it came from.
// The token at `bad_at` (when >= 0) is -1, outside any vocab.
class FakeStream : public TokenStream {
 public:
  FakeStream(int64_t size, int tag, int64_t bad_at = -1)
      : size_(size), tag_(tag), bad_at_(bad_at), path_("fake" + std::to_string(tag)) {}
  const std::string& path() const override { return path_; }
  int64_t size() const override { return size_; }
  int64_t vocab() const override { return 1 << 30; }

 protected:
  absl::Status ReadStored(int64_t begin, int64_t n, int64_t* out) const override {
    reads += n;
    for (int64_t i = 0; i < n; ++i) out[i] = begin + i == bad_at_ ? -1 : tag_ * 100000 + begin + i;
    return absl::OkStatus();
  }
  absl::Status BadToken(int64_t position, int64_t value) const override {
    return absl::InvalidArgumentError(
        absl::StrCat(path_, ": token ", position, " has value ", value));
  }

 private:
  int64_t size_;
  int tag_;
  int64_t bad_at_;
  std::string path_;

 public:
  mutable std::atomic<int64_t> reads{0};  // tokens read so far
};

std::shared_ptr<const TokenStream> Stream(int64_t size, int tag = 0) {
  return std::make_shared<FakeStream>(size, tag);
}

// The first token of each sequence of micro-batches 0 .. G/B - 1 of `step`.
std::vector<int32_t> StepStarts(const Sampler& s, int64_t step) {
  const SamplerConfig& c = s.config();
  std::vector<int32_t> starts;
  for (int g = 0; g < c.global_batch / c.batch; ++g) {
    const Batch b = s.Sample(step, 0, g).value();
    for (int i = 0; i < b.B; ++i) starts.push_back(b.inputs[i * b.T]);
  }
  return starts;
}

TEST(FeistelPermutationTest, IsABijectionForEverySize) {
  for (uint64_t n : {1u, 2u, 3u, 5u, 16u, 17u, 1000u, 4097u}) {
    const FeistelPermutation p(n, 42 + n);
    std::set<uint64_t> seen;
    for (uint64_t i = 0; i < n; ++i) seen.insert(p.At(i));
    EXPECT_EQ(seen.size(), n);
    EXPECT_LT(*seen.rbegin(), n);
  }
  const FeistelPermutation a(1000, 1), b(1000, 2);
  int same = 0;
  for (uint64_t i = 0; i < 1000; ++i) same += a.At(i) == b.At(i) ? 1 : 0;
  EXPECT_LT(same, 20);  // another key, another order
}

TEST(EpochSamplerTest, EveryWindowOncePerEpochInANewOrderEachEpoch) {
  const int T = 4;
  const int64_t windows = 60;  // a stream of 241 tokens
  auto made = MakeEpochSampler({{Stream(windows * T + 1)}},
                               {.batch = 3, .seq_len = T, .seed = 9, .global_batch = 12}, {});
  ASSERT_TRUE(made.ok()) << made.status();
  const Sampler& s = **made;
  // 5 steps of 12 sequences are exactly one epoch.
  std::vector<int32_t> epoch0, epoch1;
  for (int step = 0; step < 5; ++step) {
    for (int32_t t : StepStarts(s, step)) epoch0.push_back(t);
    for (int32_t t : StepStarts(s, step + 5)) epoch1.push_back(t);
  }
  std::set<int32_t> all0(epoch0.begin(), epoch0.end()), all1(epoch1.begin(), epoch1.end());
  EXPECT_EQ(all0.size(), 60u);
  EXPECT_EQ(all0, all1);
  for (int32_t t : all0) EXPECT_EQ(t % T, 0);
  EXPECT_NE(epoch0, epoch1);
  const DataPosition p = s.PositionAt(7);
  EXPECT_EQ(p.sequences, 84);
  EXPECT_EQ(p.epoch, 1);
  EXPECT_EQ(p.index_in_epoch, 24);
  EXPECT_EQ(p.epoch_sequences, 60);
}

TEST(EpochSamplerTest, TheGlobalBatchDoesNotDependOnHowItIsSplit) {
  // One process with 4 micro-batches of 2, or dp 2 x 2 micro-batches of 2, or 1 of 8: the step's
  // sequences, in global order, are the same.
  auto a = MakeEpochSampler({{Stream(1000)}},
                            {.batch = 2, .seq_len = 5, .seed = 3, .global_batch = 8}, {});
  auto b = MakeEpochSampler({{Stream(1000)}},
                            {.batch = 8, .seq_len = 5, .seed = 3, .global_batch = 8}, {});
  ASSERT_TRUE(a.ok() && b.ok());
  for (int step : {0, 1, 30}) EXPECT_EQ(StepStarts(**a, step), StepStarts(**b, step));
}

// A training sampler's step holds global_batch / B micro-batches: one past them (global_batch left
// at 0 with several micro-batches) would read the next step's sequences, and is refused. A
// held-out sampler reads in order, its micro-batch the eval batch, and has no such bound.
TEST(EpochSamplerTest, AMicroBatchPastTheStepsGlobalBatchIsRefused) {
  auto unset = MakeEpochSampler({{Stream(1000)}}, {.batch = 2, .seq_len = 5, .seed = 3}, {});
  ASSERT_TRUE(unset.ok()) << unset.status();
  EXPECT_TRUE((*unset)->Sample(0, 0, 0).ok());
  const absl::Status past = (*unset)->Sample(0, 0, 1).status();
  EXPECT_EQ(past.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(past.message()), ::testing::HasSubstr("global_batch"));
  auto set = MakeEpochSampler({{Stream(1000)}},
                              {.batch = 2, .seq_len = 5, .seed = 3, .global_batch = 4}, {});
  ASSERT_TRUE(set.ok()) << set.status();
  EXPECT_TRUE((*set)->Sample(0, 0, 1).ok());
  EXPECT_FALSE((*set)->Sample(0, 0, 2).ok());
}

TEST(EpochSamplerTest, BlendFollowsTheWeightsAndEachDatasetHasItsOwnEpochs) {
  auto made = MakeEpochSampler({{Stream(4001, 1), 0.75}, {Stream(2001, 2), 0.25}},
                               {.batch = 4, .seq_len = 10, .seed = 1, .global_batch = 16}, {});
  ASSERT_TRUE(made.ok()) << made.status();
  std::map<int, int64_t> per_dataset;
  std::map<int, std::map<int32_t, int>> seen;
  for (int step = 0; step < 512; ++step) {  // 8192 positions: two periods of 4096
    for (int32_t t : StepStarts(**made, step)) {
      ++per_dataset[t / 100000];
      ++seen[t / 100000][t];
    }
  }
  EXPECT_EQ(per_dataset[1], 6144);
  EXPECT_EQ(per_dataset[2], 2048);
  // Dataset 2 has 200 windows: 2048 draws are 10 whole epochs and 48 of the 11th.
  ASSERT_EQ(seen[2].size(), 200u);
  int at_eleven = 0;
  for (const auto& [t, n] : seen[2]) {
    EXPECT_TRUE(n == 10 || n == 11) << t << " seen " << n;
    at_eleven += n == 11;
  }
  EXPECT_EQ(at_eleven, 48);
  // Each dataset's own place, as counted above: after 512 steps dataset 1 (400 windows) drew
  // 6144 = 15 epochs and 144, dataset 2 10 epochs and 48.
  const DataPosition at = (*made)->PositionAt(512);
  ASSERT_EQ(at.datasets.size(), 2u);
  EXPECT_EQ(at.datasets[0].path, "fake1");
  EXPECT_EQ(at.datasets[0].epoch_sequences, 400);
  EXPECT_EQ(at.datasets[0].epoch, 15);
  EXPECT_EQ(at.datasets[0].index_in_epoch, 144);
  EXPECT_EQ(at.datasets[1].path, "fake2");
  EXPECT_EQ(at.datasets[1].epoch_sequences, 200);
  EXPECT_EQ(at.datasets[1].epoch, 10);
  EXPECT_EQ(at.datasets[1].index_in_epoch, 48);
  EXPECT_EQ(at.epoch, at.datasets[0].epoch);  // the first dataset's, as before
  // A weight below 1/4096 of the blend is refused, naming the dataset.
  auto tiny = MakeEpochSampler({{Stream(4001, 1), 1.0}, {Stream(2001, 2), 1e-5}},
                               {.batch = 4, .seq_len = 10, .seed = 1}, {});
  ASSERT_FALSE(tiny.ok());
  EXPECT_THAT(std::string(tiny.status().message()), ::testing::HasSubstr("fake2"));
}

// Only the weights' ratios matter, at any scale the spec accepts (finite and positive): 3e306
// to 1e306 is the blend of 0.75 to 0.25 (4096 * 3e306 overflowed to infinity before, and its
// floor cast to an integer); weights whose sum overflows are refused, not undefined.
TEST(EpochSamplerTest, BlendWeightsNearTheLargestDoubleKeepTheirRatio) {
  const SamplerConfig config{.batch = 4, .seq_len = 10, .seed = 1, .global_batch = 16};
  auto small = MakeEpochSampler({{Stream(4001, 1), 0.75}, {Stream(2001, 2), 0.25}}, config, {});
  auto huge = MakeEpochSampler({{Stream(4001, 1), 3e306}, {Stream(2001, 2), 1e306}}, config, {});
  ASSERT_TRUE(small.ok()) << small.status();
  ASSERT_TRUE(huge.ok()) << huge.status();
  for (int step = 0; step < 64; ++step) {
    EXPECT_EQ(StepStarts(**huge, step), StepStarts(**small, step)) << "step " << step;
  }
  auto overflow =
      MakeEpochSampler({{Stream(4001, 1), 1.5e308}, {Stream(2001, 2), 1.5e308}}, config, {});
  ASSERT_FALSE(overflow.ok());
  EXPECT_THAT(std::string(overflow.status().message()), ::testing::HasSubstr("sum to inf"));
}

TEST(EpochSamplerTest, HeldOutWindowsAreNeverTrainedOn) {
  const int T = 8;
  const SamplerConfig c{.batch = 5, .seq_len = T, .seed = 4, .global_batch = 10};
  EpochSamplerOptions train{.part = SplitPart::kTrain, .validation_fraction = 0.1};
  EpochSamplerOptions held{
      .part = SplitPart::kValidation, .validation_fraction = 0.1, .shuffle = false};
  auto tr = MakeEpochSampler({{Stream(100 * T + 1)}}, c, train);
  auto va = MakeEpochSampler({{Stream(100 * T + 1)}}, c, held);
  ASSERT_TRUE(tr.ok() && va.ok());
  EXPECT_EQ((*tr)->PositionAt(0).epoch_sequences, 89);  // 100 - 10 held out - 1 dropped
  std::set<int32_t> trained;  // every token a training sequence reads, targets included
  for (int step = 0; step < 9; ++step) {
    for (int g = 0; g < 2; ++g) {
      const Batch b = (*tr)->Sample(step, 0, g).value();
      trained.insert(b.inputs.begin(), b.inputs.end());
      trained.insert(b.targets.begin(), b.targets.end());
    }
  }
  // Validation: windows 90..99 in order, wrapping; eval batch i is the same at every call.
  std::vector<int32_t> starts = StepStarts(**va, 0);
  EXPECT_EQ(starts, (std::vector<int32_t>{720, 728, 736, 744, 752, 760, 768, 776, 784, 792}));
  EXPECT_EQ(StepStarts(**va, 1), starts);
  for (int g = 0; g < 2; ++g) {
    const Batch b = (*va)->Sample(0, 0, g).value();
    for (int32_t t : b.inputs) EXPECT_EQ(trained.count(t), 0u) << t;
    for (int32_t t : b.targets) EXPECT_EQ(trained.count(t), 0u) << t;
  }
}

TEST(EpochSamplerTest, TooShortDataIsRefusedNamingTheFile) {
  auto made = MakeEpochSampler({{Stream(20, 3)}}, {.batch = 1, .seq_len = 32}, {});
  ASSERT_FALSE(made.ok());
  EXPECT_THAT(std::string(made.status().message()), ::testing::HasSubstr("fake3: 20 tokens"));
}

// Records which threads ask the inner sampler for which batches.
class RecordingSampler : public Sampler {
 public:
  explicit RecordingSampler(std::unique_ptr<Sampler> inner) : inner_(std::move(inner)) {}
  absl::StatusOr<Batch> Sample(int64_t step, int dp_rank, int micro_batch) const override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (std::this_thread::get_id() != owner_) background_.insert({step, micro_batch});
    }
    return inner_->Sample(step, dp_rank, micro_batch);
  }
  int64_t vocab() const override { return inner_->vocab(); }
  const SamplerConfig& config() const override { return inner_->config(); }
  DataPosition PositionAt(int64_t step) const override { return inner_->PositionAt(step); }
  bool DoneInBackground(int64_t step, int micro) const {
    std::lock_guard<std::mutex> lock(mu_);
    return background_.count({step, micro}) > 0;
  }

 private:
  std::unique_ptr<Sampler> inner_;
  std::thread::id owner_ = std::this_thread::get_id();
  mutable std::mutex mu_;
  mutable std::set<std::pair<int64_t, int>> background_;
};

TEST(PrefetchingSamplerTest, PreparesTheNextMicroBatchesOnItsThread) {
  const SamplerConfig c{.batch = 2, .seq_len = 6, .seed = 8, .global_batch = 8};
  auto inner = MakeEpochSampler({{Stream(5000)}}, c, {});
  ASSERT_TRUE(inner.ok());
  auto recording = std::make_unique<RecordingSampler>(std::move(*inner));
  const RecordingSampler* rec = recording.get();
  auto prefetching = MakePrefetchingSampler(std::move(recording), 2, 2, /*depth=*/3);
  ASSERT_TRUE(prefetching->Sample(0, 0, 2).ok());
  // The next three of this rank's micro-batches: (0, 3), (1, 2), (1, 3). Waits for the thread
  // (no time limit is asserted: the test's own timeout bounds it).
  for (auto [step, micro] : {std::pair{0, 3}, std::pair{1, 2}, std::pair{1, 3}}) {
    while (!rec->DoneInBackground(step, micro)) std::this_thread::yield();
  }
  EXPECT_FALSE(rec->DoneInBackground(2, 2));  // not beyond the depth
}

TEST(PrefetchingSamplerTest, ReturnsExactlyTheInnerBatches) {
  const SamplerConfig c{.batch = 2, .seq_len = 6, .seed = 8, .global_batch = 8};
  auto inner = MakeEpochSampler({{Stream(5000)}}, c, {});
  auto reference = MakeEpochSampler({{Stream(5000)}}, c, {});
  ASSERT_TRUE(inner.ok() && reference.ok());
  // This rank is data-parallel rank 1 of 2 with 2 micro-batches: global micro-batches 2 and 3.
  auto prefetching = MakePrefetchingSampler(std::move(*inner), 2, 2);
  for (int step = 0; step < 20; ++step) {
    for (int g : {2, 3}) {
      EXPECT_EQ(prefetching->Sample(step, 0, g).value().inputs,
                (*reference)->Sample(step, 0, g).value().inputs);
    }
  }
  // Out of order and repeated requests are still exact.
  EXPECT_EQ(prefetching->Sample(3, 0, 0).value().targets,
            (*reference)->Sample(3, 0, 0).value().targets);
  EXPECT_EQ(prefetching->Sample(3, 0, 0).value().targets,
            (*reference)->Sample(3, 0, 0).value().targets);
  EXPECT_EQ(prefetching->PositionAt(9).order, (*reference)->PositionAt(9).order);
}

// A token outside the vocab is found when its window is read: the batch that holds it fails with
// a data error naming the file, the token and the batch; every other batch reads as before, and a
// prefetching sampler hands the error to the caller that asks for that batch.
TEST(EpochSamplerTest, ATokenOutsideTheVocabFailsTheBatchThatReadsIt) {
  const SamplerConfig c{.batch = 2, .seq_len = 4, .seed = 5, .global_batch = 4};
  // 1024 windows of 5 tokens; token 2001 is in window 500 (tokens 2000..2004) only, and not one
  // of the every 4th tokens the fingerprint reads when the sampler is made. One epoch: 256 steps
  // of 4 sequences.
  auto clean = MakeEpochSampler({{Stream(4097)}}, c, {});
  auto damaged =
      MakeEpochSampler({{std::make_shared<FakeStream>(4097, 0, /*bad_at=*/2001)}}, c, {});
  ASSERT_TRUE(clean.ok()) << clean.status();
  ASSERT_TRUE(damaged.ok()) << damaged.status();
  int failed = 0;
  for (int64_t step = 0; step < 256; ++step) {
    for (int g = 0; g < 2; ++g) {
      const absl::StatusOr<Batch> got = (*damaged)->Sample(step, 0, g);
      const absl::StatusOr<Batch> want = (*clean)->Sample(step, 0, g);
      ASSERT_TRUE(want.ok());
      const bool holds_window_500 =
          std::find(want->inputs.begin(), want->inputs.end(), 2000) != want->inputs.end();
      if (!holds_window_500) {
        ASSERT_TRUE(got.ok()) << got.status();
        EXPECT_EQ(got->inputs, want->inputs);
        continue;
      }
      ++failed;
      ASSERT_FALSE(got.ok());
      EXPECT_TRUE(IsDataError(got.status()));
      EXPECT_THAT(std::string(got.status().message()),
                  ::testing::AllOf(::testing::HasSubstr("fake0: token 2001 has value -1"),
                                   ::testing::HasSubstr("window 500 of 5 tokens"),
                                   ::testing::HasSubstr(absl::StrCat("read for step ", step + 1,
                                                                     ", micro-batch ", g))));
      auto prefetching = MakePrefetchingSampler(
          std::move(*MakeEpochSampler({{std::make_shared<FakeStream>(4097, 0, 2001)}}, c, {})), 0,
          2);
      const absl::StatusOr<Batch> prefetched = prefetching->Sample(step, 0, g);
      EXPECT_EQ(prefetched.status(), got.status());
      EXPECT_TRUE(IsDataError(prefetched.status()));
    }
  }
  EXPECT_EQ(failed, 1);  // window 500 is read once an epoch
  // At 1024 samples of 4097 tokens the fingerprint reads every 4th: a bad token there fails the
  // sampler's making, before any step.
  auto refused = MakeEpochSampler({{std::make_shared<FakeStream>(4097, 0, 2000)}}, c, {});
  ASSERT_FALSE(refused.ok());
  EXPECT_THAT(std::string(refused.status().message()),
              ::testing::HasSubstr("fake0: token 2000 has value -1"));
  // An error that is not the data's carries no mark.
  EXPECT_FALSE(IsDataError(absl::InternalError("x")));
  EXPECT_TRUE(IsDataError(DataError(absl::InternalError("x"))));
  EXPECT_TRUE(DataError(absl::OkStatus()).ok());
}

// A dataset's fingerprint (its 1,024 scattered reads, what a cold start-up waits for) is read once,
// however many samplers over it are made: the training part and the held-out part here.
TEST(EpochSamplerTest, ADatasetsFingerprintIsReadOnce) {
  const SamplerConfig c{.batch = 2, .seq_len = 4, .seed = 5, .global_batch = 4};
  const auto stream = std::make_shared<FakeStream>(8193, 0);
  EpochSamplerOptions train{.part = SplitPart::kTrain, .validation_fraction = 0.1};
  EpochSamplerOptions held_out = train;
  held_out.part = SplitPart::kValidation;
  held_out.shuffle = false;
  ASSERT_TRUE(MakeEpochSampler({{stream}}, c, train).ok());
  EXPECT_EQ(stream->reads.load(), TokenStream::kFingerprintTokens);
  ASSERT_TRUE(MakeEpochSampler({{stream}}, c, held_out).ok());
  EXPECT_EQ(stream->reads.load(), TokenStream::kFingerprintTokens);
  // Asking the stream itself again reads nothing either, and gives what a first read of the same
  // content gives (another stream of the same tokens, read afresh), not another content's.
  const absl::StatusOr<std::string> fingerprint = stream->Fingerprint();
  ASSERT_TRUE(fingerprint.ok()) << fingerprint.status();
  EXPECT_EQ(stream->reads.load(), TokenStream::kFingerprintTokens);
  const FakeStream same(8193, 0), other(8193, 1);
  EXPECT_EQ(*fingerprint, same.Fingerprint().value());
  EXPECT_EQ(same.reads.load(), TokenStream::kFingerprintTokens);
  EXPECT_NE(*fingerprint, other.Fingerprint().value());
}

// A refusal names what differs between two orders, in whole words.
TEST(DataOrderDifferenceTest, NamesTheDifferingWords) {
  EXPECT_EQ(DataOrderDifference("a, b 1, c", "a, b 1, c"), "");
  EXPECT_EQ(DataOrderDifference("v1: seq_len 8, [t: 10 tokens, hash 3e2a]; x",
                                "v1: seq_len 8, [t: 10 tokens, hash fb39]; x"),
            "hash 3e2a -> fb39");
  EXPECT_EQ(
      DataOrderDifference("seq_len 8, seed 1, windows 0..44", "seq_len 16, seed 1, windows 0..39"),
      "seq_len 8 -> 16, windows 0..44 -> 0..39");
  EXPECT_EQ(DataOrderDifference("a; [x]", "a; [x]; [y]"), "'(nothing)' -> '; [y]'");
}

}  // namespace
}  // namespace furnace::data
