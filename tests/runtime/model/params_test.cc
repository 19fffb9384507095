// Parameter names, shapes and layout; the seeded initialisation; FLOPs per token.
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "model_test_util.h"
#include "runtime/model/gpt_moe.h"
#include "runtime/model/init.h"

namespace furnace::model {
namespace {

using testing::TinyConfig;

class ParamsTest : public ::testing::Test {
 protected:
  std::unique_ptr<GptMoe> Make(const ModelConfig& c, uint64_t seed = 1234) {
    absl::StatusOr<std::unique_ptr<GptMoe>> m = GptMoe::Create(c, seed, *device_, arena_);
    EXPECT_TRUE(m.ok()) << m.status();
    return m.ok() ? std::move(*m) : nullptr;
  }
  std::vector<float> Values(GptMoe& m, const std::string& name) {
    const train::ParamInfo* p = m.FindParam(name);
    EXPECT_NE(p, nullptr) << name;
    if (p == nullptr) return {};
    return std::vector<float>(m.param_data() + p->offset, m.param_data() + p->offset + p->numel());
  }

  std::unique_ptr<device::Device> device_ = device::CreateCpuDevice();
  tensor::DeviceArena arena_{*device_, 0};
};

TEST_F(ParamsTest, NamesShapesOffsetsAndCount) {
  std::unique_ptr<GptMoe> m = Make(TinyConfig());
  ASSERT_NE(m, nullptr);
  std::vector<std::string> names;
  int64_t expect_offset = 0;
  for (const train::ParamInfo& p : m->params()) {
    names.push_back(p.name);
    EXPECT_EQ(p.offset, expect_offset) << p.name;
    expect_offset += p.numel();
    EXPECT_EQ(p.weight_decay, p.shape.size() == 2) << p.name;
  }
  EXPECT_EQ(expect_offset, m->num_params());
  // V=32, T=8, d=16: wte 512, wpe 128; dense layer 0: 1152 + 2128; MoE layer 1: 1152 + router 64
  // + 4 experts x 808; lnf 32.
  EXPECT_EQ(m->num_params(), 8400);

  const std::vector<std::string> expected = {"wte",
                                             "wpe",
                                             "layers.0.ln1.weight",
                                             "layers.0.ln1.bias",
                                             "layers.0.attn.wqkv",
                                             "layers.0.attn.bqkv",
                                             "layers.0.attn.wo",
                                             "layers.0.attn.bo",
                                             "layers.0.ln2.weight",
                                             "layers.0.ln2.bias",
                                             "layers.0.mlp.w1",
                                             "layers.0.mlp.b1",
                                             "layers.0.mlp.w2",
                                             "layers.0.mlp.b2",
                                             "layers.1.ln1.weight",
                                             "layers.1.ln1.bias",
                                             "layers.1.attn.wqkv",
                                             "layers.1.attn.bqkv",
                                             "layers.1.attn.wo",
                                             "layers.1.attn.bo",
                                             "layers.1.ln2.weight",
                                             "layers.1.ln2.bias",
                                             "layers.1.moe.router",
                                             "layers.1.moe.experts.0.w1",
                                             "layers.1.moe.experts.1.w1",
                                             "layers.1.moe.experts.2.w1",
                                             "layers.1.moe.experts.3.w1",
                                             "layers.1.moe.experts.0.b1",
                                             "layers.1.moe.experts.1.b1",
                                             "layers.1.moe.experts.2.b1",
                                             "layers.1.moe.experts.3.b1",
                                             "layers.1.moe.experts.0.w2",
                                             "layers.1.moe.experts.1.w2",
                                             "layers.1.moe.experts.2.w2",
                                             "layers.1.moe.experts.3.w2",
                                             "layers.1.moe.experts.0.b2",
                                             "layers.1.moe.experts.1.b2",
                                             "layers.1.moe.experts.2.b2",
                                             "layers.1.moe.experts.3.b2",
                                             "lnf.weight",
                                             "lnf.bias"};
  EXPECT_EQ(names, expected);

  auto shape = [&](const std::string& n) { return m->FindParam(n)->shape; };
  using S = std::vector<int64_t>;
  EXPECT_EQ(shape("wte"), (S{32, 16}));
  EXPECT_EQ(shape("wpe"), (S{8, 16}));
  EXPECT_EQ(shape("layers.0.attn.wqkv"), (S{16, 48}));
  EXPECT_EQ(shape("layers.0.attn.bqkv"), (S{48}));
  EXPECT_EQ(shape("layers.0.attn.wo"), (S{16, 16}));
  EXPECT_EQ(shape("layers.0.mlp.w1"), (S{16, 64}));
  EXPECT_EQ(shape("layers.0.mlp.w2"), (S{64, 16}));
  EXPECT_EQ(shape("layers.1.moe.router"), (S{16, 4}));
  EXPECT_EQ(shape("layers.1.moe.experts.2.w1"), (S{16, 24}));
  EXPECT_EQ(shape("layers.1.moe.experts.2.b1"), (S{24}));
  EXPECT_EQ(shape("layers.1.moe.experts.2.w2"), (S{24, 16}));
  EXPECT_EQ(shape("layers.1.moe.experts.2.b2"), (S{16}));
  EXPECT_EQ(m->FindParam("layers.0.moe.router"), nullptr);

  // Expert weights form [E, d, f] / [E, f] / [E, f, d] / [E, d] blocks for the grouped GEMM.
  const LayerOffsets& o = m->layout().layers[1];
  for (int e = 0; e < 4; ++e) {
    const std::string p = "layers.1.moe.experts." + std::to_string(e);
    EXPECT_EQ(m->FindParam(p + ".w1")->offset, o.w1 + e * 16 * 24);
    EXPECT_EQ(m->FindParam(p + ".b1")->offset, o.b1 + e * 24);
    EXPECT_EQ(m->FindParam(p + ".w2")->offset, o.w2 + e * 24 * 16);
    EXPECT_EQ(m->FindParam(p + ".b2")->offset, o.b2 + e * 16);
  }
}

TEST_F(ParamsTest, ValidateRejectsBadConfigs) {
  ModelConfig c = TinyConfig();
  c.heads = 3;
  EXPECT_THAT(c.Validate().message(), ::testing::HasSubstr("heads = 3"));
  c = TinyConfig();
  c.top_k = 5;
  EXPECT_THAT(c.Validate().message(), ::testing::HasSubstr("top_k = 5"));
  c = TinyConfig();
  c.capacity_factor = -1;
  EXPECT_EQ(c.Validate().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(GptMoe::Create(c, 1, *device_, arena_).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(ParamsTest, InitStatistics) {
  ModelConfig c = TinyConfig();
  c.vocab = 512;
  c.d_model = 64;
  c.heads = 4;
  c.expert_ffn = 128;
  std::unique_ptr<GptMoe> m = Make(c);
  ASSERT_NE(m, nullptr);
  auto check_normal = [&](const std::string& name, double want_std) {
    std::vector<float> v = Values(*m, name);
    double sum = 0, sq = 0;
    for (float x : v) {
      sum += x;
      sq += double{x} * x;
    }
    const double n = static_cast<double>(v.size());
    const double mean = sum / n, std = std::sqrt(sq / n - mean * mean);
    EXPECT_NEAR(mean, 0.0, 5.0 * want_std / std::sqrt(n)) << name;
    EXPECT_NEAR(std, want_std, 5.0 * want_std / std::sqrt(2 * n)) << name;
  };
  const double resid = 0.02 / std::sqrt(2.0 * c.layers);
  check_normal("wte", 0.02);
  check_normal("wpe", 0.02);
  check_normal("layers.0.attn.wqkv", 0.02);
  check_normal("layers.0.attn.wo", resid);
  check_normal("layers.0.mlp.w1", 0.02);
  check_normal("layers.0.mlp.w2", resid);
  check_normal("layers.1.moe.router", 0.02);
  check_normal("layers.1.moe.experts.3.w1", 0.02);
  check_normal("layers.1.moe.experts.3.w2", resid);
  for (const char* name : {"layers.0.attn.bqkv", "layers.0.attn.bo", "layers.0.mlp.b1",
                           "layers.1.moe.experts.1.b2", "layers.1.ln1.bias", "lnf.bias"}) {
    for (float x : Values(*m, name)) ASSERT_EQ(x, 0.0f) << name;
  }
  for (const char* name : {"layers.0.ln1.weight", "layers.1.ln2.weight", "lnf.weight"}) {
    for (float x : Values(*m, name)) ASSERT_EQ(x, 1.0f) << name;
  }
  // Different parameters and different seeds draw different values.
  EXPECT_NE(Values(*m, "layers.0.attn.wqkv")[0], Values(*m, "layers.1.attn.wqkv")[0]);
  std::unique_ptr<GptMoe> other = Make(c, 99);
  EXPECT_NE(Values(*m, "wte")[5], Values(*other, "wte")[5]);
}

TEST_F(ParamsTest, InitIsLayoutIndependent) {
  std::unique_ptr<GptMoe> a = Make(TinyConfig());
  ModelConfig wide = TinyConfig();
  wide.vocab = 64;   // wte grows: its first 32 rows must not change
  wide.experts = 8;  // more experts before and after
  wide.top_k = 3;
  wide.dense_ffn = 32;  // a different dense width
  std::unique_ptr<GptMoe> b = Make(wide);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(Values(*a, "layers.0.attn.wqkv"), Values(*b, "layers.0.attn.wqkv"));
  EXPECT_EQ(Values(*a, "layers.1.attn.wo"), Values(*b, "layers.1.attn.wo"));
  EXPECT_EQ(Values(*a, "layers.1.moe.experts.2.w1"), Values(*b, "layers.1.moe.experts.2.w1"));
  EXPECT_EQ(Values(*a, "layers.1.moe.experts.3.w2"), Values(*b, "layers.1.moe.experts.3.w2"));
  std::vector<float> wte_a = Values(*a, "wte"), wte_b = Values(*b, "wte");
  EXPECT_EQ(wte_a, std::vector<float>(wte_b.begin(), wte_b.begin() + wte_a.size()));

  // A shard computed on its own holds the same values as the whole parameter.
  const train::ParamInfo* p = a->FindParam("layers.1.moe.experts.1.w1");
  train::ParamInfo rows = *p;  // rows [2, 4) and [6, 9) of it
  rows.shard.global_shape = p->shape;
  rows.shard.dim = 0;
  rows.shard.ranges = {{2, 4}, {6, 9}};
  rows.shape = {5, p->shape[1]};
  std::vector<float> shard(static_cast<size_t>(rows.numel()));
  InitParameter(1234, rows, 2, shard.data());
  ASSERT_EQ(rows.GlobalIndex(2 * p->shape[1]), 6 * p->shape[1]);  // local row 2 is global row 6
  for (int64_t i = 0; i < rows.numel(); ++i) {
    ASSERT_EQ(shard[i], a->param_data()[p->offset + rows.GlobalIndex(i)]) << i;
  }
}

TEST_F(ParamsTest, FlopsPerTokenByHand) {
  std::unique_ptr<GptMoe> m = Make(TinyConfig());
  ASSERT_NE(m, nullptr);
  // Active: 8400 - wpe 128 - (E - k) = 2 experts x (16*24 + 24 + 24*16 + 16 = 808) = 6656.
  // 6 * 6656 + 12 * L * T * d = 39936 + 12 * 2 * 8 * 16 = 43008.
  EXPECT_DOUBLE_EQ(m->FlopsPerToken(), 43008.0);
}

}  // namespace
}  // namespace furnace::model
