// The CUDA elementwise ops (bit-identical to the CPU: same adds in the same order; the transpose
// moves bits) and the bf16-operand GEMMs and attention of matmul_bf16.h / attention_bf16.h
// against the CPU bf16 oracle (same roundings; fp32 sums in another order: ||d|| / ||ref|| under
// 1e-5 for the GEMMs, 1e-4 for attention, whose device probabilities differ from the CPU's in the
// last bits so that a rare element rounds to the neighbouring bf16 value). Workspaces start as
// NaN bytes, so one read before it is written shows up. gpu label.
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "cuda_test_util.h"
#include "kernels/attention.h"
#include "kernels/attention_bf16.h"
#include "kernels/cuda/attention_bf16.h"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/matmul_bf16.h"
#include "kernels/elementwise.h"
#include "kernels/matmul_bf16.h"

namespace furnace::kernels::cuda {
namespace {

using testing::DeviceBuffer;
using testing::ExpectClose;
using testing::RandomVector;

double RelErr(const std::vector<float>& got, const std::vector<float>& want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (!std::isfinite(got[i])) return std::numeric_limits<double>::infinity();
    num += (double{got[i]} - want[i]) * (double{got[i]} - want[i]);
    den += double{want[i]} * want[i];
  }
  return std::sqrt(num / den);
}

// A workspace of `bytes` filled with 0xFF (NaN as fp32 and as bf16).
class Workspace {
 public:
  explicit Workspace(size_t bytes) : buffer_(bytes == 0 ? 1 : bytes) {
    EXPECT_EQ(cudaMemset(buffer_.get(), 0xff, buffer_.size()), cudaSuccess);
  }
  void* get() const { return buffer_.get(); }

 private:
  DeviceBuffer<char> buffer_;
};

TEST(CudaKernelsTest, ElementwiseOpsAreBitIdentical) {
  SKIP_WITHOUT_GPU();
  for (auto [N, C] : {std::pair{37, 65}, std::pair{1024, 2048}}) {
    const int64_t n = int64_t{N} * C;
    auto out = RandomVector(n, 1), x = RandomVector(n, 2), bias = RandomVector(C, 3);
    DeviceBuffer<float> d_a(out), d_b(out), d_c(out), d_x(x), d_bias(bias), d_t(n);
    AddInPlace(d_a.get(), d_x.get(), n, nullptr);
    BiasResidual(d_b.get(), d_bias.get(), d_x.get(), N, C, nullptr);
    AddRow(d_c.get(), d_bias.get(), N, C, nullptr);
    Transpose(d_t.get(), d_x.get(), N, C, nullptr);
    ASSERT_KERNELS_OK();
    std::vector<float> a = out, b = out, c = out, t(n);
    cpu::AddInPlace(a.data(), x.data(), n);
    cpu::BiasResidual(b.data(), bias.data(), x.data(), N, C);
    cpu::AddRow(c.data(), bias.data(), N, C);
    cpu::Transpose(t.data(), x.data(), N, C);
    EXPECT_EQ(d_a.Download(), a);
    EXPECT_EQ(d_b.Download(), b);
    EXPECT_EQ(d_c.Download(), c);
    EXPECT_EQ(d_t.Download(), t);
  }
}

TEST(CudaKernelsTest, MatmulBf16OperandsMatchTheOracle) {
  SKIP_WITHOUT_GPU();
  CublasHandle handle;
  const int N = 96, C = 200, OC = 72;
  auto inp = RandomVector(N * C, 10), w = RandomVector(C * OC, 11), bias = RandomVector(OC, 12);
  auto dout = RandomVector(N * OC, 13), dinp = RandomVector(N * C, 14),
       dw = RandomVector(C * OC, 15), db = RandomVector(OC, 16);
  DeviceBuffer<float> d_inp(inp), d_w(w), d_bias(bias), d_out(N * OC), d_dout(dout), d_dinp(dinp),
      d_dw(dw), d_db(db);
  Workspace fwd(MatmulForwardBf16WorkspaceBytes(N, C, OC));
  Workspace bwd(MatmulBackwardBf16WorkspaceBytes(N, C, OC, true));
  MatmulForwardBf16(d_out.get(), d_inp.get(), d_w.get(), d_bias.get(), N, C, OC, fwd.get(),
                    handle.get(), nullptr);
  MatmulBackwardBf16(d_dinp.get(), d_dw.get(), d_db.get(), d_dout.get(), d_inp.get(), d_w.get(), N,
                     C, OC, bwd.get(), handle.get(), nullptr);
  ASSERT_KERNELS_OK();
  std::vector<float> out(N * OC);
  cpu::MatmulForwardBf16(out.data(), inp.data(), w.data(), bias.data(), N, C, OC);
  cpu::MatmulBackwardBf16(dinp.data(), dw.data(), db.data(), dout.data(), inp.data(), w.data(), N,
                          C, OC);
  EXPECT_LT(RelErr(d_out.Download(), out), 1e-5);
  EXPECT_LT(RelErr(d_dinp.Download(), dinp), 1e-5);
  EXPECT_LT(RelErr(d_dw.Download(), dw), 1e-5);
  ExpectClose(d_db.Download(), db, 1e-5f, 1e-5f, "dbias");

  // Grouped, with an empty group and no dinp.
  const int E = 3;
  const std::vector<int64_t> offsets = {0, 40, 40, N};
  auto gw = RandomVector(E * C * OC, 17), gdw = RandomVector(E * C * OC, 18);
  DeviceBuffer<float> d_gw(gw), d_gout(N * OC), d_gdw(gdw);
  Workspace gf(GroupedMatmulForwardBf16WorkspaceBytes(N, E, C, OC));
  Workspace gb(GroupedMatmulBackwardBf16WorkspaceBytes(N, E, C, OC, false));
  GroupedMatmulForwardBf16(d_gout.get(), d_inp.get(), d_gw.get(), nullptr, offsets.data(), E, C, OC,
                           gf.get(), handle.get(), nullptr);
  GroupedMatmulBackwardBf16(nullptr, d_gdw.get(), nullptr, d_dout.get(), d_inp.get(), d_gw.get(),
                            offsets.data(), E, C, OC, gb.get(), handle.get(), nullptr);
  ASSERT_KERNELS_OK();
  std::vector<float> gout(N * OC);
  cpu::GroupedMatmulForwardBf16(gout.data(), inp.data(), gw.data(), nullptr, offsets.data(), E, C,
                                OC);
  cpu::GroupedMatmulBackwardBf16(nullptr, gdw.data(), nullptr, dout.data(), inp.data(), gw.data(),
                                 offsets.data(), E, C, OC);
  EXPECT_LT(RelErr(d_gout.Download(), gout), 1e-5);
  EXPECT_LT(RelErr(d_gdw.Download(), gdw), 1e-5);
}

TEST(CudaKernelsTest, AttentionBf16MatchesTheOracle) {
  SKIP_WITHOUT_GPU();
  CublasHandle handle;
  const int B = 2, T = 150, C = 128, NH = 2;
  auto qkv = RandomVector(B * T * 3 * C, 20, -2.0f, 2.0f), dout = RandomVector(B * T * C, 21),
       dqkv = RandomVector(B * T * 3 * C, 22);
  std::vector<float> out(B * T * C), att(B * NH * T * T);
  cpu::AttentionForwardBf16(out.data(), att.data(), qkv.data(), B, T, C, NH);
  DeviceBuffer<float> d_qkv(qkv), d_out(B * T * C), d_att(B * NH * T * T), d_dout(dout),
      d_dqkv(dqkv), d_att_cpu(att);
  Workspace fwd(AttentionForwardBf16WorkspaceBytes(B, T, C, NH));
  Workspace bwd(AttentionBackwardBf16WorkspaceBytes(B, T, C, NH));
  AttentionForwardBf16(d_out.get(), d_att.get(), d_qkv.get(), B, T, C, NH, fwd.get(), handle.get(),
                       nullptr);
  // The backward from the CPU's probabilities: identical inputs on both sides.
  AttentionBackwardBf16(d_dqkv.get(), d_dout.get(), d_qkv.get(), d_att_cpu.get(), B, T, C, NH,
                        bwd.get(), handle.get(), nullptr);
  ASSERT_KERNELS_OK();
  cpu::AttentionBackwardBf16(dqkv.data(), dout.data(), qkv.data(), att.data(), B, T, C, NH);
  EXPECT_LT(RelErr(d_att.Download(), att), 1e-5);
  EXPECT_LT(RelErr(d_out.Download(), out), 1e-4);
  EXPECT_LT(RelErr(d_dqkv.Download(), dqkv), 1e-4);
  // The probabilities alone: the device forward's att bit for bit (the same casts and calls).
  const std::vector<float> att_fwd = d_att.Download();
  DeviceBuffer<float> d_probs(B * NH * T * T);
  ASSERT_EQ(cudaMemset(d_probs.get(), 0xff, sizeof(float) * B * NH * T * T), cudaSuccess);
  Workspace probs_ws(AttentionProbsBf16WorkspaceBytes(B, T, C, NH));
  AttentionProbsBf16(d_probs.get(), d_qkv.get(), B, T, C, NH, probs_ws.get(), handle.get(),
                     nullptr);
  ASSERT_KERNELS_OK();
  EXPECT_EQ(d_probs.Download(), att_fwd);
}

// The bf16 RowStats pair against the CPU bf16 oracle, in one query block and in forced blocks of
// 64 rows (64, 64 and a partial 22); the backward from the CPU's statistics (identical inputs).
TEST(CudaKernelsTest, AttentionRowStatsBf16MatchesTheOracle) {
  SKIP_WITHOUT_GPU();
  CublasHandle handle;
  const int B = 2, T = 150, C = 128, NH = 2;
  const int64_t n_qkv = int64_t{B} * T * 3 * C, n_out = int64_t{B} * T * C;
  const int64_t n_stats = int64_t{B} * NH * T * 2;
  auto qkv = RandomVector(n_qkv, 23, -2.0f, 2.0f), dout = RandomVector(n_out, 24),
       dqkv0 = RandomVector(n_qkv, 25);
  std::vector<float> out(n_out), stats(n_stats), dqkv = dqkv0;
  cpu::AttentionForwardRowStatsBf16(out.data(), stats.data(), qkv.data(), B, T, C, NH);
  cpu::AttentionBackwardRowStatsBf16(dqkv.data(), dout.data(), qkv.data(), stats.data(), B, T, C,
                                     NH);
  for (int row_block : {0, 64}) {
    SCOPED_TRACE(row_block);
    DeviceBuffer<float> d_qkv(qkv), d_out(n_out), d_stats(n_stats), d_dout(dout), d_dqkv(dqkv0),
        d_stats_cpu(stats);
    Workspace fwd(AttentionForwardRowStatsBf16WorkspaceBytes(B, T, C, NH, row_block));
    Workspace bwd(AttentionBackwardRowStatsBf16WorkspaceBytes(B, T, C, NH, row_block));
    AttentionForwardRowStatsBf16(d_out.get(), d_stats.get(), d_qkv.get(), B, T, C, NH, fwd.get(),
                                 handle.get(), nullptr, row_block);
    AttentionBackwardRowStatsBf16(d_dqkv.get(), d_dout.get(), d_qkv.get(), d_stats_cpu.get(), B, T,
                                  C, NH, bwd.get(), handle.get(), nullptr, row_block);
    ASSERT_KERNELS_OK();
    EXPECT_LT(RelErr(d_stats.Download(), stats), 1e-5);
    EXPECT_LT(RelErr(d_out.Download(), out), 1e-4);
    EXPECT_LT(RelErr(d_dqkv.Download(), dqkv), 1e-4);
  }
}

}  // namespace
}  // namespace furnace::kernels::cuda
