// The key-value cache forward (runtime/model/kv_decoder.h) against the training model's full
// forward (GptMoe, kernels and all) on the same weights: token by token through the cache, the
// logits of every position equal those of one forward of the whole sequence; and the sampling
// loop (generate.h): greedy, seeded, top-k, and the context window past seq_len.
#include "runtime/model/kv_decoder.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "model_test_util.h"
#include "nlohmann/json.hpp"
#include "runtime/device/device.h"
#include "runtime/model/generate.h"
#include "runtime/model/gpt_moe.h"
#include "runtime/tensor/arena.h"
#include "safetensors.h"

namespace furnace::model {
namespace {

// Three layers (dense, MoE, dense), T = 16, top-2 of 4 experts.
ModelConfig Config() {
  ModelConfig c = testing::TinyConfig();
  c.seq_len = 16;
  c.layers = 3;
  return c;
}

// A GptMoe whose parameters are its seeded init plus noise (so biases and norms are not 0 / 1 and
// every path of the forward matters), with its weights by name.
struct Reference {
  std::unique_ptr<device::Device> cpu = device::CreateCpuDevice();
  tensor::DeviceArena arena{*cpu, 0};
  std::unique_ptr<GptMoe> model;
  Weights weights;
};

std::unique_ptr<Reference> MakeReference(const ModelConfig& config, uint32_t seed) {
  auto r = std::make_unique<Reference>();
  r->model = *GptMoe::Create(config, seed, *r->cpu, r->arena);
  std::mt19937 rng(seed);
  std::normal_distribution<float> noise(0.0f, 0.05f);
  float* p = r->model->param_data();
  for (int64_t i = 0; i < r->model->num_params(); ++i) p[i] += noise(rng);
  for (const train::ParamInfo& info : r->model->params()) {
    r->weights[info.name] = {info.shape,
                             std::vector<float>(p + info.offset, p + info.offset + info.numel())};
  }
  return r;
}

// The full forward's logits (T, V) of one sequence.
std::vector<float> FullLogits(GptMoe& model, const std::vector<int32_t>& tokens) {
  model.set_capture_logits(true);
  const absl::StatusOr<train::MicroBatchResult> r =
      model.Evaluate(tokens.data(), tokens.data(), 1);  // targets do not matter here
  EXPECT_TRUE(r.ok()) << r.status();
  return model.last_logits();
}

double MaxAbs(const std::vector<float>& v) {
  double m = 0;
  for (float x : v) m = std::max(m, static_cast<double>(std::fabs(x)));
  return m;
}

TEST(KvDecoderTest, TokenByTokenEqualsTheFullForward) {
  const ModelConfig config = Config();
  for (uint32_t seed : {1u, 2u, 3u}) {
    std::unique_ptr<Reference> ref = MakeReference(config, seed);
    const std::vector<int32_t> tokens = testing::RandomTokens(config.seq_len, config.vocab, seed);
    const std::vector<float> full = FullLogits(*ref->model, tokens);
    ASSERT_EQ(full.size(), static_cast<size_t>(config.seq_len) * config.vocab);

    absl::StatusOr<std::unique_ptr<KvDecoder>> decoder = KvDecoder::Create(config, ref->weights);
    ASSERT_TRUE(decoder.ok()) << decoder.status();
    std::vector<float> incremental;
    for (int t = 0; t < config.seq_len; ++t) {
      absl::StatusOr<std::vector<float>> row = (*decoder)->Append({tokens[t]});
      ASSERT_TRUE(row.ok()) << row.status();
      ASSERT_EQ(row->size(), static_cast<size_t>(config.vocab));
      EXPECT_EQ((*decoder)->length(), t + 1);
      incremental.insert(incremental.end(), row->begin(), row->end());
    }
    // fp32 round-off of two implementations (BLAS sums vs double-accumulated loops).
    const double tol = 2e-5 * std::max(1.0, MaxAbs(full));
    double worst = 0;
    for (size_t i = 0; i < full.size(); ++i) {
      worst = std::max(worst, std::fabs(static_cast<double>(full[i]) - incremental[i]));
    }
    EXPECT_LE(worst, tol) << "seed " << seed;
    std::printf(
        "REPORT kv cache vs full forward, seed %u: max |logit diff| %.2e (max |logit| %.2f)\n",
        seed, worst, MaxAbs(full));

    // The whole sequence in one Append (the prompt's prefill) gives the same rows.
    (*decoder)->Reset();
    absl::StatusOr<std::vector<float>> prefill = (*decoder)->Append(tokens);
    ASSERT_TRUE(prefill.ok()) << prefill.status();
    for (size_t i = 0; i < full.size(); ++i) {
      ASSERT_NEAR((*prefill)[i], incremental[i], 1e-6 * std::max(1.0, MaxAbs(full))) << i;
    }
  }
}

TEST(KvDecoderTest, RefusesBadTokensAndTooLongContexts) {
  const ModelConfig config = Config();
  std::unique_ptr<Reference> ref = MakeReference(config, 4);
  std::unique_ptr<KvDecoder> decoder = *KvDecoder::Create(config, ref->weights);
  absl::StatusOr<std::vector<float>> bad = decoder->Append({config.vocab});
  EXPECT_TRUE(absl::IsInvalidArgument(bad.status())) << bad.status();
  EXPECT_NE(bad.status().message().find("vocabulary [0, 32)"), std::string::npos);
  std::vector<int32_t> all(config.seq_len, 1);
  ASSERT_TRUE(decoder->Append(all).ok());
  absl::StatusOr<std::vector<float>> past = decoder->Append({1});
  EXPECT_TRUE(absl::IsOutOfRange(past.status())) << past.status();
}

TEST(KvDecoderTest, RefusesWeightsOfAnotherModel) {
  const ModelConfig config = Config();
  std::unique_ptr<Reference> ref = MakeReference(config, 5);
  Weights missing = ref->weights;
  missing.erase("layers.1.moe.experts.2.w1");
  absl::StatusOr<std::unique_ptr<KvDecoder>> a = KvDecoder::Create(config, missing);
  EXPECT_TRUE(absl::IsInvalidArgument(a.status()));
  EXPECT_NE(a.status().message().find("layers.1.moe.experts.2.w1 [16, 24] is missing"),
            std::string::npos)
      << a.status();
  Weights reshaped = ref->weights;
  reshaped["wpe"].shape = {8, 32};
  absl::StatusOr<std::unique_ptr<KvDecoder>> b = KvDecoder::Create(config, reshaped);
  EXPECT_NE(b.status().message().find("wpe has shape [8, 32], the model's is [16, 16]"),
            std::string::npos)
      << b.status();
  Weights extra = ref->weights;
  extra["layers.9.mlp.w1"] = {{1}, {0.0f}};
  absl::StatusOr<std::unique_ptr<KvDecoder>> c = KvDecoder::Create(config, extra);
  EXPECT_NE(c.status().message().find("layers.9.mlp.w1 is not a parameter"), std::string::npos)
      << c.status();
}

TEST(GenerateTest, GreedyFollowsTheLargestLogitAndSeedsRepeat) {
  const ModelConfig config = Config();
  std::unique_ptr<Reference> ref = MakeReference(config, 6);
  std::unique_ptr<KvDecoder> decoder = *KvDecoder::Create(config, ref->weights);
  const std::vector<int32_t> prompt = {3, 1, 4};
  SamplingOptions greedy;
  greedy.temperature = 0;
  greedy.max_new_tokens = 10;
  Generation g = *Generate(*decoder, prompt, greedy);
  ASSERT_EQ(g.tokens.size(), 10u);
  // Each greedy token is the argmax of the full forward of everything before it.
  std::vector<int32_t> seq = prompt;
  for (int32_t token : g.tokens) {
    std::unique_ptr<KvDecoder> fresh = *KvDecoder::Create(config, ref->weights);
    const std::vector<float> logits = *fresh->Append(seq);
    const auto last = logits.end() - config.vocab;
    EXPECT_EQ(token, std::max_element(last, logits.end()) - last);
    seq.push_back(token);
  }
  // top_k 1 is greedy too, whatever the temperature.
  SamplingOptions top1;
  top1.top_k = 1;
  top1.temperature = 5;
  top1.max_new_tokens = 10;
  EXPECT_EQ(Generate(*decoder, prompt, top1)->tokens, g.tokens);

  SamplingOptions sampled;
  sampled.temperature = 1.5;
  sampled.max_new_tokens = 12;
  sampled.seed = 11;
  const std::vector<int32_t> a = Generate(*decoder, prompt, sampled)->tokens;
  EXPECT_EQ(Generate(*decoder, prompt, sampled)->tokens, a);  // a fixed seed repeats
  sampled.seed = 12;
  EXPECT_NE(Generate(*decoder, prompt, sampled)->tokens, a);
}

TEST(GenerateTest, TopKDrawsOnlyAmongTheLargest) {
  const std::vector<float> logits = {0.5f, 2.0f, -1.0f, 2.0f, 1.0f};
  SamplingOptions o;
  o.temperature = 1.0;
  o.top_k = 2;
  std::vector<int> seen(logits.size(), 0);
  for (int i = 0; i < 2000; ++i) ++seen[SampleToken(logits, o, i)];
  EXPECT_EQ(seen[0] + seen[2] + seen[4], 0);
  EXPECT_GT(seen[1], 800);  // the two tied largest, about half each
  EXPECT_GT(seen[3], 800);
  o.temperature = 0;
  EXPECT_EQ(SampleToken(logits, o, 0), 1);  // greedy: ties to the lower id
  o.temperature = -1;
  EXPECT_TRUE(absl::IsInvalidArgument(ValidateSampling(o)));
}

// A tokenizer with fewer ids than the model: the ids it has no text for are never drawn.
TEST(GenerateTest, OnlyIdsBelowTheSampleVocabAreDrawn) {
  const std::vector<float> logits = {0.5f, 1.0f, -1.0f, 9.0f, 8.0f};
  SamplingOptions o;
  o.sample_vocab = 3;
  o.temperature = 0;
  EXPECT_EQ(SampleToken(logits, o, 0), 1);  // greedy among 0..2, not id 3
  o.temperature = 1.0;
  std::vector<int> seen(logits.size(), 0);
  for (int i = 0; i < 500; ++i) ++seen[SampleToken(logits, o, i)];
  EXPECT_EQ(seen[3] + seen[4], 0);
  EXPECT_GT(seen[1], 0);
}

TEST(GenerateTest, PastTheWindowTheContextIsReencoded) {
  ModelConfig config = Config();
  config.seq_len = 8;
  std::unique_ptr<Reference> ref = MakeReference(config, 7);
  std::unique_ptr<KvDecoder> decoder = *KvDecoder::Create(config, ref->weights);
  // A prompt longer than the window keeps its last seq_len tokens.
  const std::vector<int32_t> prompt = testing::RandomTokens(11, config.vocab, 8);
  SamplingOptions greedy;
  greedy.temperature = 0;
  greedy.max_new_tokens = 20;
  const Generation g = *Generate(*decoder, prompt, greedy);
  EXPECT_EQ(g.prompt_dropped, 3);
  EXPECT_GT(g.context_resets, 0);
  // The same by brute force: the window starts at the prompt's last 8 tokens; when full it
  // restarts from its last 4; each token is the argmax of a fresh forward of the window.
  std::vector<int32_t> window(prompt.end() - 8, prompt.end());
  int resets = 0;
  for (size_t i = 0; i < g.tokens.size(); ++i) {
    std::unique_ptr<KvDecoder> fresh = *KvDecoder::Create(config, ref->weights);
    const std::vector<float> logits = *fresh->Append(window);
    const auto last = logits.end() - config.vocab;
    ASSERT_EQ(g.tokens[i], std::max_element(last, logits.end()) - last) << "token " << i;
    window.push_back(g.tokens[i]);
    if (i + 1 < g.tokens.size() && static_cast<int>(window.size()) > config.seq_len) {
      window.erase(window.begin(), window.end() - config.seq_len / 2);
      ++resets;
    }
  }
  EXPECT_EQ(g.context_resets, resets);
}

// tests/reference/golden_sample.safetensors (make_sample_golden.py): a model, a prompt and the
// greedy continuation PyTorch's reference computed by re-running the whole sequence for every
// token, no cache. The cache must give the same tokens, and logits equal to fp32 round-off.
TEST(GenerateTest, GreedyEqualsThePyTorchReference) {
  absl::StatusOr<furnace::testing::SafetensorsFile> file = furnace::testing::SafetensorsFile::Open(
      std::string(FURNACE_REFERENCE_DIR) + "/golden_sample.safetensors");
  ASSERT_TRUE(file.ok()) << file.status();
  const nlohmann::json m = nlohmann::json::parse(*file->Meta("furnace.model"));
  const nlohmann::json moe = nlohmann::json::parse(*file->Meta("furnace.moe"));
  ModelConfig config;
  config.vocab = m["vocab"];
  config.seq_len = m["seq_len"];
  config.d_model = m["d_model"];
  config.heads = m["heads"];
  config.layers = m["layers"];
  config.dense_ffn = m["dense_ffn"];
  config.moe_every = m["moe_every"];
  config.expert_ffn = m["expert_ffn"];
  config.experts = moe["experts"];
  config.top_k = moe["top_k"];
  config.normalize_topk = moe["normalize_topk"];
  Weights weights;
  for (const auto& [name, shape] : ParameterShapes(config)) {
    WeightTensor& t = weights[name];
    absl::StatusOr<std::vector<float>> data = file->F32(name, &t.shape);
    ASSERT_TRUE(data.ok()) << name << ": " << data.status();
    t.data = std::move(*data);
  }
  const auto ids = [&](const std::string& name) {
    const std::vector<float> values = file->F32(name).value_or(std::vector<float>{});
    EXPECT_FALSE(values.empty()) << name;
    return std::vector<int32_t>(values.begin(), values.end());
  };
  const std::vector<int32_t> prompt = ids("prompt"), want = ids("greedy");
  std::unique_ptr<KvDecoder> decoder = *KvDecoder::Create(config, weights);
  SamplingOptions greedy;
  greedy.temperature = 0;
  greedy.max_new_tokens = static_cast<int>(want.size());
  absl::StatusOr<Generation> g = Generate(*decoder, prompt, greedy);
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(g->tokens, want);

  // The logits of prompt + continuation, token by token through the cache.
  std::vector<int32_t> seq = prompt;
  seq.insert(seq.end(), want.begin(), want.end());
  const std::vector<float> golden = *file->F32("logits");
  decoder->Reset();
  double worst = 0;
  for (size_t t = 0; t < seq.size(); ++t) {
    const std::vector<float> row = *decoder->Append({seq[t]});
    for (int v = 0; v < config.vocab; ++v) {
      worst =
          std::max(worst, std::fabs(static_cast<double>(row[v]) - golden[t * config.vocab + v]));
    }
  }
  EXPECT_LE(worst, 1e-4 * std::max(1.0, MaxAbs(golden)));
  std::printf("REPORT kv cache vs PyTorch float64 reference: max |logit diff| %.2e\n", worst);
}

}  // namespace
}  // namespace furnace::model
