// Router (softmax, top-k with ties, aux loss), dispatch permutation with capacity drops, and the
// grouped expert GEMMs (with an empty expert) on the GPU against the CPU oracle.
#include <cstdint>
#include <vector>

#include "cuda_test_util.h"
#include "kernels/cuda/matmul.h"
#include "kernels/cuda/permute.h"
#include "kernels/cuda/router.h"
#include "kernels/matmul.h"
#include "kernels/permute.h"
#include "kernels/router.h"

namespace furnace::kernels::cuda {
namespace {

using testing::DeviceBuffer;
using testing::ExpectClose;
using testing::RandomInts;
using testing::RandomVector;

TEST(CudaKernelsTest, Softmax) {
  SKIP_WITHOUT_GPU();
  const int N = 50, E = 70;  // E > 32: a warp loops over the row
  auto logits = RandomVector(N * E, 70, -5.0f, 5.0f), dprobs = RandomVector(N * E, 71),
       dlogits = RandomVector(N * E, 72);
  DeviceBuffer<float> d_logits(logits), d_probs(N * E), d_dprobs(dprobs), d_dlogits(dlogits);
  SoftmaxForward(d_probs.get(), d_logits.get(), N, E, nullptr);
  SoftmaxBackward(d_dlogits.get(), d_dprobs.get(), d_probs.get(), N, E, nullptr);
  ASSERT_KERNELS_OK();
  std::vector<float> probs(N * E);
  cpu::SoftmaxForward(probs.data(), logits.data(), N, E);
  cpu::SoftmaxBackward(dlogits.data(), dprobs.data(), probs.data(), N, E);
  ExpectClose(d_probs.Download(), probs, 1e-5f, 1e-8f, "probs");
  ExpectClose(d_dlogits.Download(), dlogits, 1e-5f, 1e-6f, "dlogits");
}

void CheckTopK(int k, bool normalize) {
  const int N = 300, E = 8;
  auto probs = RandomVector(N * E, 80 + k, 0.0f, 1.0f);
  // Exact ties in some rows: the lower expert index must win.
  for (int n = 0; n < N; n += 7) {
    probs[n * E + 2] = probs[n * E + 5] = probs[n * E + 6] = 2.0f;
  }
  auto dgates = RandomVector(N * k, 90), dprobs = RandomVector(N * E, 91);
  DeviceBuffer<float> d_probs(probs), d_gates(N * k), d_dgates(dgates), d_dprobs(dprobs);
  DeviceBuffer<int32_t> d_indices(N * k);
  TopKForward(d_indices.get(), d_gates.get(), d_probs.get(), N, E, k, normalize, nullptr);
  TopKBackward(d_dprobs.get(), d_dgates.get(), d_probs.get(), d_indices.get(), N, E, k, normalize,
               nullptr);
  ASSERT_KERNELS_OK();
  std::vector<int32_t> indices(N * k);
  std::vector<float> gates(N * k);
  cpu::TopKForward(indices.data(), gates.data(), probs.data(), N, E, k, normalize);
  cpu::TopKBackward(dprobs.data(), dgates.data(), probs.data(), indices.data(), N, E, k, normalize);
  EXPECT_EQ(d_indices.Download(), indices);
  ExpectClose(d_gates.Download(), gates, 1e-6f, 0.0f, "gates");
  ExpectClose(d_dprobs.Download(), dprobs, 1e-5f, 1e-6f, "dprobs");
}

TEST(CudaKernelsTest, TopKNormalized) {
  SKIP_WITHOUT_GPU();
  CheckTopK(2, true);
  CheckTopK(3, true);
}

TEST(CudaKernelsTest, TopKRaw) {
  SKIP_WITHOUT_GPU();
  CheckTopK(1, false);
  CheckTopK(2, false);
}

TEST(CudaKernelsTest, AuxLoss) {
  SKIP_WITHOUT_GPU();
  const int N = 400, E = 16, k = 2;
  auto logits = RandomVector(N * E, 100, -3.0f, 3.0f);
  std::vector<float> probs(N * E);
  cpu::SoftmaxForward(probs.data(), logits.data(), N, E);
  std::vector<int32_t> indices(N * k);
  std::vector<float> gates(N * k);
  cpu::TopKForward(indices.data(), gates.data(), probs.data(), N, E, k, true);
  auto dprobs = RandomVector(N * E, 101);
  const float alpha = 0.01f, daux = 0.7f;
  DeviceBuffer<float> d_probs(probs), d_aux(1), d_terms(E), d_dprobs(dprobs);
  DeviceBuffer<int32_t> d_indices(indices);
  AuxLossForward(d_aux.get(), d_terms.get(), d_probs.get(), d_indices.get(), N, E, k, alpha,
                 nullptr);
  AuxLossBackward(d_dprobs.get(), d_indices.get(), N, E, k, alpha, daux, nullptr);
  ASSERT_KERNELS_OK();
  float aux = cpu::AuxLossForward(probs.data(), indices.data(), N, E, k, alpha);
  cpu::AuxLossBackward(dprobs.data(), indices.data(), N, E, k, alpha, daux);
  const std::vector<float> first = d_aux.Download();
  ExpectClose(first, {aux}, 1e-5f, 0.0f, "aux");  // block sums, not the CPU's order
  ExpectClose(d_dprobs.Download(), dprobs, 1e-5f, 1e-7f, "dprobs");
  // Deterministic: the terms are added in expert order, so every run gives the same bits.
  for (int run = 0; run < 20; ++run) {
    AuxLossForward(d_aux.get(), d_terms.get(), d_probs.get(), d_indices.get(), N, E, k, alpha,
                   nullptr);
    ASSERT_KERNELS_OK();
    ASSERT_EQ(d_aux.Download(), first) << "run " << run;
  }
}

// A DispatchPlan's arrays copied to the device, as a caller would.
struct PlanOnDevice {
  explicit PlanOnDevice(const cpu::DispatchPlan& plan)
      : slot(plan.slot), token(plan.token), offsets(plan.offsets) {
    view.N = plan.N;
    view.E = plan.E;
    view.k = plan.k;
    view.rows = plan.rows();
    view.slot = slot.get();
    view.token = token.get();
    view.offsets = offsets.get();
  }
  DeviceBuffer<int64_t> slot;
  DeviceBuffer<int32_t> token;
  DeviceBuffer<int64_t> offsets;
  DeviceDispatchPlan view;
};

void CheckPermute(double capacity_factor) {
  const int N = 64, E = 6, k = 2, C = 300;  // C > block size: threads loop over the row
  // Skewed routing so that a capacity drops tokens; the two choices of a token are distinct.
  auto first = RandomInts(N, 110, 0, 2);
  auto second = RandomInts(N, 111, 1, E);
  std::vector<int32_t> indices(N * k);
  for (int n = 0; n < N; ++n) {
    indices[n * k] = first[n];
    indices[n * k + 1] = second[n] == first[n] ? (first[n] + 2) % E : second[n];
  }
  cpu::DispatchPlan plan = cpu::MakeDispatchPlan(indices.data(), N, E, k, capacity_factor);
  const int64_t S = plan.rows();
  auto inp = RandomVector(N * C, 112), gates = RandomVector(N * k, 113, 0.0f, 1.0f);
  auto expert_out = RandomVector(S * C, 114), dout = RandomVector(N * C, 115);
  auto dperm = RandomVector(S * C, 116);
  auto dinp = RandomVector(N * C, 117), dexpert = RandomVector(S * C, 118),
       dgates = RandomVector(N * k, 119);
  PlanOnDevice dplan(plan);
  DeviceBuffer<float> d_inp(inp), d_perm(S * C), d_gates(gates), d_expert(expert_out), d_out(N * C),
      d_dout(dout), d_dperm(dperm), d_dinp(dinp), d_dexpert(dexpert), d_dgates(dgates);
  PermuteForward(d_perm.get(), d_inp.get(), dplan.view, C, nullptr);
  PermuteBackward(d_dinp.get(), d_dperm.get(), dplan.view, C, nullptr);
  UnpermuteForward(d_out.get(), d_expert.get(), d_gates.get(), dplan.view, C, nullptr);
  UnpermuteBackward(d_dexpert.get(), d_dgates.get(), d_dout.get(), d_expert.get(), d_gates.get(),
                    dplan.view, C, nullptr);
  ASSERT_KERNELS_OK();
  std::vector<float> perm(S * C), out(N * C);
  cpu::PermuteForward(perm.data(), inp.data(), plan, C);
  cpu::PermuteBackward(dinp.data(), dperm.data(), plan, C);
  cpu::UnpermuteForward(out.data(), expert_out.data(), gates.data(), plan, C);
  cpu::UnpermuteBackward(dexpert.data(), dgates.data(), dout.data(), expert_out.data(),
                         gates.data(), plan, C);
  ExpectClose(d_perm.Download(), perm, 0.0f, 0.0f, "permuted");
  ExpectClose(d_dinp.Download(), dinp, 1e-5f, 1e-6f, "dinp");  // choice vs row order
  ExpectClose(d_out.Download(), out, 1e-6f, 1e-7f, "out");
  ExpectClose(d_dexpert.Download(), dexpert, 1e-6f, 1e-7f, "dexpert_out");
  ExpectClose(d_dgates.Download(), dgates, 1e-5f, 1e-5f, "dgates");
}

TEST(CudaKernelsTest, PermuteDropless) {
  SKIP_WITHOUT_GPU();
  CheckPermute(0.0);
}

TEST(CudaKernelsTest, PermuteWithCapacityDrops) {
  SKIP_WITHOUT_GPU();
  CheckPermute(1.0);
}

TEST(CudaKernelsTest, GroupedMatmul) {
  SKIP_WITHOUT_GPU();
  const int E = 4, C = 40, OC = 24;
  std::vector<int64_t> offsets = {0, 13, 13, 30, 31};  // expert 1 gets no rows
  const int64_t S = offsets.back();
  auto inp = RandomVector(S * C, 120), weight = RandomVector(E * C * OC, 121),
       bias = RandomVector(E * OC, 122), dout = RandomVector(S * OC, 123);
  auto dinp = RandomVector(S * C, 124), dweight = RandomVector(E * C * OC, 125),
       dbias = RandomVector(E * OC, 126);
  CublasHandle handle;
  DeviceBuffer<float> d_inp(inp), d_w(weight), d_b(bias), d_out(S * OC), d_dout(dout), d_dinp(dinp),
      d_dw(dweight), d_db(dbias);
  GroupedMatmulForward(d_out.get(), d_inp.get(), d_w.get(), d_b.get(), offsets.data(), E, C, OC,
                       handle.get(), nullptr);
  GroupedMatmulBackward(d_dinp.get(), d_dw.get(), d_db.get(), d_dout.get(), d_inp.get(), d_w.get(),
                        offsets.data(), E, C, OC, handle.get(), nullptr);
  ASSERT_KERNELS_OK();
  std::vector<float> out(S * OC);
  cpu::GroupedMatmulForward(out.data(), inp.data(), weight.data(), bias.data(), offsets.data(), E,
                            C, OC);
  cpu::GroupedMatmulBackward(dinp.data(), dweight.data(), dbias.data(), dout.data(), inp.data(),
                             weight.data(), offsets.data(), E, C, OC);
  ExpectClose(d_out.Download(), out, 1e-5f, 1e-5f, "out");
  ExpectClose(d_dinp.Download(), dinp, 1e-5f, 1e-5f, "dinp");
  ExpectClose(d_dw.Download(), dweight, 1e-5f, 1e-5f, "dweight");
  ExpectClose(d_db.Download(), dbias, 1e-5f, 1e-5f, "dbias");
}

}  // namespace
}  // namespace furnace::kernels::cuda
