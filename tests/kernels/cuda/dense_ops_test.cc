// Embedding, LayerNorm, GEMMs (fp32 and bf16), attention, GELU and cross-entropy on the GPU
// against the CPU oracle. Gradient buffers start non-zero on both sides, so the accumulate (+=)
// contract is checked too.
#include <cmath>
#include <cstdint>
#include <vector>

#include "cuda_test_util.h"
#include "kernels/attention.h"
#include "kernels/cast.h"
#include "kernels/cross_entropy.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/cross_entropy.h"
#include "kernels/cuda/encoder.h"
#include "kernels/cuda/gelu.h"
#include "kernels/cuda/layernorm.h"
#include "kernels/cuda/matmul.h"
#include "kernels/encoder.h"
#include "kernels/gelu.h"
#include "kernels/layernorm.h"
#include "kernels/matmul.h"

namespace furnace::kernels::cuda {
namespace {

using testing::DeviceBuffer;
using testing::ExpectClose;
using testing::RandomInts;
using testing::RandomVector;

// The backward adds in the CPU kernel's order (a stable sort of the positions by token), so both
// gradients equal the CPU oracle's bit for bit, whatever the tokens: repeated ones (V small),
// long runs of one token, tokens absent from the batch.
void CheckEmbedding(int B, int T, int C, const std::vector<int32_t>& tokens, int V) {
  auto wte = RandomVector(V * C, 2), wpe = RandomVector(T * C, 3);
  auto dout = RandomVector(int64_t{B} * T * C, 4);
  auto dwte = RandomVector(V * C, 5), dwpe = RandomVector(T * C, 6);
  DeviceBuffer<int32_t> d_tokens(tokens);
  DeviceBuffer<float> d_wte(wte), d_wpe(wpe), d_out(int64_t{B} * T * C), d_dout(dout), d_dwte(dwte),
      d_dwpe(dwpe);
  DeviceBuffer<char> d_ws(EmbeddingBackwardWorkspaceBytes(B, T));
  EmbeddingForward(d_out.get(), d_tokens.get(), d_wte.get(), d_wpe.get(), B, T, C, nullptr);
  EmbeddingBackward(d_dwte.get(), d_dwpe.get(), d_dout.get(), d_tokens.get(), B, T, C, d_ws.get(),
                    nullptr);
  ASSERT_KERNELS_OK();
  std::vector<float> out(int64_t{B} * T * C);
  cpu::EmbeddingForward(out.data(), tokens.data(), wte.data(), wpe.data(), B, T, C);
  cpu::EmbeddingBackward(dwte.data(), dwpe.data(), dout.data(), tokens.data(), B, T, C);
  ExpectClose(d_out.Download(), out, 0.0f, 0.0f, "out");
  ExpectClose(d_dwte.Download(), dwte, 0.0f, 0.0f, "dwte");
  ExpectClose(d_dwpe.Download(), dwpe, 0.0f, 0.0f, "dwpe");
}

TEST(CudaKernelsTest, Embedding) {
  SKIP_WITHOUT_GPU();
  const int B = 3, T = 17, C = 40, V = 11;  // V small: tokens repeat
  CheckEmbedding(B, T, C, RandomInts(B * T, 1, 0, V), V);
}

TEST(CudaKernelsTest, EmbeddingBackwardWithLongRunsAndAbsentTokensIsTheCpusBitForBit) {
  SKIP_WITHOUT_GPU();
  {
    SCOPED_TRACE("8 x 512 tokens of 5: runs of about 800");
    CheckEmbedding(8, 512, 96, RandomInts(8 * 512, 7, 0, 5), 5);
  }
  {
    SCOPED_TRACE("one token throughout");
    CheckEmbedding(4, 256, 64, std::vector<int32_t>(4 * 256, 3), 8);
  }
  {
    SCOPED_TRACE("a vocabulary of 50,000 of which few appear");
    CheckEmbedding(2, 300, 33, RandomInts(2 * 300, 8, 0, 50'000), 50'000);
  }
  {
    // Past one tile CUB's sort runs other kernels (onesweep): a micro-batch's worth of tokens,
    // one of them 4% of all (as the commonest word of a text is).
    SCOPED_TRACE("16 x 1,024 tokens of 50,000, token 13 at every 25th position");
    std::vector<int32_t> tokens = RandomInts(16 * 1024, 9, 0, 50'000);
    for (size_t i = 0; i < tokens.size(); i += 25) tokens[i] = 13;
    CheckEmbedding(16, 1024, 64, tokens, 50'000);
  }
  {
    SCOPED_TRACE("one token");
    CheckEmbedding(1, 1, 40, {7}, 11);
  }
}

// LayerNorm forward and backward against the CPU oracle; dweight and dbias sum N rows (in another
// order than the CPU's), to within `sum_rtol` / `sum_atol`.
void CheckLayerNorm(int N, int C, float sum_rtol, float sum_atol) {
  const int64_t NC = int64_t{N} * C;
  auto inp = RandomVector(NC, 10, -2.0f, 3.0f);
  auto weight = RandomVector(C, 11), bias = RandomVector(C, 12), dout = RandomVector(NC, 13);
  auto dinp = RandomVector(NC, 14), dweight = RandomVector(C, 15), dbias = RandomVector(C, 16);
  DeviceBuffer<float> d_inp(inp), d_w(weight), d_b(bias), d_out(NC), d_mean(N), d_rstd(N),
      d_dout(dout), d_dinp(dinp), d_dw(dweight), d_db(dbias);
  LayerNormForward(d_out.get(), d_mean.get(), d_rstd.get(), d_inp.get(), d_w.get(), d_b.get(), N, C,
                   1e-5f, nullptr);
  LayerNormBackward(d_dinp.get(), d_dw.get(), d_db.get(), d_dout.get(), d_inp.get(), d_w.get(),
                    d_mean.get(), d_rstd.get(), N, C, nullptr);
  ASSERT_KERNELS_OK();
  std::vector<float> out(NC), mean(N), rstd(N);
  cpu::LayerNormForward(out.data(), mean.data(), rstd.data(), inp.data(), weight.data(),
                        bias.data(), N, C, 1e-5f);
  cpu::LayerNormBackward(dinp.data(), dweight.data(), dbias.data(), dout.data(), inp.data(),
                         weight.data(), mean.data(), rstd.data(), N, C);
  ExpectClose(d_out.Download(), out, 1e-5f, 1e-5f, "out");
  ExpectClose(d_mean.Download(), mean, 1e-5f, 1e-6f, "mean");
  ExpectClose(d_rstd.Download(), rstd, 1e-5f, 1e-6f, "rstd");
  ExpectClose(d_dinp.Download(), dinp, 1e-5f, 1e-5f, "dinp");
  ExpectClose(d_dw.Download(), dweight, sum_rtol, sum_atol, "dweight");
  ExpectClose(d_db.Download(), dbias, sum_rtol, sum_atol, "dbias");
}

TEST(CudaKernelsTest, LayerNorm) {
  SKIP_WITHOUT_GPU();
  CheckLayerNorm(37, 200, 1e-5f, 1e-5f);
}

// A GEMM's forward and backward (N, C) x (C, OC) against the CPU oracle. GEMM summation order
// differs from OpenBLAS: relative `rtol` plus a small absolute floor for entries that cancel to
// near zero.
void CheckMatmul(bool with_bias, bool with_dinp, int N = 45, int C = 70, int OC = 33,
                 float rtol = 1e-5f, float atol = 1e-5f) {
  const int64_t NC = int64_t{N} * C, NOC = int64_t{N} * OC, COC = int64_t{C} * OC;
  auto inp = RandomVector(NC, 20), weight = RandomVector(COC, 21);
  auto bias = RandomVector(OC, 22), dout = RandomVector(NOC, 23);
  auto dinp = RandomVector(NC, 24), dweight = RandomVector(COC, 25), dbias = RandomVector(OC, 26);
  CublasHandle handle;
  ASSERT_NE(handle.get(), nullptr) << TakeLastError();
  DeviceBuffer<float> d_inp(inp), d_w(weight), d_b(bias), d_out(NOC), d_dout(dout), d_dinp(dinp),
      d_dw(dweight), d_db(dbias);
  MatmulForward(d_out.get(), d_inp.get(), d_w.get(), with_bias ? d_b.get() : nullptr, N, C, OC,
                handle.get(), nullptr);
  MatmulBackward(with_dinp ? d_dinp.get() : nullptr, d_dw.get(), with_bias ? d_db.get() : nullptr,
                 d_dout.get(), d_inp.get(), d_w.get(), N, C, OC, handle.get(), nullptr);
  ASSERT_KERNELS_OK();
  std::vector<float> out(NOC);
  cpu::MatmulForward(out.data(), inp.data(), weight.data(), with_bias ? bias.data() : nullptr, N, C,
                     OC);
  cpu::MatmulBackward(with_dinp ? dinp.data() : nullptr, dweight.data(),
                      with_bias ? dbias.data() : nullptr, dout.data(), inp.data(), weight.data(), N,
                      C, OC);
  ExpectClose(d_out.Download(), out, rtol, atol, "out");
  ExpectClose(d_dinp.Download(), dinp, rtol, atol, "dinp");
  ExpectClose(d_dw.Download(), dweight, rtol, atol, "dweight");
  ExpectClose(d_db.Download(), dbias, rtol, atol, "dbias");
}

// The column reductions (LayerNorm's dweight/dbias, a GEMM's dbias) at a micro-batch of a 1B-class
// model: 8 x 2,048 rows of 2,048 columns (the tests around stay under a few hundred rows). Each
// output sums 16,384 rows in another order than the CPU, hence the looser tolerances; a wrong
// index or a missed row is off by far more. The GEMM's input is narrow (16) to keep the CPU
// oracle cheap.
TEST(CudaKernelsTest, ColumnReductionsAtModelScale) {
  SKIP_WITHOUT_GPU();
  {
    SCOPED_TRACE("LayerNorm, 16,384 x 2,048");
    CheckLayerNorm(8 * 2048, 2048, 1e-4f, 1e-3f);
  }
  {
    SCOPED_TRACE("GEMM with bias, 16,384 x 16 x 2,048");
    CheckMatmul(true, false, 8 * 2048, 16, 2048, 1e-4f, 1e-3f);
  }
}

TEST(CudaKernelsTest, MatmulWithBias) {
  SKIP_WITHOUT_GPU();
  CheckMatmul(true, true);
}

TEST(CudaKernelsTest, MatmulWithoutBiasOrDinp) {
  SKIP_WITHOUT_GPU();
  CheckMatmul(false, false);
}

TEST(CudaKernelsTest, MatmulBf16) {
  SKIP_WITHOUT_GPU();
  const int N = 64, C = 96, OC = 48;
  auto inp = RandomVector(N * C, 30), weight = RandomVector(C * OC, 31),
       bias = RandomVector(OC, 32);
  // The CPU reference runs in fp32 on the bf16-rounded inputs; the GPU rounds its output to bf16.
  std::vector<uint16_t> inp16(inp.size()), w16(weight.size()), b16(bias.size());
  cpu::CastF32ToBf16(inp16.data(), inp.data(), inp.size());
  cpu::CastF32ToBf16(w16.data(), weight.data(), weight.size());
  cpu::CastF32ToBf16(b16.data(), bias.data(), bias.size());
  cpu::CastBf16ToF32(inp.data(), inp16.data(), inp.size());
  cpu::CastBf16ToF32(weight.data(), w16.data(), weight.size());
  cpu::CastBf16ToF32(bias.data(), b16.data(), bias.size());
  CublasHandle handle;
  DeviceBuffer<uint16_t> d_inp(inp16), d_w(w16), d_b(b16), d_out(N * OC);
  MatmulForwardBf16Storage(reinterpret_cast<__nv_bfloat16*>(d_out.get()),
                           reinterpret_cast<const __nv_bfloat16*>(d_inp.get()),
                           reinterpret_cast<const __nv_bfloat16*>(d_w.get()),
                           reinterpret_cast<const __nv_bfloat16*>(d_b.get()), N, C, OC,
                           handle.get(), nullptr);
  ASSERT_KERNELS_OK();
  std::vector<float> out(N * OC), got(N * OC);
  cpu::MatmulForward(out.data(), inp.data(), weight.data(), bias.data(), N, C, OC);
  auto got16 = d_out.Download();
  cpu::CastBf16ToF32(got.data(), got16.data(), got.size());
  // One bf16 rounding of the output (2^-8 relative) plus fp32 accumulation differences.
  ExpectClose(got, out, 1.0f / 128, 1e-3f, "out");
}

TEST(CudaKernelsTest, Attention) {
  SKIP_WITHOUT_GPU();
  const int B = 2, T = 19, C = 48, NH = 4;
  auto qkv = RandomVector(B * T * 3 * C, 40, -2.0f, 2.0f);
  auto dout = RandomVector(B * T * C, 41);
  auto dqkv = RandomVector(B * T * 3 * C, 42);
  CublasHandle handle;
  DeviceBuffer<float> d_qkv(qkv), d_out(B * T * C), d_att(B * NH * T * T), d_dout(dout),
      d_dqkv(dqkv);
  AttentionForward(d_out.get(), d_att.get(), d_qkv.get(), B, T, C, NH, handle.get(), nullptr);
  // The workspace starts as NaN bytes, so a read of it before it is written shows up.
  DeviceBuffer<char> workspace(AttentionBackwardWorkspaceBytes(B, T, C, NH));
  ASSERT_EQ(cudaMemset(workspace.get(), 0xff, AttentionBackwardWorkspaceBytes(B, T, C, NH)),
            cudaSuccess);
  AttentionBackward(d_dqkv.get(), d_dout.get(), d_qkv.get(), d_att.get(), B, T, C, NH,
                    workspace.get(), handle.get(), nullptr);
  ASSERT_KERNELS_OK();
  std::vector<float> out(B * T * C), att(B * NH * T * T);
  cpu::AttentionForward(out.data(), att.data(), qkv.data(), B, T, C, NH);
  cpu::AttentionBackward(dqkv.data(), dout.data(), qkv.data(), att.data(), B, T, C, NH);
  ExpectClose(d_att.Download(), att, 1e-5f, 1e-6f, "att");
  ExpectClose(d_out.Download(), out, 1e-5f, 1e-5f, "out");
  ExpectClose(d_dqkv.Download(), dqkv, 1e-4f, 1e-5f, "dqkv");
  // The probabilities alone (the planner's rebuild of a dropped att): the forward's own calls, so
  // the device's att bit for bit.
  const std::vector<float> att_fwd = d_att.Download();
  DeviceBuffer<float> d_probs(B * NH * T * T);
  ASSERT_EQ(cudaMemset(d_probs.get(), 0xff, sizeof(float) * B * NH * T * T), cudaSuccess);
  AttentionProbs(d_probs.get(), d_qkv.get(), B, T, C, NH, handle.get(), nullptr);
  ASSERT_KERNELS_OK();
  EXPECT_EQ(d_probs.Download(), att_fwd);
}

// The RowStats pair against the CPU's: out, the (m, r) row statistics and the accumulated dqkv,
// the backward from the device's own statistics (as AttentionBackward runs from the device's
// probabilities above). row_block 0 is the automatic block (all of T at these sizes); a forced
// one splits T into several query blocks, the last partial. Workspaces start as NaN bytes.
void CheckAttentionRowStats(int B, int T, int C, int NH, int row_block) {
  SCOPED_TRACE(::testing::Message() << "B " << B << " T " << T << " C " << C << " NH " << NH
                                    << " row_block " << row_block);
  const int64_t n_qkv = int64_t{B} * T * 3 * C, n_out = int64_t{B} * T * C;
  const int64_t n_stats = int64_t{B} * NH * T * 2;
  auto qkv = RandomVector(n_qkv, 43, -2.0f, 2.0f);
  auto dout = RandomVector(n_out, 44);
  auto dqkv = RandomVector(n_qkv, 45);
  CublasHandle handle;
  DeviceBuffer<float> d_qkv(qkv), d_out(n_out), d_stats(n_stats), d_dout(dout), d_dqkv(dqkv);
  const size_t fwd_bytes = AttentionForwardRowStatsWorkspaceBytes(B, T, C, NH, row_block);
  const size_t bwd_bytes = AttentionBackwardRowStatsWorkspaceBytes(B, T, C, NH, row_block);
  DeviceBuffer<char> fwd(fwd_bytes), bwd(bwd_bytes);
  ASSERT_EQ(cudaMemset(fwd.get(), 0xff, fwd_bytes), cudaSuccess);
  ASSERT_EQ(cudaMemset(bwd.get(), 0xff, bwd_bytes), cudaSuccess);
  AttentionForwardRowStats(d_out.get(), d_stats.get(), d_qkv.get(), B, T, C, NH, fwd.get(),
                           handle.get(), nullptr, row_block);
  AttentionBackwardRowStats(d_dqkv.get(), d_dout.get(), d_qkv.get(), d_stats.get(), B, T, C, NH,
                            bwd.get(), handle.get(), nullptr, row_block);
  ASSERT_KERNELS_OK();
  std::vector<float> out(n_out), stats(n_stats);
  cpu::AttentionForwardRowStats(out.data(), stats.data(), qkv.data(), B, T, C, NH);
  cpu::AttentionBackwardRowStats(dqkv.data(), dout.data(), qkv.data(), stats.data(), B, T, C, NH);
  ExpectClose(d_stats.Download(), stats, 1e-5f, 1e-6f, "stats");
  ExpectClose(d_out.Download(), out, 1e-5f, 1e-5f, "out");
  ExpectClose(d_dqkv.Download(), dqkv, 1e-4f, 1e-5f, "dqkv");
}

TEST(CudaKernelsTest, AttentionRowStatsRowBlock) {
  // The largest multiple of 64 rows whose (NH, R, T) fp32 scratch fits in 64 MiB, in [64, T].
  EXPECT_EQ(AttentionRowStatsRowBlock(19, 4), 19);
  EXPECT_EQ(AttentionRowStatsRowBlock(1000, 3), 1000);
  EXPECT_EQ(AttentionRowStatsRowBlock(2048, 16), 512);
  EXPECT_EQ(AttentionRowStatsRowBlock(3000, 16), 320);
  EXPECT_EQ(AttentionRowStatsRowBlock(4096, 32), 128);
  EXPECT_EQ(AttentionRowStatsRowBlock(8192, 64), 64);
  // A larger block needs a larger workspace; a forced one is clamped to T.
  EXPECT_LT(AttentionBackwardRowStatsWorkspaceBytes(1, 300, 96, 3, 64),
            AttentionBackwardRowStatsWorkspaceBytes(1, 300, 96, 3));
  EXPECT_EQ(AttentionForwardRowStatsWorkspaceBytes(1, 300, 96, 3, 1000),
            AttentionForwardRowStatsWorkspaceBytes(1, 300, 96, 3));
}

TEST(CudaKernelsTest, AttentionRowStats) {
  SKIP_WITHOUT_GPU();
  CheckAttentionRowStats(2, 19, 48, 4, 0);
  CheckAttentionRowStats(2, 19, 48, 4, 7);     // blocks of 7, 7 and 5 rows
  CheckAttentionRowStats(1, 300, 96, 3, 64);   // four blocks of 64 rows and one of 44
  CheckAttentionRowStats(2, 150, 128, 2, 0);   // one block
  CheckAttentionRowStats(2, 150, 128, 2, 64);  // 64, 64, 22
}

TEST(CudaKernelsTest, Gelu) {
  SKIP_WITHOUT_GPU();
  const int64_t n = 10007;
  auto inp = RandomVector(n, 50, -5.0f, 5.0f), dout = RandomVector(n, 51),
       dinp = RandomVector(n, 52);
  DeviceBuffer<float> d_inp(inp), d_out(n), d_dout(dout), d_dinp(dinp);
  GeluForward(d_out.get(), d_inp.get(), n, nullptr);
  GeluBackward(d_dinp.get(), d_inp.get(), d_dout.get(), n, nullptr);
  ASSERT_KERNELS_OK();
  std::vector<float> out(n);
  cpu::GeluForward(out.data(), inp.data(), n);
  cpu::GeluBackward(dinp.data(), inp.data(), dout.data(), n);
  ExpectClose(d_out.Download(), out, 1e-5f, 1e-6f, "out");
  ExpectClose(d_dinp.Download(), dinp, 1e-5f, 1e-6f, "dinp");
}

TEST(CudaKernelsTest, CrossEntropy) {
  SKIP_WITHOUT_GPU();
  const int N = 23, V = 1000;
  auto logits = RandomVector(N * V, 60, -4.0f, 4.0f);
  auto targets = RandomInts(N, 61, 0, V);
  auto dlogits = RandomVector(N * V, 62);
  const float dloss = 1.0f / N;
  DeviceBuffer<float> d_logits(logits), d_losses(N), d_probs(N * V), d_dlogits(dlogits);
  DeviceBuffer<int32_t> d_targets(targets);
  CrossEntropyForward(d_losses.get(), d_probs.get(), d_logits.get(), d_targets.get(), N, V,
                      nullptr);
  CrossEntropyBackward(d_dlogits.get(), d_probs.get(), d_targets.get(), dloss, N, V, nullptr);
  ASSERT_KERNELS_OK();
  std::vector<float> losses(N), probs(N * V);
  cpu::CrossEntropyForward(losses.data(), probs.data(), logits.data(), targets.data(), N, V);
  cpu::CrossEntropyBackward(dlogits.data(), probs.data(), targets.data(), dloss, N, V);
  ExpectClose(d_losses.Download(), losses, 1e-5f, 1e-6f, "losses");
  ExpectClose(d_probs.Download(), probs, 1e-5f, 1e-9f, "probs");
  ExpectClose(d_dlogits.Download(), dlogits, 1e-5f, 1e-7f, "dlogits");
}

}  // namespace
}  // namespace furnace::kernels::cuda
