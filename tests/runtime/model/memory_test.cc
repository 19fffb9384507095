// The declared activation bytes against the arena, the budget error path, extreme routing (one
// expert takes every token, others get none), and the static offload policy's device bytes.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "model_test_util.h"
#include "runtime/memory/copy_engine.h"
#include "runtime/model/gpt_moe.h"
#include "runtime/tensor/host_pool.h"

namespace furnace::model {
namespace {

using testing::RandomTokens;
using testing::TinyConfig;

class MemoryTest : public ::testing::Test {
 protected:
  std::unique_ptr<GptMoe> Make(const ModelConfig& c, tensor::DeviceArena& arena) {
    absl::StatusOr<std::unique_ptr<GptMoe>> m = GptMoe::Create(c, 5, *device_, arena);
    EXPECT_TRUE(m.ok()) << m.status();
    return m.ok() ? std::move(*m) : nullptr;
  }
  absl::StatusOr<train::MicroBatchResult> Step(GptMoe& m, int B) {
    const int N = B * m.seq_len();
    in_ = RandomTokens(N, m.vocab(), 21);
    tg_ = RandomTokens(N, m.vocab(), 22);
    return m.ForwardBackward(in_.data(), tg_.data(), B, 1.0 / N, 1.0);
  }

  // EveryPerRankRebuildIsBitExactAlsoInChains, with the attention's probabilities stored or not.
  void ExpectEveryPerRankRebuildBitExact(bool recompute_probs);

  std::unique_ptr<device::Device> device_ = device::CreateCpuDevice();
  std::vector<int32_t> in_, tg_;
};

TEST_F(MemoryTest, ArenaPeakEqualsDeclaredBytesExactly) {
  for (double cf : {0.0, 1.0, 0.5}) {
    for (int B : {1, 2, 3}) {
      tensor::DeviceArena arena(*device_, 0);
      std::unique_ptr<GptMoe> m = Make(TinyConfig(cf), arena);
      ASSERT_NE(m, nullptr);
      absl::StatusOr<train::MicroBatchResult> r = Step(*m, B);
      ASSERT_TRUE(r.ok()) << r.status();
      const int64_t declared = m->ActivationBytesForRouting(B, m->last_rows_per_moe_layer());
      EXPECT_EQ(r->activation_peak_bytes, declared) << "cf " << cf << " B " << B;
      EXPECT_EQ(static_cast<int64_t>(arena.peak_bytes()), declared);
      EXPECT_EQ(arena.current_bytes(), 0u);  // everything went back
      EXPECT_EQ(m->stash().size(), 0);
      EXPECT_GT(m->last_stashed_bytes(), 0u);
      EXPECT_LE(declared, m->ActivationBytes(B));
      if (cf == 0.0) {
        EXPECT_EQ(declared, m->ActivationBytes(B));
      }
    }
  }
}

TEST_F(MemoryTest, PeakIsExactWithSeveralMoeLayersAndDenseOnly) {
  ModelConfig c = TinyConfig(1.0);
  c.layers = 4;
  c.moe_every = 1;
  c.vocab = 200;  // head-heavy: the peak moves to the head
  tensor::DeviceArena arena(*device_, 0);
  std::unique_ptr<GptMoe> m = Make(c, arena);
  ASSERT_NE(m, nullptr);
  absl::StatusOr<train::MicroBatchResult> r = Step(*m, 2);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->tokens_per_expert.size(), 4u);
  EXPECT_EQ(r->activation_peak_bytes,
            m->ActivationBytesForRouting(2, m->last_rows_per_moe_layer()));

  ModelConfig dense = TinyConfig();
  dense.moe_every = 3;  // layers 0, 1 dense
  tensor::DeviceArena arena2(*device_, 0);
  std::unique_ptr<GptMoe> d = Make(dense, arena2);
  ASSERT_NE(d, nullptr);
  r = Step(*d, 2);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->tokens_per_expert.empty());
  EXPECT_EQ(r->activation_peak_bytes, d->ActivationBytes(2));
}

TEST_F(MemoryTest, OneByteShortIsResourceExhaustedAndLeavesNothingBehind) {
  tensor::DeviceArena probe(*device_, 0);
  std::unique_ptr<GptMoe> m = Make(TinyConfig(), probe);
  ASSERT_NE(m, nullptr);
  const int64_t need = m->ActivationBytes(2);

  tensor::DeviceArena tight(*device_, need - 1);
  std::unique_ptr<GptMoe> t = Make(TinyConfig(), tight);
  ASSERT_NE(t, nullptr);
  absl::StatusOr<train::MicroBatchResult> r = Step(*t, 2);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(r.status().message(), ::testing::HasSubstr(std::to_string(need - 1)));
  EXPECT_EQ(tight.current_bytes(), 0u);
  EXPECT_EQ(t->stash().size(), 0);
  const std::vector<int32_t> big(64 * 8, 1);
  EXPECT_EQ(t->Evaluate(big.data(), big.data(), 64).status().code(),
            absl::StatusCode::kResourceExhausted);  // a forward of B = 64 does not fit either

  tight.set_budget(need);  // exactly enough
  t->ZeroGrad();
  r = Step(*t, 2);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->activation_peak_bytes, need);
}

TEST_F(MemoryTest, BadTokensAreInvalidArgument) {
  tensor::DeviceArena arena(*device_, 0);
  std::unique_ptr<GptMoe> m = Make(TinyConfig(), arena);
  ASSERT_NE(m, nullptr);
  std::vector<int32_t> in(16, 0), tg(16, 0);
  tg[3] = 32;
  EXPECT_EQ(m->ForwardBackward(in.data(), tg.data(), 2, 1, 1).status().code(),
            absl::StatusCode::kInvalidArgument);
  in[0] = -1;
  EXPECT_EQ(m->Evaluate(in.data(), tg.data(), 2).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// Router weights that send every token to experts 0 and 1: ln2.bias = 1 makes u . 1 = d for every
// token, so router columns of 1.0 and 0.5 give logits d and d/2 against 0.
void ForceRouting(GptMoe& m) {
  const LayerOffsets& o = m.layout().layers[1];
  const int d = m.config().d_model, E = m.config().experts;
  float* p = m.param_data();
  for (int i = 0; i < d; ++i) {
    p[o.ln2_b + i] = 1.0f;
    for (int e = 0; e < E; ++e)
      p[o.router + int64_t{i} * E + e] = e == 0 ? 1.0f : e == 1 ? 0.5f : 0;
  }
}

TEST_F(MemoryTest, AllTokensToOneExpertAndIdleExperts) {
  for (double cf : {0.0, 1.0}) {
    tensor::DeviceArena arena(*device_, 0);
    std::unique_ptr<GptMoe> m = Make(TinyConfig(cf), arena);
    ASSERT_NE(m, nullptr);
    ForceRouting(*m);
    m->ZeroGrad();
    absl::StatusOr<train::MicroBatchResult> r = Step(*m, 2);
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_EQ(r->tokens_per_expert.size(), 1u);
    EXPECT_EQ(r->tokens_per_expert[0], (std::vector<int64_t>{16, 16, 0, 0}));
    // capacity = ceil(1.0 * 2 * 16 / 4) = 8 per expert: 8 of 16 dropped at experts 0 and 1.
    EXPECT_EQ(r->dropped, cf == 0.0 ? 0 : 16);
    EXPECT_TRUE(std::isfinite(r->loss));
    // aux = alpha * E * (0.5 * mean p0 + 0.5 * mean p1) > alpha: imbalance is penalised.
    EXPECT_GT(r->aux_loss, 0.01);
    EXPECT_EQ(r->activation_peak_bytes,
              m->ActivationBytesForRouting(2, m->last_rows_per_moe_layer()));
    for (int64_t i = 0; i < m->num_params(); ++i) ASSERT_TRUE(std::isfinite(m->grad_data()[i]));
    for (int e : {2, 3}) {
      for (const char* w : {".w1", ".b1", ".w2", ".b2"}) {
        const std::string name = "layers.1.moe.experts." + std::to_string(e) + w;
        const train::ParamInfo* p = m->FindParam(name);
        for (int64_t i = 0; i < p->numel(); ++i) {
          ASSERT_EQ(m->grad_data()[p->offset + i], 0.0f) << name;
        }
      }
    }
    const train::ParamInfo* busy = m->FindParam("layers.1.moe.experts.0.w1");
    double norm = 0;
    for (int64_t i = 0; i < busy->numel(); ++i) norm += std::abs(m->grad_data()[busy->offset + i]);
    EXPECT_GT(norm, 0);
  }
}

// Between a micro-batch's forward and its backward, the offloaded expert buffers leave the arena
// (once their copies land) and sit in the host pool; the backward reloads them and computes
// exactly the gradients of policy none.
TEST_F(MemoryTest, OffloadedExpertBuffersLeaveTheArenaAndComeBackBitExact) {
  ModelConfig c = TinyConfig();
  c.layers = 4;  // MoE layers 1 and 3
  const int B = 2, N = B * c.seq_len;
  const std::vector<int32_t> in = RandomTokens(N, c.vocab, 31), tg = RandomTokens(N, c.vocab, 32);

  tensor::DeviceArena keep_arena(*device_, 0);
  std::unique_ptr<GptMoe> keep = Make(c, keep_arena);
  ASSERT_NE(keep, nullptr);
  keep->ZeroGrad();
  ASSERT_TRUE(keep->StageForward(0, in.data(), tg.data(), nullptr, B, nullptr).ok());
  const uint64_t kept_after_forward = keep_arena.current_bytes();
  ASSERT_TRUE(keep->StageBackward(0, nullptr, 1.0 / N, 1.0, nullptr).ok());

  absl::StatusOr<std::unique_ptr<memory::CopyEngine>> engine = memory::CopyEngine::Create(*device_);
  ASSERT_TRUE(engine.ok()) << engine.status();
  tensor::HostPool host(*device_, 0);
  tensor::DeviceArena arena(*device_, 0);
  std::unique_ptr<GptMoe> off = Make(c, arena);
  ASSERT_NE(off, nullptr);
  EXPECT_EQ(off->SetOffload(1.5, engine->get(), &host).code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(off->SetOffload(1.0, engine->get(), &host).ok());
  off->ZeroGrad();
  ASSERT_TRUE(off->StageForward(0, in.data(), tg.data(), nullptr, B, nullptr).ok());
  off->stash().WaitForCopies();
  // Per MoE layer: R = N k = 32 rows; expert input and output 32 x 16, pre and hidden 32 x 24.
  const uint64_t expert_bytes = 2 * 4 * (2 * 32 * 16 + 2 * 32 * 24);
  EXPECT_EQ(host.current_bytes(), expert_bytes);
  EXPECT_EQ(arena.current_bytes(), kept_after_forward - expert_bytes);
  int offloaded = 0;
  for (const StashEntryInfo& e : off->stash().Entries()) {
    if (e.state != StashState::kOffloaded) continue;
    ++offloaded;
    EXPECT_THAT(std::string(memory::TensorTag(e.producer)),
                ::testing::AnyOf("moe.expert_input", "moe.expert_pre", "moe.expert_hidden",
                                 "moe.combined_output"));
  }
  EXPECT_EQ(offloaded, 8);

  ASSERT_TRUE(off->StageBackward(0, nullptr, 1.0 / N, 1.0, nullptr).ok());
  EXPECT_EQ(arena.current_bytes(), 0u);
  EXPECT_EQ(host.current_bytes(), 0u);
  const StashActionStats st = off->stash().action_stats();
  EXPECT_EQ(st.offloaded_bytes, expert_bytes);
  EXPECT_EQ(st.reloaded_bytes, expert_bytes);
  // What the training loop reports as planner bytes (Trainable::MemoryActions).
  const train::MemoryActionTotals actions = off->MemoryActions();
  EXPECT_EQ(actions.offloaded_bytes, expert_bytes);
  EXPECT_EQ(actions.recomputed_bytes, 0u);
  EXPECT_EQ(actions.compressed_bytes, 0u);
  EXPECT_EQ(keep->MemoryActions().offloaded_bytes, 0u);
  ASSERT_EQ(off->num_params(), keep->num_params());
  EXPECT_EQ(std::memcmp(off->grad_data(), keep->grad_data(), 4 * keep->num_params()), 0);
}

// The static memory policies: the arena peak equals the declared bytes under each policy, byte
// for byte; gradients, loss and aux loss are bit-identical to `none`; every dropped byte is
// rebuilt.
TEST_F(MemoryTest, PoliciesMatchTheirDeclaredPeakAndNoneBitForBit) {
  using memory::MemoryPolicy;
  ModelConfig deep = TinyConfig(1.0);
  deep.layers = 4;
  deep.moe_every = 1;  // every layer MoE, capacity drops
  struct Case {
    ModelConfig config;
    int B;
  };
  for (const Case& c : {Case{TinyConfig(), 2}, Case{TinyConfig(1.0), 3}, Case{deep, 2}}) {
    tensor::DeviceArena ref_arena(*device_, 0);
    std::unique_ptr<GptMoe> ref = Make(c.config, ref_arena);
    ASSERT_NE(ref, nullptr);
    absl::StatusOr<train::MicroBatchResult> want = Step(*ref, c.B);
    ASSERT_TRUE(want.ok()) << want.status();
    const std::vector<float> want_grads(ref->grad_data(), ref->grad_data() + ref->num_params());
    int64_t previous_peak = want->activation_peak_bytes;
    for (MemoryPolicy policy : {MemoryPolicy::kSelective, MemoryPolicy::kFullRecompute}) {
      SCOPED_TRACE(memory::MemoryPolicyName(policy));
      tensor::DeviceArena arena(*device_, 0);
      std::unique_ptr<GptMoe> m = Make(c.config, arena);
      ASSERT_NE(m, nullptr);
      ASSERT_TRUE(m->SetMemoryPolicy(policy).ok());
      EXPECT_EQ(m->memory_policy(), policy);
      absl::StatusOr<train::MicroBatchResult> r = Step(*m, c.B);
      ASSERT_TRUE(r.ok()) << r.status();
      EXPECT_EQ(r->activation_peak_bytes,
                m->ActivationBytesForRouting(c.B, m->last_rows_per_moe_layer()));
      // selective saves, full_recompute at least as much (with one MoE layer, on top, the peak is
      // that layer's own backward, where everything it dropped is rebuilt at once).
      if (policy == MemoryPolicy::kSelective || c.config.layers == 4) {
        EXPECT_LT(r->activation_peak_bytes, previous_peak);  // deep: MoE layers below the top
      } else {
        EXPECT_LE(r->activation_peak_bytes, previous_peak);
      }
      previous_peak = r->activation_peak_bytes;
      EXPECT_EQ(r->loss, want->loss);
      EXPECT_EQ(r->aux_loss, want->aux_loss);
      EXPECT_EQ(r->tokens_per_expert, want->tokens_per_expert);
      for (int64_t i = 0; i < m->num_params(); ++i) {
        ASSERT_EQ(m->grad_data()[i], want_grads[i]) << "gradient " << i;
      }
      EXPECT_GT(m->stash().dropped_bytes(), 0u);
      EXPECT_EQ(m->stash().rebuilt_bytes(), m->stash().dropped_bytes());
      EXPECT_EQ(m->MemoryActions().recomputed_bytes, m->stash().rebuilt_bytes());
      EXPECT_EQ(m->MemoryActions().offloaded_bytes, 0u);
      EXPECT_EQ(ref->MemoryActions().recomputed_bytes, 0u);
      EXPECT_LT(m->last_stashed_bytes(), ref->last_stashed_bytes());
      EXPECT_EQ(m->stash().size(), 0);
      EXPECT_EQ(arena.current_bytes(), 0u);
      std::printf(
          "REPORT layers %d cf %.1f B %d: none %lld B, %s %lld B (arena peak = declared); "
          "stash peak %llu B vs %llu B\n",
          c.config.layers, c.config.capacity_factor, c.B,
          static_cast<long long>(want->activation_peak_bytes), memory::MemoryPolicyName(policy),
          static_cast<long long>(r->activation_peak_bytes),
          static_cast<unsigned long long>(ref->stash().peak_stashed_bytes()),
          static_cast<unsigned long long>(m->stash().peak_stashed_bytes()));
    }
  }
}

// model.attention_probs recomputed: attention saves (B, NH, T, 2) row statistics instead of its
// (B, NH, T, T) probabilities and rebuilds them in backward. Under every policy: the loss, the
// routing and every gradient bit for bit the stored run's, the arena peak its declared bytes, and
// that peak lower, and what it stashed lower by the probabilities' bytes less the statistics' per
// layer (T = 8 here: 4x fewer).
TEST_F(MemoryTest, RecomputedAttentionProbsTrainBitForBitInLessMemory) {
  using memory::MemoryPolicy;
  ModelConfig deep = TinyConfig(1.0);
  deep.layers = 4;
  deep.moe_every = 2;  // dense layers too
  for (const ModelConfig& base : {TinyConfig(), deep}) {
    for (MemoryPolicy policy :
         {MemoryPolicy::kNone, MemoryPolicy::kSelective, MemoryPolicy::kFullRecompute}) {
      SCOPED_TRACE(memory::MemoryPolicyName(policy));
      tensor::DeviceArena ref_arena(*device_, 0);
      std::unique_ptr<GptMoe> ref = Make(base, ref_arena);
      ASSERT_NE(ref, nullptr);
      ASSERT_TRUE(ref->SetMemoryPolicy(policy).ok());
      absl::StatusOr<train::MicroBatchResult> want = Step(*ref, 2);
      ASSERT_TRUE(want.ok()) << want.status();

      ModelConfig c = base;
      c.recompute_attention_probs = true;
      tensor::DeviceArena arena(*device_, 0);
      std::unique_ptr<GptMoe> m = Make(c, arena);
      ASSERT_NE(m, nullptr);
      ASSERT_TRUE(m->SetMemoryPolicy(policy).ok());
      absl::StatusOr<train::MicroBatchResult> r = Step(*m, 2);
      ASSERT_TRUE(r.ok()) << r.status();
      EXPECT_EQ(r->loss, want->loss);
      EXPECT_EQ(r->aux_loss, want->aux_loss);
      EXPECT_EQ(r->tokens_per_expert, want->tokens_per_expert);
      for (int64_t i = 0; i < m->num_params(); ++i) {
        ASSERT_EQ(m->grad_data()[i], ref->grad_data()[i]) << "gradient " << i;
      }
      EXPECT_EQ(r->activation_peak_bytes,
                m->ActivationBytesForRouting(2, m->last_rows_per_moe_layer()));
      EXPECT_EQ(static_cast<int64_t>(arena.peak_bytes()), r->activation_peak_bytes);
      EXPECT_EQ(arena.current_bytes(), 0u);
      EXPECT_LT(r->activation_peak_bytes, want->activation_peak_bytes);
      // (2, 2 heads, 8, 8) floats against (2, 2, 8, 2), per layer.
      const uint64_t saved_less = 4 * 2 * 2 * 8 * (8 - 2);
      EXPECT_EQ(ref->last_stashed_bytes() - m->last_stashed_bytes(), saved_less * c.layers);
    }
  }
}

// The stash actions on top of it: the static offload of the expert buffers, and the adaptive
// planner under a budget below the recomputed run's own peak (it offloads and drops to fit). Each
// trains bit for bit as the stored run under none, its peak within the budget.
TEST_F(MemoryTest, RecomputedAttentionProbsUnderOffloadAndAdaptive) {
  ModelConfig stored = TinyConfig(1.0);
  stored.layers = 4;
  stored.moe_every = 1;
  tensor::DeviceArena ref_arena(*device_, 0);
  std::unique_ptr<GptMoe> ref = Make(stored, ref_arena);
  ASSERT_NE(ref, nullptr);
  absl::StatusOr<train::MicroBatchResult> want = Step(*ref, 2);
  ASSERT_TRUE(want.ok()) << want.status();
  ModelConfig c = stored;
  c.recompute_attention_probs = true;
  tensor::DeviceArena probe_arena(*device_, 0);
  std::unique_ptr<GptMoe> probe = Make(c, probe_arena);
  ASSERT_NE(probe, nullptr);
  absl::StatusOr<train::MicroBatchResult> plain = Step(*probe, 2);
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_LT(plain->activation_peak_bytes, want->activation_peak_bytes);

  absl::StatusOr<std::unique_ptr<memory::CopyEngine>> engine = memory::CopyEngine::Create(*device_);
  ASSERT_TRUE(engine.ok()) << engine.status();
  tensor::HostPool host(*device_, 0);
  for (const bool adaptive : {false, true}) {
    SCOPED_TRACE(adaptive ? "adaptive" : "offload");
    const uint64_t budget =
        adaptive ? static_cast<uint64_t>(0.8 * static_cast<double>(plain->activation_peak_bytes))
                 : 0;
    tensor::DeviceArena arena(*device_, budget);
    std::unique_ptr<GptMoe> m = Make(c, arena);
    ASSERT_NE(m, nullptr);
    if (adaptive) {
      ASSERT_TRUE(m->SetMemoryPolicy(memory::MemoryPolicy::kAdaptive).ok());
      ASSERT_TRUE(m->SetAdaptive(engine->get(), &host, {}).ok());
    } else {
      ASSERT_TRUE(m->SetOffload(1.0, engine->get(), &host).ok());
    }
    absl::StatusOr<train::MicroBatchResult> r = Step(*m, 2);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->loss, want->loss);
    EXPECT_EQ(r->aux_loss, want->aux_loss);
    EXPECT_EQ(r->tokens_per_expert, want->tokens_per_expert);
    EXPECT_EQ(std::memcmp(m->grad_data(), ref->grad_data(), 4 * ref->num_params()), 0);
    EXPECT_GT(m->MemoryActions().offloaded_bytes, 0u);
    if (adaptive) {
      EXPECT_LE(arena.peak_bytes(), budget);
      EXPECT_GT(m->planner_stats().decisions, 0);
    }
    EXPECT_EQ(arena.current_bytes(), 0u);
    EXPECT_EQ(host.current_bytes(), 0u);
  }
}

// The attention probabilities are rebuildable from qkv alone (AttentionProbs: the forward's own
// scores and softmax), so the adaptive planner may drop them. With sequences long next to the
// width (T 64, d 16: each layer's probabilities more than the rest of its attention module's saved
// bytes), 4 layers of which 1 and 3 are MoE, and no copy engine (recompute only), a budget of 60%
// of none's peak is met by the plan alone (no emergency path) dropping every layer's
// probabilities: those saved before a decision, and those later layers will save (layer 2's is
// planned at layer 1's decision; without that, the plan leaves one kept). The forward leaves
// attn.probs dropped, backward rebuilds them, and the step is none's bit for bit.
TEST_F(MemoryTest, AdaptiveDropsAttentionProbsAndRebuildsThemBitForBit) {
  ModelConfig c = TinyConfig();
  c.seq_len = 64;
  c.layers = 4;
  tensor::DeviceArena ref_arena(*device_, 0);
  std::unique_ptr<GptMoe> ref = Make(c, ref_arena);
  ASSERT_NE(ref, nullptr);
  absl::StatusOr<train::MicroBatchResult> want = Step(*ref, 2);
  ASSERT_TRUE(want.ok()) << want.status();

  const uint64_t budget =
      static_cast<uint64_t>(0.6 * static_cast<double>(want->activation_peak_bytes));
  tensor::DeviceArena arena(*device_, budget);
  std::unique_ptr<GptMoe> m = Make(c, arena);
  ASSERT_NE(m, nullptr);
  ASSERT_TRUE(m->SetMemoryPolicy(memory::MemoryPolicy::kAdaptive).ok());
  ASSERT_TRUE(m->SetAdaptive(nullptr, nullptr, {}).ok());
  const int N = 2 * c.seq_len;
  m->ZeroGrad();
  ASSERT_TRUE(m->StageForward(0, in_.data(), tg_.data(), nullptr, 2, nullptr).ok());
  int dropped_probs = 0;
  for (const StashEntryInfo& e : m->stash().Entries()) {
    if (e.state == StashState::kDropped && memory::TensorTag(e.producer) == "attn.probs") {
      ++dropped_probs;
    }
  }
  EXPECT_EQ(dropped_probs, c.layers);
  const absl::Status backward = m->StageBackward(0, nullptr, 1.0 / N, 1.0, nullptr);
  ASSERT_TRUE(backward.ok()) << backward;
  EXPECT_LE(arena.peak_bytes(), budget);
  EXPECT_EQ(arena.current_bytes(), 0u);
  EXPECT_GT(m->MemoryActions().recomputed_bytes, 0u);
  EXPECT_GT(m->planner_stats().decisions, 0);
  EXPECT_EQ(m->planner_stats().emergency_offloads, 0);
  EXPECT_EQ(std::memcmp(m->grad_data(), ref->grad_data(), 4 * ref->num_params()), 0);
  std::printf("REPORT none peak %lld B; adaptive at %llu B dropped %d attn.probs, peak %llu B\n",
              static_cast<long long>(want->activation_peak_bytes),
              static_cast<unsigned long long>(budget), dropped_probs,
              static_cast<unsigned long long>(arena.peak_bytes()));
}

// Every tensor with a per-rank rebuild rebuilds bit for bit, also in chains: after the forward
// every one of them is dropped at once (qkv and the dense MLP's pre-activation with the norm
// outputs they are rebuilt from, the probabilities with the qkv they are rebuilt from), and the
// backward, rebuilding each from its rebuilt inputs, gives none's gradients bit for bit. (qkv and
// mlp.pre had their cost declared and no rebuild: a plan could only offload them.) Under
// recomputed probabilities the attention's output is dropped too, and rebuilt from the rebuilt
// qkv by the forward again.
TEST_F(MemoryTest, EveryPerRankRebuildIsBitExactAlsoInChains) {
  for (bool recompute_probs : {false, true}) {
    SCOPED_TRACE(recompute_probs ? "attention_probs recomputed" : "attention_probs stored");
    ExpectEveryPerRankRebuildBitExact(recompute_probs);
  }
}

void MemoryTest::ExpectEveryPerRankRebuildBitExact(bool recompute_probs) {
  ModelConfig c = TinyConfig();
  c.layers = 4;  // MoE layers 1 and 3, dense MLPs 0 and 2
  c.recompute_attention_probs = recompute_probs;
  tensor::DeviceArena ref_arena(*device_, 0);
  std::unique_ptr<GptMoe> ref = Make(c, ref_arena);
  ASSERT_NE(ref, nullptr);
  ASSERT_TRUE(Step(*ref, 2).ok());

  tensor::DeviceArena arena(*device_, 0);
  std::unique_ptr<GptMoe> m = Make(c, arena);
  ASSERT_NE(m, nullptr);
  const int N = 2 * c.seq_len;
  m->ZeroGrad();
  ASSERT_TRUE(m->StageForward(0, in_.data(), tg_.data(), nullptr, 2, nullptr).ok());
  std::set<std::string> dropped;
  for (const StashEntrySummary& e : m->stash().Summaries()) {
    if (e.state != StashState::kKept || !e.rebuildable) continue;
    ASSERT_TRUE(m->stash().Drop(e.handle).ok()) << e.producer;
    dropped.insert(std::string(memory::TensorTag(e.producer)));
  }
  // Under recomputed probabilities the attention's output rebuilds (its forward again, from the
  // rebuilt qkv), and there are no probabilities to drop.
  std::vector<std::string> tags = {"attn.qkv", "mlp.pre", "ln1.out", "ln2.out"};
  tags.push_back(recompute_probs ? "attn.y" : "attn.probs");
  for (const std::string& tag : tags) EXPECT_EQ(dropped.count(tag), 1u) << tag;
  const uint64_t kept = arena.current_bytes();
  const absl::Status backward = m->StageBackward(0, nullptr, 1.0 / N, 1.0, nullptr);
  ASSERT_TRUE(backward.ok()) << backward;
  EXPECT_GT(m->stash().rebuilt_bytes(), 0u);
  EXPECT_LT(kept, static_cast<uint64_t>(ref->ActivationBytes(2)));
  EXPECT_EQ(std::memcmp(m->grad_data(), ref->grad_data(), 4 * ref->num_params()), 0);
}

// A budget that fits a policy's declared peak, and not none's, trains under that policy.
TEST_F(MemoryTest, BudgetBetweenThePoliciesPeaks) {
  tensor::DeviceArena probe(*device_, 0);
  std::unique_ptr<GptMoe> p = Make(TinyConfig(), probe);
  ASSERT_NE(p, nullptr);
  const int64_t none = p->ActivationBytes(2);
  ASSERT_TRUE(p->SetMemoryPolicy(memory::MemoryPolicy::kFullRecompute).ok());
  const int64_t full = p->ActivationBytes(2);
  ASSERT_LT(full, none);

  tensor::DeviceArena tight(*device_, full);
  std::unique_ptr<GptMoe> m = Make(TinyConfig(), tight);
  ASSERT_NE(m, nullptr);
  EXPECT_EQ(Step(*m, 2).status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(tight.current_bytes(), 0u);
  ASSERT_TRUE(m->SetMemoryPolicy(memory::MemoryPolicy::kFullRecompute).ok());
  m->ZeroGrad();
  absl::StatusOr<train::MicroBatchResult> r = Step(*m, 2);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->activation_peak_bytes, full);
  // Evaluate drops too (nothing is rebuilt: there is no backward).
  EXPECT_TRUE(m->Evaluate(in_.data(), tg_.data(), 2).ok());
}
}  // namespace
}  // namespace furnace::model
