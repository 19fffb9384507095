#include "runtime/model/stash.h"

#include <memory>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "runtime/tensor/arena.h"

namespace furnace::model {
namespace {

using tensor::DType;

class StashTest : public ::testing::Test {
 protected:
  std::unique_ptr<device::Device> device_ = device::CreateCpuDevice();
  tensor::DeviceArena arena_{*device_, 0};
  Stash stash_;
};

TEST_F(StashTest, SaveGetReleaseAccounting) {
  absl::StatusOr<tensor::Buffer> a = arena_.Allocate(4 * 2 * 3, "a");
  ASSERT_TRUE(a.ok());
  void* data = a->data();
  absl::StatusOr<StashHandle> ha = stash_.Save("layers.1.moe.expert_hidden", 1, std::move(*a),
                                               {2, 3}, DType::kF32, {"gelu", {}, 60});
  ASSERT_TRUE(ha.ok()) << ha.status();
  absl::StatusOr<tensor::Buffer> b = arena_.Allocate(4 * 5, "b");
  ASSERT_TRUE(b.ok());
  absl::StatusOr<StashHandle> hb =
      stash_.Save("embedding.tokens", -1, std::move(*b), {5}, DType::kI32, {});
  ASSERT_TRUE(hb.ok());
  EXPECT_EQ(stash_.stashed_bytes(), 44u);
  EXPECT_EQ(stash_.size(), 2);

  absl::StatusOr<tensor::TensorView> v = stash_.Get(*ha);
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(v->data, data);
  EXPECT_EQ(v->shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(v->dtype, DType::kF32);

  std::vector<StashEntryInfo> entries = stash_.Entries();
  ASSERT_EQ(entries.size(), 2u);
  EXPECT_EQ(entries[0].producer, "layers.1.moe.expert_hidden");
  EXPECT_EQ(entries[0].layer, 1);
  EXPECT_EQ(entries[0].bytes, 24u);
  EXPECT_EQ(entries[0].state, StashState::kKept);
  EXPECT_EQ(entries[0].recompute.op, "gelu");
  EXPECT_EQ(entries[1].producer, "embedding.tokens");

  ASSERT_TRUE(stash_.Release(*ha).ok());
  EXPECT_EQ(stash_.stashed_bytes(), 20u);
  EXPECT_EQ(arena_.current_bytes(), 20u);  // the bytes went back to the arena
  EXPECT_EQ(stash_.peak_stashed_bytes(), 44u);
  EXPECT_EQ(stash_.Get(*ha).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(stash_.Release(*ha).code(), absl::StatusCode::kNotFound);

  stash_.ReleaseAll();
  EXPECT_EQ(stash_.size(), 0);
  EXPECT_EQ(stash_.stashed_bytes(), 0u);
  EXPECT_EQ(arena_.current_bytes(), 0u);
}

TEST_F(StashTest, SizeMismatchIsInvalidArgument) {
  absl::StatusOr<tensor::Buffer> a = arena_.Allocate(10, "a");
  ASSERT_TRUE(a.ok());
  absl::StatusOr<StashHandle> h = stash_.Save("x", 0, std::move(*a), {3}, DType::kF32, {});
  EXPECT_EQ(h.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(h.status().message(), ::testing::HasSubstr("'x'"));
}

// Drop and recompute: a float buffer of n elements filled with `value`, with a rebuild that
// fills a fresh one the same way (counting its calls).
class DropTest : public StashTest {
 protected:
  absl::StatusOr<tensor::Buffer> Filled(int64_t n, float value) {
    absl::StatusOr<tensor::Buffer> b = arena_.Allocate(4 * n, "t");
    if (!b.ok()) return b.status();
    for (int64_t i = 0; i < n; ++i) b->as<float>()[i] = value + static_cast<float>(i);
    return b;
  }
  RecomputeSpec Spec(int64_t n, float value,
                     RecomputeCollective collective = RecomputeCollective::kNone) {
    RecomputeSpec spec{"fill", {}, 1.0 * n, collective};
    spec.rebuild = [this, n, value]() {
      ++rebuilds_;
      return Filled(n, value);
    };
    return spec;
  }
  StashHandle SaveFilled(const std::string& name, int64_t n, float value, RecomputeSpec spec) {
    absl::StatusOr<tensor::Buffer> b = Filled(n, value);
    EXPECT_TRUE(b.ok());
    absl::StatusOr<StashHandle> h =
        stash_.Save(name, 0, std::move(*b), {n}, DType::kF32, std::move(spec));
    EXPECT_TRUE(h.ok()) << h.status();
    return h.ok() ? *h : StashHandle{};
  }
  int rebuilds_ = 0;
};

TEST_F(DropTest, DropFreesTheBytesAndGetRebuildsThem) {
  const StashHandle h = SaveFilled("layers.0.ln1.out", 8, 3.0f, Spec(8, 3.0f));
  const StashHandle keep = SaveFilled("layers.0.attn.residual", 4, 0.0f, {});
  EXPECT_EQ(arena_.current_bytes(), 48u);
  ASSERT_TRUE(stash_.Drop(h).ok());
  EXPECT_EQ(arena_.current_bytes(), 16u);
  EXPECT_EQ(stash_.stashed_bytes(), 16u);
  EXPECT_EQ(stash_.dropped_bytes(), 32u);
  EXPECT_EQ(stash_.Entries()[0].state, StashState::kDropped);
  EXPECT_EQ(rebuilds_, 0);

  absl::StatusOr<tensor::TensorView> v = stash_.Get(h);
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(rebuilds_, 1);
  for (int i = 0; i < 8; ++i) EXPECT_EQ(v->as<float>()[i], 3.0f + i);
  EXPECT_EQ(stash_.rebuilt_bytes(), 32u);
  EXPECT_EQ(stash_.stashed_bytes(), 48u);
  EXPECT_EQ(stash_.Entries()[0].state, StashState::kKept);
  ASSERT_TRUE(stash_.Get(h).ok());
  EXPECT_EQ(rebuilds_, 1);  // kept again: no second rebuild
  ASSERT_TRUE(stash_.Release(keep).ok());
}

TEST_F(DropTest, DropRefusals) {
  const StashHandle plain = SaveFilled("embedding.tokens", 4, 0.0f, {"embedding", {}, 0});
  absl::Status s = stash_.Drop(plain);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), ::testing::HasSubstr("no rebuild"));

  const StashHandle expert = SaveFilled("layers.1.moe.expert_input", 4, 1.0f,
                                        Spec(4, 1.0f, RecomputeCollective::kExpertDispatch));
  s = stash_.Drop(expert);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), ::testing::HasSubstr("all-to-all"));

  const StashHandle h = SaveFilled("layers.0.ln1.out", 4, 2.0f, Spec(4, 2.0f));
  ASSERT_TRUE(stash_.Drop(h).ok());
  EXPECT_EQ(stash_.Drop(h).code(), absl::StatusCode::kFailedPrecondition);  // already dropped
  EXPECT_EQ(stash_.Drop(StashHandle{99}).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(stash_.Acquire({StashHandle{99}}).status().code(), absl::StatusCode::kNotFound);
}

TEST_F(DropTest, AcquireRebuildsInOrderAndPinsUntilTheLeaseEnds) {
  // b's rebuild reads a: acquiring {a, b} rebuilds a first; acquiring b alone rebuilds a for it.
  const StashHandle a = SaveFilled("layers.0.ln2.out", 4, 1.0f, Spec(4, 1.0f));
  RecomputeSpec from_a{"gelu", {a}, 4};
  std::vector<std::string> order;
  from_a.rebuild = [this, a, &order]() -> absl::StatusOr<tensor::Buffer> {
    order.push_back("b");
    absl::StatusOr<tensor::TensorView> in = stash_.Get(a);
    if (!in.ok()) return in.status();
    absl::StatusOr<tensor::Buffer> out = arena_.Allocate(16, "b");
    if (!out.ok()) return out.status();
    for (int i = 0; i < 4; ++i) out->as<float>()[i] = 2 * in->as<float>()[i];
    return out;
  };
  const StashHandle b = SaveFilled("layers.0.mlp.hidden", 4, 2.0f, std::move(from_a));
  ASSERT_TRUE(stash_.Drop(a).ok());
  ASSERT_TRUE(stash_.Drop(b).ok());
  {
    absl::StatusOr<Stash::Lease> lease = stash_.Acquire({b, StashHandle{}});
    ASSERT_TRUE(lease.ok()) << lease.status();
    EXPECT_EQ(rebuilds_, 1);  // a, as b's input
    EXPECT_EQ(stash_.Get(b)->as<float>()[3], 8.0f);
    // Pinned: b cannot be dropped while the backward holds it; a (not acquired) can.
    EXPECT_EQ(stash_.Drop(b).code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_TRUE(stash_.Drop(a).ok());
    Stash::Lease moved = std::move(*lease);
    EXPECT_EQ(stash_.Drop(b).code(), absl::StatusCode::kFailedPrecondition);
  }
  EXPECT_TRUE(stash_.Drop(b).ok());  // the lease is gone
  {
    absl::StatusOr<Stash::Lease> lease = stash_.Acquire({a, b});
    ASSERT_TRUE(lease.ok());
    EXPECT_EQ(rebuilds_, 2);
    EXPECT_EQ(order.size(), 2u);
    // The owner may release a pinned entry at the end of its backward.
    EXPECT_TRUE(stash_.Release(a).ok());
    EXPECT_TRUE(stash_.Release(b).ok());
  }
  EXPECT_EQ(arena_.current_bytes(), 0u);
  // A failed Acquire leaves nothing pinned.
  const StashHandle c = SaveFilled("layers.0.ln1.out", 4, 5.0f, Spec(4, 5.0f));
  EXPECT_FALSE(stash_.Acquire({c, StashHandle{1234}}).ok());
  EXPECT_TRUE(stash_.Drop(c).ok());
}

TEST_F(DropTest, SavePolicyDropsAfterForwardOnly) {
  stash_.SetSavePolicy([](const StashEntryInfo& e) {
    return memory::StaticSaveAction(memory::MemoryPolicy::kFullRecompute,
                                    memory::TensorTag(e.producer));
  });
  const StashHandle ln = SaveFilled("layers.1.ln2.out", 4, 1.0f, Spec(4, 1.0f));
  // A collective rebuild may be dropped by the policy (every rank applies the same one).
  const StashHandle ex = SaveFilled("layers.1.moe.expert_input", 6, 2.0f,
                                    Spec(6, 2.0f, RecomputeCollective::kExpertDispatch));
  const StashHandle res = SaveFilled("layers.1.moe.residual", 2, 0.0f, {});
  EXPECT_EQ(stash_.stashed_bytes(), 48u);  // pending until the module's forward is done
  ASSERT_TRUE(stash_.Get(ln).ok());
  EXPECT_EQ(rebuilds_, 0);
  ASSERT_TRUE(stash_.ApplyPendingDrops().ok());
  EXPECT_EQ(stash_.stashed_bytes(), 8u);
  EXPECT_EQ(stash_.dropped_bytes(), 40u);
  ASSERT_TRUE(stash_.ApplyPendingDrops().ok());  // nothing left pending
  EXPECT_EQ(stash_.dropped_bytes(), 40u);
  absl::StatusOr<Stash::Lease> lease = stash_.Acquire({ln, ex, res});
  ASSERT_TRUE(lease.ok());
  EXPECT_EQ(rebuilds_, 2);
  EXPECT_EQ(stash_.Get(ex)->as<float>()[5], 7.0f);

  // The policy dropping a tensor without a rebuild is refused at Save, naming it.
  absl::StatusOr<tensor::Buffer> b = Filled(4, 0);
  ASSERT_TRUE(b.ok());
  absl::StatusOr<StashHandle> bad =
      stash_.Save("layers.2.moe.expert_pre", 2, std::move(*b), {4}, DType::kF32, {});
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.status().message(), ::testing::HasSubstr("layers.2.moe.expert_pre"));
}

TEST_F(DropTest, RebuildErrorsLeaveTheEntryDropped) {
  RecomputeSpec failing{"fill", {}, 0};
  failing.rebuild = []() -> absl::StatusOr<tensor::Buffer> {
    return absl::ResourceExhaustedError("arena full");
  };
  const StashHandle f = SaveFilled("layers.0.ln1.out", 4, 0.0f, std::move(failing));
  ASSERT_TRUE(stash_.Drop(f).ok());
  EXPECT_EQ(stash_.Get(f).status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(stash_.Entries()[0].state, StashState::kDropped);

  const StashHandle w = SaveFilled("layers.0.ln2.out", 4, 0.0f, Spec(3, 0.0f));  // wrong size
  ASSERT_TRUE(stash_.Drop(w).ok());
  EXPECT_EQ(stash_.Get(w).status().code(), absl::StatusCode::kInternal);

  RecomputeSpec cyclic{"self", {}, 0};
  StashHandle self{2};  // the next id
  cyclic.rebuild = [this, &self]() -> absl::StatusOr<tensor::Buffer> {
    absl::StatusOr<tensor::TensorView> v = stash_.Get(self);
    if (!v.ok()) return v.status();
    return Filled(4, 0);
  };
  self = SaveFilled("layers.0.mlp.hidden", 4, 0.0f, std::move(cyclic));
  ASSERT_TRUE(stash_.Drop(self).ok());
  absl::Status s = stash_.Get(self).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal);
  EXPECT_THAT(s.message(), ::testing::HasSubstr("needs itself"));
}

TEST(MemoryPolicyTest, ParseTagsAndActions) {
  using memory::MemoryPolicy;
  using memory::SaveAction;
  EXPECT_EQ(*memory::ParseMemoryPolicy("selective"), MemoryPolicy::kSelective);
  EXPECT_EQ(*memory::ParseMemoryPolicy("full_recompute"), MemoryPolicy::kFullRecompute);
  EXPECT_EQ(*memory::ParseMemoryPolicy("none"), MemoryPolicy::kNone);
  EXPECT_EQ(memory::ParseMemoryPolicy("adaptive").status().code(),
            absl::StatusCode::kUnimplemented);
  absl::Status bad = memory::ParseMemoryPolicy("lazy").status();
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.message(), ::testing::HasSubstr("memory.policy"));
  EXPECT_EQ(memory::TensorTag("layers.12.moe.expert_hidden"), "moe.expert_hidden");
  EXPECT_EQ(memory::TensorTag("lnf.out"), "lnf.out");
  for (const char* tag : {"ln1.out", "ln2.out", "lnf.out", "mlp.hidden", "moe.expert_hidden"}) {
    EXPECT_EQ(memory::StaticSaveAction(MemoryPolicy::kNone, tag), SaveAction::kKeep);
    EXPECT_EQ(memory::StaticSaveAction(MemoryPolicy::kSelective, tag),
              SaveAction::kDropAfterForward);
    EXPECT_EQ(memory::StaticSaveAction(MemoryPolicy::kFullRecompute, tag),
              SaveAction::kDropAfterForward);
  }
  for (const char* tag : {"moe.router_probs", "moe.expert_input", "moe.combined_output"}) {
    EXPECT_EQ(memory::StaticSaveAction(MemoryPolicy::kSelective, tag), SaveAction::kKeep);
    EXPECT_EQ(memory::StaticSaveAction(MemoryPolicy::kFullRecompute, tag),
              SaveAction::kDropAfterForward);
  }
  for (const char* tag : {"moe.residual", "ln2.mean", "attn.qkv", "embedding.out"}) {
    EXPECT_EQ(memory::StaticSaveAction(MemoryPolicy::kFullRecompute, tag), SaveAction::kKeep);
  }
}

}  // namespace
}  // namespace furnace::model
