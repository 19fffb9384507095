// The parallel layout of a job is refused before anything starts when the runtime could not build
// it (runtime/topology): each message names the file position, the field, the value and what is
// allowed. Layouts the runtime accepts (uneven pipeline stages, an empty order) pass.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "controller/spec/job_spec.h"
#include "tests/controller/spec/refusal_case.h"

namespace furnace::spec {
namespace {

using LayoutCase = testing_util::RefusalCase;

// Lines 1-2; a case's own lines start at 3.
std::string Train(const std::string& body) { return "name: j\nkind: train\n" + body; }

std::vector<LayoutCase> Cases() {
  return {
      {"ep_esp_not_dividing_dp_tp",
       Train("parallel:\n  dp: 2\n  tp: 2\n  ep: 3\nmoe:\n  experts: 6\n"),
       {"job.yaml:6:7: parallel.ep: inconsistent sizes: ep * esp must divide dp * tp (got ep * "
        "esp = 3 * 1 = 3, dp * tp = 2 * 2 = 4; allowed: ep * esp in {1, 2, 4})"}},
      {"ep_times_esp_above_dp_tp",
       Train("parallel:\n  dp: 4\n  ep: 2\n  esp: 4\n"),
       {"job.yaml:5:7: parallel.ep: inconsistent sizes: ep * esp must divide dp * tp (got ep * "
        "esp = 2 * 4 = 8, dp * tp = 4 * 1 = 4; allowed: ep * esp in {1, 2, 4})"}},
      {"esp_alone_not_dividing",
       Train("parallel:\n  tp: 2\n  esp: 4\n"),
       {"job.yaml:5:8: parallel.esp: inconsistent sizes: ep * esp must divide dp * tp (got ep * "
        "esp = 1 * 4 = 4, dp * tp = 1 * 2 = 2; allowed: ep * esp in {1, 2})"}},
      {"s1_tokens_not_dividing_tp",
       Train("model:\n  seq_len: 6\nparallel:\n  tp: 4\nmoe:\n  schedule: s1\n"),
       {"job.yaml:8:13: moe.schedule: s1 splits a micro-batch's tokens over parallel.tp (= 4), "
        "but parallel.micro_batch * model.seq_len = 1 * 6 = 6 does not divide by it (got 's1'; "
        "allowed: s2, auto or deepspeed, or a micro_batch * seq_len divisible by tp = 4)"}},
      {"s1_tokens_not_dividing_tp_with_micro_batch",
       Train("model: {seq_len: 5}\nparallel: {tp: 2, micro_batch: 3}\nmoe: {schedule: s1}\n"),
       {"moe.schedule: s1 splits a micro-batch's tokens over parallel.tp (= 2)",
        "= 3 * 5 = 15 does not divide by it"}},
      {"order_missing_an_axis",
       Train("parallel:\n  order: dp-tp\n"),
       {"job.yaml:4:10: parallel.order: must name tp, dp and pp once each, joined by '-'",
        "(got 'dp-tp'; allowed: tp-dp-pp, tp-pp-dp, dp-tp-pp, dp-pp-tp, pp-tp-dp, pp-dp-tp, or "
        "empty for the default tp-dp-pp)"}},
      {"order_extra_axis",
       Train("parallel:\n  order: tp-dp-pp-ep\n"),
       {"job.yaml:4:10: parallel.order: must name tp, dp and pp once each", "got 'tp-dp-pp-ep'",
        "allowed: tp-dp-pp,"}},
      {"order_wrong_separator",
       Train("parallel:\n  order: tp,dp,pp\n"),
       {"job.yaml:4:10: parallel.order: must name tp, dp and pp once each", "got 'tp,dp,pp'"}},
      {"order_upper_case",
       Train("parallel:\n  order: TP-DP-PP\n"),
       {"job.yaml:4:10: parallel.order: must name tp, dp and pp once each", "got 'TP-DP-PP'"}},
      {"pp_above_layers",
       Train("model:\n  layers: 3\nparallel:\n  pp: 4\n"),
       {"job.yaml:6:7: parallel.pp: inconsistent sizes: must be <= model.layers (= 3): every "
        "pipeline stage holds at least one layer (an uneven split is fine, the first stages take "
        "one more) (got 4; allowed: 1..3)"}},
      {"pp_above_default_layers",
       Train("parallel:\n  pp: 3\n"),
       {"job.yaml:4:7: parallel.pp: inconsistent sizes: must be <= model.layers (= 2)",
        "(got 3; allowed: 1..2)"}},
      {"tp_not_dividing_heads",
       Train("model:\n  d_model: 96\n  heads: 6\nparallel:\n  tp: 4\n"),
       {"job.yaml:7:7: parallel.tp: inconsistent sizes: must divide model.heads (= 6) (got 4; "
        "allowed: 1, 2, 3, 6)"}},
      {"ep_not_dividing_experts",
       Train("parallel:\n  dp: 3\n  ep: 3\nmoe:\n  experts: 8\n"),
       {"job.yaml:5:7: parallel.ep: inconsistent sizes: must divide moe.experts (= 8) (got 3; "
        "allowed: 1, 2, 4, 8)"}},
      {"ep_not_dividing_experts_written_first",
       Train("moe:\n  experts: 6\nparallel:\n  dp: 4\n  ep: 4\n"),
       {"job.yaml:7:7: parallel.ep: inconsistent sizes: must divide moe.experts (= 6)"}},
      {"esp_not_dividing_expert_ffn",
       Train("model:\n  expert_ffn: 90\nparallel:\n  tp: 4\n  esp: 4\n"),
       {"job.yaml:7:8: parallel.esp: inconsistent sizes: must divide model.expert_ffn (= 90) "
        "(got 4; allowed: 1, 2, 3, 5, 6, 9, 10, 15, 18, 30, 45, 90)"}},
      {"tp_not_dividing_dense_ffn",
       Train("model:\n  heads: 8\n  moe_every: 2\n  dense_ffn: 100\nparallel:\n  tp: 8\n"),
       {"job.yaml:8:7: parallel.tp: inconsistent sizes: must divide model.dense_ffn (= 100), the "
        "width of the dense layers (model.moe_every = 2) (got 8; allowed: 1, 2, 4, 5, 10, 20, 25, "
        "50, 100)"}},
  };
}

class ParallelLayoutTest : public testing::TestWithParam<LayoutCase> {};

TEST_P(ParallelLayoutTest, RefusedWithFieldValueAndAllowed) {
  const std::string message = testing_util::ExpectRefused(GetParam());
  // One mistake, one message.
  const std::vector<std::string> lines = absl::StrSplit(message, '\n');
  EXPECT_EQ(lines.size(), 1u) << message;
}
INSTANTIATE_TEST_SUITE_P(Table, ParallelLayoutTest, testing::ValuesIn(Cases()),
                         testing_util::CaseName);

furnace::v1::JobSpec MustParse(const std::string& yaml) {
  absl::StatusOr<furnace::v1::JobSpec> spec = ParseJobYaml(yaml, "job.yaml");
  EXPECT_TRUE(spec.ok()) << spec.status() << "\nfor:\n" << yaml;
  return spec.ok() ? *spec : furnace::v1::JobSpec();
}

TEST(ParallelLayoutAcceptedTest, UnevenPipelineStages) {
  // 5 layers on 3 stages: 2, 2, 1. And as many stages as layers.
  EXPECT_EQ(MustParse(Train("model: {layers: 5}\nparallel: {pp: 3}\n")).parallel().pp(), 3u);
  EXPECT_EQ(MustParse(Train("model: {layers: 4}\nparallel: {pp: 4}\n")).parallel().pp(), 4u);
}

TEST(ParallelLayoutAcceptedTest, EmptyOrderIsTheDefault) {
  EXPECT_EQ(MustParse(Train("parallel:\n  order: \"\"\n")).parallel().order(), "tp-dp-pp");
  EXPECT_EQ(MustParse(Train("parallel: {order: pp-tp-dp}\n")).parallel().order(), "pp-tp-dp");
}

TEST(ParallelLayoutAcceptedTest, EveryMoeScheduleOnAValidJob) {
  // tp 2 splits 1 * 64 tokens evenly, so s1 runs too; auto never picks s1 where it would not split.
  for (const char* schedule : {"deepspeed", "s1", "s2", "auto"}) {
    const std::string yaml =
        Train(absl::StrCat("parallel: {dp: 2, tp: 2, ep: 2}\nmoe: {schedule: ", schedule, "}\n"));
    EXPECT_EQ(MustParse(yaml).moe().schedule(), schedule);
  }
  // Only s1 splits tokens: the others run where micro_batch * seq_len does not divide by tp.
  for (const char* schedule : {"deepspeed", "s2", "auto"}) {
    const std::string yaml = Train(absl::StrCat("model: {seq_len: 6}\nparallel: {tp: 4}\n",
                                                "moe: {schedule: ", schedule, "}\n"));
    EXPECT_EQ(MustParse(yaml).moe().schedule(), schedule);
  }
  // tp 1 has no tensor parallelism for s1 or s2 to pause: refused, auto accepted.
  for (const char* schedule : {"s1", "s2"}) {
    const absl::StatusOr<furnace::v1::JobSpec> refused =
        ParseJobYaml(Train(absl::StrCat("moe: {schedule: ", schedule, "}\n")), "job.yaml");
    ASSERT_FALSE(refused.ok()) << schedule;
    EXPECT_THAT(std::string(refused.status().message()),
                ::testing::HasSubstr("pauses tensor parallelism around the MoE layer, and "
                                     "parallel.tp is 1"));
  }
  EXPECT_EQ(MustParse(Train("moe: {schedule: auto}\n")).moe().schedule(), "auto");
}

TEST(ParallelLayoutAcceptedTest, ExpertGroupsTilingAStage) {
  // dp * tp = 8 ranks per stage as edp 1 x ep 4 x esp 2.
  const furnace::v1::JobSpec s =
      MustParse(Train("model: {layers: 4}\nparallel: {pp: 2, dp: 4, tp: 2, ep: 4, esp: 2}\n"
                      "moe: {experts: 8}\n"));
  EXPECT_EQ(s.parallel().ep(), 4u);
  EXPECT_EQ(s.parallel().esp(), 2u);
}

TEST(ParallelLayoutAcceptedTest, DenseFfnOnlyMattersWithDenseLayers) {
  // moe_every 1: every layer is MoE, so a dense_ffn would be unused: refused as such, not as a
  // width tp does not divide.
  const absl::StatusOr<furnace::v1::JobSpec> unused =
      ParseJobYaml(Train("model: {dense_ffn: 7}\nparallel: {tp: 2}\n"), "job.yaml");
  ASSERT_FALSE(unused.ok());
  EXPECT_NE(unused.status().message().find("model.dense_ffn: only used by dense layers"),
            std::string::npos)
      << unused.status();
  // moe_every 2 with the default dense_ffn (4 * d_model) and tp | d_model.
  MustParse(Train("model: {moe_every: 2}\nparallel: {tp: 4}\n"));
}

TEST(ParallelLayoutAcceptedTest, CommcheckBuildsNoExpertGroups) {
  // A communication check builds neither the model nor the expert groups: its layout is pp * dp
  // * tp peers, and an expert size (which it would ignore) is refused, naming the field.
  const furnace::v1::JobSpec s = MustParse("name: c\nkind: commcheck\nparallel: {pp: 3, dp: 2}\n");
  EXPECT_EQ(s.parallel().pp() * s.parallel().dp(), 6u);
  const absl::StatusOr<furnace::v1::JobSpec> with_ep =
      ParseJobYaml("name: c\nkind: commcheck\nparallel: {pp: 3, dp: 2, ep: 4}\n", "job.yaml");
  ASSERT_FALSE(with_ep.ok());
  EXPECT_EQ(with_ep.status().message(),
            "job.yaml:3:30: parallel.ep: applies to train jobs only (a commcheck's ranks are pp * "
            "dp * tp peers of one world group: no experts, micro-batches or rank order) (allowed: "
            "omit it, or kind: train)");
}

TEST(ParallelLayoutAcceptedTest, EveryLayoutConfigParses) {
  int seen = 0;
  for (const auto& entry :
       std::filesystem::recursive_directory_iterator(FURNACE_SOURCE_DIR "/configs")) {
    if (entry.path().extension() != ".yaml") continue;
    absl::StatusOr<furnace::v1::JobSpec> spec = LoadJobFile(entry.path().string());
    EXPECT_TRUE(spec.ok()) << spec.status();
    ++seen;
  }
  EXPECT_GT(seen, 0);
}

}  // namespace
}  // namespace furnace::spec
