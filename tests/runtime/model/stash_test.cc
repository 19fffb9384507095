#include "runtime/model/stash.h"

#include <memory>

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

}  // namespace
}  // namespace furnace::model
