#include <cmath>
#include <memory>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "runtime/data/data_sources.h"
#include "runtime/data/markov.h"
#include "runtime/data/sampler.h"
#include "runtime/data/token_file.h"
#include "tests/testing/test_dir.h"

namespace furnace::data {
namespace {

TEST(MarkovTest, DeterministicCycleHasZeroEntropy) {
  const int V = 5;
  std::vector<double> p(V * V, 0.0);
  for (int i = 0; i < V; ++i) p[i * V + (i + 1) % V] = 1.0;  // periodic: needs the lazy iteration
  auto chain = MarkovChain::FromTransitions(V, p);
  ASSERT_TRUE(chain.ok()) << chain.status();
  EXPECT_EQ(chain->entropy_rate(), 0.0);
  for (double x : chain->stationary()) EXPECT_NEAR(x, 1.0 / V, 1e-13);
}

TEST(MarkovTest, UniformChainHasLogVEntropy) {
  const int V = 7;
  auto chain = MarkovChain::FromTransitions(V, std::vector<double>(V * V, 1.0 / V));
  ASSERT_TRUE(chain.ok());
  EXPECT_NEAR(chain->entropy_rate(), std::log(7.0), 1e-13);
}

TEST(MarkovTest, TwoStateChainMatchesClosedForm) {
  // P = [[1-a, a], [b, 1-b]]: pi = (b, a) / (a + b).
  const double a = 0.3, b = 0.1;
  auto chain = MarkovChain::FromTransitions(2, {1 - a, a, b, 1 - b});
  ASSERT_TRUE(chain.ok());
  const double pi0 = b / (a + b), pi1 = a / (a + b);
  EXPECT_NEAR(chain->stationary()[0], pi0, 1e-12);
  auto h = [](double x) { return -x * std::log(x) - (1 - x) * std::log(1 - x); };
  EXPECT_NEAR(chain->entropy_rate(), pi0 * h(a) + pi1 * h(b), 1e-12);
}

TEST(MarkovTest, RejectsRowsThatDoNotSumToOne) {
  EXPECT_FALSE(MarkovChain::FromTransitions(2, {0.5, 0.4, 0.5, 0.5}).ok());
  EXPECT_FALSE(MarkovChain::FromTransitions(2, {1.5, -0.5, 0.5, 0.5}).ok());
  EXPECT_FALSE(MarkovChain::Create({.vocab = 4, .successors = 5}).ok());
}

TEST(MarkovTest, GeneratedChainIsPeakedAndSeeded) {
  auto a = MarkovChain::Create({.vocab = 16, .successors = 3, .smoothing = 0.05, .seed = 1});
  auto b = MarkovChain::Create({.vocab = 16, .successors = 3, .smoothing = 0.05, .seed = 1});
  auto c = MarkovChain::Create({.vocab = 16, .successors = 3, .smoothing = 0.05, .seed = 2});
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  bool differs = false;
  for (int i = 0; i < 16; ++i) {
    for (int j = 0; j < 16; ++j) {
      EXPECT_EQ(a->transition(i, j), b->transition(i, j));
      differs |= a->transition(i, j) != c->transition(i, j);
    }
  }
  EXPECT_TRUE(differs);
  // Learnable: well below the uniform log(16) = 2.77, well above 0.
  EXPECT_LT(a->entropy_rate(), 0.75 * std::log(16.0));
  EXPECT_GT(a->entropy_rate(), 0.3);
  double sum = 0;
  for (double x : a->stationary()) sum += x;
  EXPECT_NEAR(sum, 1.0, 1e-12);
}

TEST(MarkovTest, SampledTransitionsMatchProbabilities) {
  auto chain = MarkovChain::Create({.vocab = 8, .successors = 2, .smoothing = 0.1, .seed = 3});
  ASSERT_TRUE(chain.ok());
  auto sampler = MakeMarkovSampler(*chain, {.batch = 64, .seq_len = 256, .seed = 9});
  ASSERT_TRUE(sampler.ok());
  std::vector<double> counts(64, 0), from(8, 0);
  std::vector<double> first(8, 0);
  int64_t sequences = 0;
  for (int step = 0; step < 20; ++step) {
    Batch batch = (*sampler)->Sample(step, 0, 0).value();
    for (int b = 0; b < batch.B; ++b) {
      first[batch.inputs[b * batch.T]] += 1;
      ++sequences;
    }
    for (size_t i = 0; i < batch.inputs.size(); ++i) {
      counts[batch.inputs[i] * 8 + batch.targets[i]] += 1;
      from[batch.inputs[i]] += 1;
    }
  }
  // ~330k transitions: each empirical probability within 5 standard errors.
  for (int i = 0; i < 8; ++i) {
    for (int j = 0; j < 8; ++j) {
      const double p = chain->transition(i, j);
      const double se = std::sqrt(p * (1 - p) / from[i]);
      EXPECT_NEAR(counts[i * 8 + j] / from[i], p, 5 * se + 1e-12) << i << "->" << j;
    }
    const double pi = chain->stationary()[i];
    EXPECT_NEAR(first[i] / sequences, pi, 5 * std::sqrt(pi * (1 - pi) / sequences));
  }
}

TEST(SamplerTest, MarkovBatchesAreDeterministicInStepRankMicro) {
  auto chain = MarkovChain::Create({.vocab = 16, .seed = 1});
  ASSERT_TRUE(chain.ok());
  auto s1 = MakeMarkovSampler(*chain, {.batch = 4, .seq_len = 32, .seed = 5});
  auto s2 = MakeMarkovSampler(*chain, {.batch = 4, .seq_len = 32, .seed = 5});
  auto s3 = MakeMarkovSampler(*chain, {.batch = 4, .seq_len = 32, .seed = 6});
  ASSERT_TRUE(s1.ok() && s2.ok() && s3.ok());
  const Batch a = (*s1)->Sample(7, 1, 2).value();
  EXPECT_EQ(a.inputs, (*s2)->Sample(7, 1, 2).value().inputs);
  EXPECT_EQ(a.targets, (*s1)->Sample(7, 1, 2).value().targets);
  EXPECT_NE(a.inputs, (*s1)->Sample(8, 1, 2).value().inputs);
  EXPECT_NE(a.inputs, (*s1)->Sample(7, 0, 2).value().inputs);
  EXPECT_NE(a.inputs, (*s1)->Sample(7, 1, 3).value().inputs);
  EXPECT_NE(a.inputs, (*s3)->Sample(7, 1, 2).value().inputs);
  // Targets are the inputs shifted by one.
  for (int b = 0; b < a.B; ++b) {
    for (int t = 0; t + 1 < a.T; ++t) EXPECT_EQ(a.targets[b * a.T + t], a.inputs[b * a.T + t + 1]);
  }
  // Sequences within a batch differ.
  EXPECT_FALSE(std::equal(a.inputs.begin(), a.inputs.begin() + 32, a.inputs.begin() + 32));
}

TEST(SamplerTest, MarkovValidationIsAnIndependentStream) {
  auto chain = MarkovChain::Create({.vocab = 16, .seed = 1});
  ASSERT_TRUE(chain.ok());
  auto train = MakeMarkovSampler(*chain, {.batch = 4, .seq_len = 32, .seed = 5});
  auto held_out = MakeMarkovSampler(*chain, {.batch = 4, .seq_len = 32, .seed = 5}, true);
  ASSERT_TRUE(train.ok() && held_out.ok());
  EXPECT_NE((*train)->Sample(3, 0, 1).value().inputs, (*held_out)->Sample(3, 0, 1).value().inputs);
  EXPECT_EQ((*held_out)->Sample(3, 0, 1).value().inputs,
            (*held_out)->Sample(3, 0, 1).value().inputs);
  EXPECT_NE((*train)->PositionAt(0).order, (*held_out)->PositionAt(0).order);
  EXPECT_EQ((*train)->PositionAt(5).epoch_sequences, 0);  // endless: no epochs
}

// A step's sequences depend on the micro-batch size and the global batch (they are keyed by
// micro-batch and row), so the order a checkpoint records names both: a resume with another
// parallel.micro_batch or dp x micro_batches is refused, not read from other sequences.
TEST(SamplerTest, MarkovOrderNamesTheBatchShape) {
  auto chain = MarkovChain::Create({.vocab = 16, .seed = 1});
  ASSERT_TRUE(chain.ok());
  const auto order = [&](int batch, int64_t global_batch) {
    auto sampler = MakeMarkovSampler(
        *chain, {.batch = batch, .seq_len = 32, .seed = 5, .global_batch = global_batch});
    EXPECT_TRUE(sampler.ok()) << sampler.status();
    return sampler.ok() ? (*sampler)->PositionAt(10).order : std::string();
  };
  EXPECT_EQ(order(4, 8), order(4, 8));
  EXPECT_NE(order(4, 8), order(8, 8));   // B 4 x 2 against B 8 x 1: other sequences
  EXPECT_NE(order(4, 8), order(4, 16));  // twice the global batch
  EXPECT_THAT(order(4, 8), ::testing::HasSubstr("batch 4, global batch 8"));
}

TEST(SamplerTest, TokenFileWindowsAreDeterministicAndShifted) {
  testing_util::TestDir dir;
  std::vector<int32_t> tokens(5000);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int32_t>(i % 1000);
  ASSERT_TRUE(WriteTokenFile(dir / "t.bin", tokens, 1000).ok());
  DataSourceConfig data;
  data.source = "tokens";
  data.paths = {{dir / "t.bin"}};
  data.model_vocab = 1000;
  auto made = MakeSamplers(data, {.batch = 3, .seq_len = 16, .seed = 1, .global_batch = 6});
  ASSERT_TRUE(made.ok()) << made.status();
  const Sampler& sampler = *made->train;
  EXPECT_EQ(made->validation, nullptr);  // no data.validation
  const Batch a = sampler.Sample(4, 0, 1).value();
  EXPECT_EQ(a.inputs, sampler.Sample(4, 0, 1).value().inputs);
  EXPECT_NE(a.inputs, sampler.Sample(5, 0, 1).value().inputs);
  EXPECT_NE(a.inputs, sampler.Sample(4, 0, 0).value().inputs);
  for (int b = 0; b < 3; ++b) {
    for (int t = 0; t < 16; ++t) {
      EXPECT_EQ(a.targets[b * 16 + t], (a.inputs[b * 16 + t] + 1) % 1000);  // consecutive tokens
    }
  }
  // A file shorter than seq_len + 1 is refused, naming it.
  auto tiny = MakeSamplers(data, {.batch = 1, .seq_len = 5000, .seed = 1});
  ASSERT_FALSE(tiny.ok());
  EXPECT_THAT(std::string(tiny.status().message()), ::testing::HasSubstr(dir / "t.bin"));
}

}  // namespace
}  // namespace furnace::data
