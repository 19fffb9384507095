// The model against PyTorch: tests/reference/golden_tiny{,_capacity}.safetensors hold a PyTorch
// re-implementation's inputs, parameters (MODEL.md names, F32), logits, mean CE loss, aux loss and
// d(loss + aux_loss)/d param for every parameter, with the config in "__metadata__". We load the
// parameters, run ForwardBackward with ce_scale = 1 / (B T) and aux_scale = 1, and compare.
// Tolerances (fp32 both sides):
//   loss, aux_loss: relative 1e-5 (plus 1e-7 absolute for a tiny aux);
//   logits:         |ours - ref| <= 1e-5 * (|ref| + max |ref logits|);
//   grads:          |ours - ref| <= 1e-4 * (|ref| + max |ref grad of that parameter|) + 1e-8.
// A missing file fails the test (the files are committed).
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "gtest/gtest.h"
#include "runtime/model/gpt_moe.h"
#include "safetensors.h"

namespace furnace::model {
namespace {

using furnace::testing::SafetensorsFile;

absl::StatusOr<int> MetaInt(const SafetensorsFile& f, const std::string& key) {
  absl::StatusOr<std::string> s = f.Meta(key);
  if (!s.ok()) return s.status();
  int v = 0;
  if (!absl::SimpleAtoi(*s, &v)) return absl::InvalidArgumentError(key + " = " + *s);
  return v;
}

absl::StatusOr<double> MetaDouble(const SafetensorsFile& f, const std::string& key) {
  absl::StatusOr<std::string> s = f.Meta(key);
  if (!s.ok()) return s.status();
  double v = 0;
  if (!absl::SimpleAtod(*s, &v)) return absl::InvalidArgumentError(key + " = " + *s);
  return v;
}

double MaxAbs(const std::vector<float>& v) {
  double m = 0;
  for (float x : v) m = std::max(m, static_cast<double>(std::abs(x)));
  return m;
}

class GoldenTest : public ::testing::TestWithParam<std::string> {};

TEST_P(GoldenTest, MatchesPyTorch) {
  const std::string path = std::string(FURNACE_REFERENCE_DIR) + "/" + GetParam();
  // The golden files are committed: a missing one is a broken checkout, not a reason to skip.
  ASSERT_TRUE(std::filesystem::exists(path))
      << path << " is missing; it is committed, and /usr/bin/python3 "
      << "tests/reference/make_golden.py regenerates it (tests/reference/README.md)";
  absl::StatusOr<SafetensorsFile> file = SafetensorsFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  const SafetensorsFile& f = *file;

  ModelConfig c;
  int B = 0;
  struct IntField {
    const char* key;
    int* field;
  };
  for (const IntField& kv :
       {IntField{"vocab", &c.vocab}, IntField{"seq_len", &c.seq_len},
        IntField{"d_model", &c.d_model}, IntField{"heads", &c.heads}, IntField{"layers", &c.layers},
        IntField{"moe_every", &c.moe_every}, IntField{"dense_ffn", &c.dense_ffn},
        IntField{"experts", &c.experts}, IntField{"top_k", &c.top_k},
        IntField{"expert_ffn", &c.expert_ffn}, IntField{"batch", &B}}) {
    absl::StatusOr<int> v = MetaInt(f, kv.key);
    ASSERT_TRUE(v.ok()) << v.status();
    *kv.field = *v;
  }
  absl::StatusOr<double> cf = MetaDouble(f, "capacity_factor");
  absl::StatusOr<double> alpha = MetaDouble(f, "aux_alpha");
  absl::StatusOr<std::string> norm = f.Meta("normalize_topk");
  ASSERT_TRUE(cf.ok() && alpha.ok() && norm.ok());
  c.capacity_factor = *cf;
  c.aux_alpha = *alpha;
  c.normalize_topk = *norm == "true" || *norm == "True" || *norm == "1";

  std::unique_ptr<device::Device> device = device::CreateCpuDevice();
  tensor::DeviceArena arena(*device, 0);
  absl::StatusOr<std::unique_ptr<GptMoe>> made = GptMoe::Create(c, 0, *device, arena);
  ASSERT_TRUE(made.ok()) << made.status();
  GptMoe& m = **made;

  for (const train::ParamInfo& p : m.params()) {
    std::vector<int64_t> shape;
    absl::StatusOr<std::vector<float>> v = f.F32(p.name, &shape);
    ASSERT_TRUE(v.ok()) << v.status();
    ASSERT_EQ(shape, p.shape) << p.name;
    std::copy(v->begin(), v->end(), m.param_data() + p.offset);
  }
  absl::StatusOr<std::vector<int32_t>> in = f.I32("inputs");
  absl::StatusOr<std::vector<int32_t>> tg = f.I32("targets");
  ASSERT_TRUE(in.ok() && tg.ok());
  ASSERT_EQ(static_cast<int>(in->size()), B * c.seq_len);

  const int N = B * c.seq_len;
  m.ZeroGrad();
  m.set_capture_logits(true);
  absl::StatusOr<train::MicroBatchResult> r =
      m.ForwardBackward(in->data(), tg->data(), B, 1.0 / N, 1.0);
  ASSERT_TRUE(r.ok()) << r.status();

  absl::StatusOr<std::vector<float>> loss = f.F32("loss");
  absl::StatusOr<std::vector<float>> aux = f.F32("aux_loss");
  ASSERT_TRUE(loss.ok() && aux.ok());
  EXPECT_NEAR(r->loss, (*loss)[0], 1e-5 * std::abs((*loss)[0])) << "loss";
  EXPECT_NEAR(r->aux_loss, (*aux)[0], 1e-5 * std::abs((*aux)[0]) + 1e-7) << "aux_loss";

  absl::StatusOr<std::vector<float>> logits = f.F32("logits");
  ASSERT_TRUE(logits.ok());
  ASSERT_EQ(m.last_logits().size(), logits->size());
  const double lscale = MaxAbs(*logits);
  int bad_logits = 0;
  for (size_t i = 0; i < logits->size(); ++i) {
    const double ref = (*logits)[i], ours = m.last_logits()[i];
    if (std::abs(ours - ref) > 1e-5 * (std::abs(ref) + lscale) && ++bad_logits <= 5) {
      ADD_FAILURE() << "logits[" << i << "] " << ours << " vs " << ref;
    }
  }
  EXPECT_EQ(bad_logits, 0);

  for (const train::ParamInfo& p : m.params()) {
    absl::StatusOr<std::vector<float>> g = f.F32("grad." + p.name);
    ASSERT_TRUE(g.ok()) << g.status();
    const double scale = MaxAbs(*g);
    int bad = 0;
    for (int64_t i = 0; i < p.numel(); ++i) {
      const double ref = (*g)[i], ours = m.grad_data()[p.offset + i];
      if (std::abs(ours - ref) > 1e-4 * (std::abs(ref) + scale) + 1e-8 && ++bad <= 3) {
        ADD_FAILURE() << "grad." << p.name << "[" << i << "] " << ours << " vs " << ref
                      << " (max |ref| " << scale << ")";
      }
    }
    EXPECT_EQ(bad, 0) << "grad." << p.name;
  }
  std::printf("%s: loss %.7f (ref %.7f), aux %.8f (ref %.8f), dropped %lld\n", GetParam().c_str(),
              r->loss, (*loss)[0], r->aux_loss, (*aux)[0], static_cast<long long>(r->dropped));
}

INSTANTIATE_TEST_SUITE_P(Reference, GoldenTest,
                         ::testing::Values("golden_tiny.safetensors",
                                           "golden_tiny_capacity.safetensors"));

}  // namespace
}  // namespace furnace::model
