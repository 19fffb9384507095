// furnace sample against the PyTorch greedy golden (tests/reference/golden_sample.safetensors):
// from the file itself (--weights, as an export is read) and from a job's committed checkpoint of
// the same weights (a fake JobClient says where it is); the continuation must be the golden's,
// token for token. Plus the option and input errors.
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "controller/cli/commands.h"
#include "controller/cli/exit_codes.h"
#include "controller/cli/sample_tokenizer.h"
#include "gtest/gtest.h"
#include "runtime/checkpoint/checkpoint.h"
#include "runtime/checkpoint/safetensors.h"
#include "tests/controller/cli/fake_job_client.h"
#include "tests/controller/cli/job_fixtures.h"
#include "tests/testing/test_dir.h"

namespace furnace::cli {
namespace {

using testing::FakeJobClient;
using testing::kT0;
using testing_util::TestDir;

const std::string kGolden = std::string(FURNACE_REFERENCE_DIR) + "/golden_sample.safetensors";

std::vector<int> Ids(const train::SafetensorsFile& file, const std::string& name) {
  std::vector<int> out;
  for (float v : file.tensors.at(name).data) out.push_back(static_cast<int>(v));
  return out;
}

class SampleTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<train::SafetensorsFile> file = train::ReadSafetensors(kGolden);
    ASSERT_TRUE(file.ok()) << file.status();
    golden_ = std::move(*file);
    prompt_ = absl::StrJoin(Ids(golden_, "prompt"), " ");
    for (int id : Ids(golden_, "greedy")) absl::StrAppend(&want_, id, " ");
    ctx_.client = &client_;
    ctx_.out = &out_;
    ctx_.err = &err_;
    ctx_.clock = &clock_;
    ctx_.sleep = [](double) {};
    options_.prompt = prompt_;
    options_.temperature = 0;
    options_.tokens = 20;
    options_.tokenizer = "ids";
  }

  // The golden's parameters as a single-rank committed checkpoint of a markov job at step 30.
  void SaveAsJobCheckpoint() {
    std::vector<train::ParamInfo> params;
    std::vector<float> values;
    for (const auto& [name, t] : golden_.tensors) {
      if (name == "prompt" || name == "greedy" || name == "logits") continue;
      params.push_back(
          {.name = name, .shape = t.shape, .offset = static_cast<int64_t>(values.size())});
      values.insert(values.end(), t.data.begin(), t.data.end());
    }
    std::vector<float> zeros(values.size(), 0.0f);
    train::ShardState s;
    s.step = 30;
    s.seed = 1;
    s.n = static_cast<int64_t>(values.size());
    s.params = values.data();
    s.m = zeros.data();
    s.v = zeros.data();
    ASSERT_TRUE(train::CheckpointStore(ckpt_, 0).Save(params, s).ok());
    v1::JobDetail job = testing::MakeTrainJob(v1::JOB_SUCCEEDED);
    v1::JobSpec& spec = *job.mutable_spec();
    spec.set_kind("train");
    spec.mutable_checkpoint()->set_dir(ckpt_);
    spec.mutable_data()->set_source("markov");
    v1::ModelSpec& m = *spec.mutable_model();
    m.set_vocab(64);
    m.set_seq_len(32);
    m.set_d_model(32);
    m.set_heads(4);
    m.set_layers(2);
    m.set_dense_ffn(64);
    m.set_moe_every(2);
    m.set_expert_ffn(48);
    spec.mutable_moe()->set_experts(4);
    spec.mutable_moe()->set_top_k(2);
    spec.mutable_moe()->set_normalize_topk(true);
    client_.get_job = {job};
  }

  train::SafetensorsFile golden_;
  std::string prompt_, want_;
  TestDir dir_;
  std::string ckpt_ = dir_ / "ckpt";
  FakeJobClient client_;
  std::ostringstream out_, err_;
  FakeClock clock_{kT0};
  CommandContext ctx_;
  SampleOptions options_;
};

TEST_F(SampleTest, GreedyFromAWeightsFileIsThePyTorchContinuation) {
  options_.weights = kGolden;
  absl::StatusOr<int> code = RunSample(ctx_, "", options_);
  ASSERT_TRUE(code.ok()) << code.status();
  EXPECT_EQ(*code, kExitOk);
  EXPECT_EQ(out_.str(), want_ + "\n");
  EXPECT_NE(err_.str().find("20 tokens from " + kGolden), std::string::npos) << err_.str();
  EXPECT_NE(err_.str().find("greedy"), std::string::npos) << err_.str();
  EXPECT_EQ(client_.get_job_calls, 0);
}

TEST_F(SampleTest, GreedyFromAJobCheckpointIsThePyTorchContinuation) {
  SaveAsJobCheckpoint();
  options_.tokenizer.clear();  // a markov job: token ids
  absl::StatusOr<int> code = RunSample(ctx_, "j-1", options_);
  ASSERT_TRUE(code.ok()) << code.status();
  EXPECT_EQ(out_.str(), want_ + "\n");
  EXPECT_NE(err_.str().find("from job j-1 step 30"), std::string::npos) << err_.str();
}

// An indexed dataset does not record its tokenizer, nor does token data without data.tokenizer:
// the job's tokenizer must then be given (the byte tokenizer, guessed before, printed garbage for
// a subword corpus without an error).
TEST_F(SampleTest, AJobWhoseDataDoesNotNameItsTokenizerNeedsOne) {
  SaveAsJobCheckpoint();
  options_.tokenizer.clear();
  for (const char* source : {"indexed", "tokens"}) {
    client_.get_job.front()->mutable_spec()->mutable_data()->set_source(source);
    absl::StatusOr<int> run = RunSample(ctx_, "j-1", options_);
    EXPECT_TRUE(absl::IsInvalidArgument(run.status())) << source << ": " << run.status();
    EXPECT_NE(run.status().message().find("does not record the tokenizer of its data"),
              std::string::npos)
        << run.status();
    EXPECT_NE(run.status().message().find("give --tokenizer"), std::string::npos) << run.status();
  }
  options_.tokenizer = "ids";  // given: it samples
  EXPECT_TRUE(RunSample(ctx_, "j-1", options_).ok());
}

// A job that records its tokenizer decodes with it: another --tokenizer would print another
// tokenizer's text for its ids without an error.
TEST_F(SampleTest, AnotherTokenizerThanTheJobsIsRefused) {
  SaveAsJobCheckpoint();
  options_.tokenizer = "byte";  // a markov job's symbols are ids
  absl::StatusOr<int> run = RunSample(ctx_, "j-1", options_);
  EXPECT_TRUE(absl::IsInvalidArgument(run.status())) << run.status();
  EXPECT_NE(run.status().message().find("--tokenizer byte is not the tokenizer job j-1 trained on "
                                        "(Markov symbols: ids)"),
            std::string::npos)
      << run.status();

  v1::DataSpec& data = *client_.get_job.front()->mutable_spec()->mutable_data();
  data.set_source("tokens");
  data.set_tokenizer("byte");
  options_.tokenizer = "ids";
  run = RunSample(ctx_, "j-1", options_);
  EXPECT_TRUE(absl::IsInvalidArgument(run.status())) << run.status();
  EXPECT_NE(run.status().message().find("trained on (byte)"), std::string::npos) << run.status();

  options_.tokenizer = "ids";  // what the job records: accepted
  data.set_source("markov");
  data.clear_tokenizer();
  run = RunSample(ctx_, "j-1", options_);
  EXPECT_TRUE(run.ok()) << run.status();
}

TEST_F(SampleTest, FixedSeedRepeatsAndJsonSaysWhatRan) {
  options_.weights = kGolden;
  options_.temperature = 1.0;
  options_.top_k = 8;
  options_.seed = 5;
  ctx_.json = true;
  // The document's "text" line (its fields come in no fixed order, so the line may or may not end
  // in a comma; "seconds" varies).
  const auto text_of = [](const std::string& json) {
    const size_t at = json.find("\"text\": ");
    if (at == std::string::npos) return std::string();
    std::string line = json.substr(at, json.find('\n', at) - at);
    if (!line.empty() && line.back() == ',') line.pop_back();
    return line;
  };
  ASSERT_TRUE(RunSample(ctx_, "", options_).ok());
  const std::string first = out_.str();
  out_.str("");
  ASSERT_TRUE(RunSample(ctx_, "", options_).ok());
  EXPECT_FALSE(text_of(first).empty()) << first;
  EXPECT_EQ(text_of(out_.str()), text_of(first));
  EXPECT_NE(first.find("\"tokenizer\": \"ids\""), std::string::npos) << first;
  EXPECT_NE(first.find("\"prompt_tokens\": 6"), std::string::npos) << first;
  options_.seed = 6;  // another seed, another text
  out_.str("");
  ASSERT_TRUE(RunSample(ctx_, "", options_).ok());
  EXPECT_NE(text_of(out_.str()), text_of(first));
}

TEST_F(SampleTest, BadInputIsNamed) {
  options_.weights = kGolden;
  options_.tokenizer.clear();
  absl::StatusOr<int> no_tokenizer = RunSample(ctx_, "", options_);
  EXPECT_TRUE(absl::IsInvalidArgument(no_tokenizer.status()));
  EXPECT_NE(no_tokenizer.status().message().find("--weights does not say which tokenizer"),
            std::string::npos)
      << no_tokenizer.status();

  options_.tokenizer = "ids";
  options_.prompt = "3 64";
  absl::StatusOr<int> outside = RunSample(ctx_, "", options_);
  EXPECT_NE(outside.status().message().find("token 64 (ids tokenizer), outside the model's "
                                            "vocabulary [0, 64)"),
            std::string::npos)
      << outside.status();
  // A word that is no id is refused, naming it (it was skipped, sampling after fewer ids).
  options_.prompt = "3 x5 7";
  absl::StatusOr<int> word = RunSample(ctx_, "", options_);
  EXPECT_TRUE(absl::IsInvalidArgument(word.status()));
  EXPECT_NE(word.status().message().find("sample: --prompt: \"x5\" is not a token id"),
            std::string::npos)
      << word.status();

  options_.prompt = prompt_;
  options_.temperature = -1;
  absl::StatusOr<int> temperature = RunSample(ctx_, "", options_);
  EXPECT_NE(temperature.status().message().find("--temperature -1"), std::string::npos);

  options_.temperature = 0;
  absl::StatusOr<int> both = RunSample(ctx_, "j-1", options_);
  EXPECT_TRUE(absl::IsInvalidArgument(both.status()));

  options_.weights = dir_ / "missing.safetensors";
  absl::StatusOr<int> missing = RunSample(ctx_, "", options_);
  EXPECT_EQ(ExitCodeForStatus(missing.status()), kExitLocalError) << missing.status();
  EXPECT_NE(missing.status().message().find("missing.safetensors"), std::string::npos);

  // A safetensors file that is no export of furnace (no model description): a local error too.
  const std::string foreign = dir_ / "foreign.safetensors";
  const float value = 1;
  ASSERT_TRUE(train::WriteSafetensors(foreign, {{"w", {1}, &value}}).ok());
  options_.weights = foreign;
  absl::StatusOr<int> not_ours = RunSample(ctx_, "", options_);
  EXPECT_EQ(ExitCodeForStatus(not_ours.status()), kExitLocalError) << not_ours.status();
  EXPECT_NE(not_ours.status().message().find("furnace.model"), std::string::npos)
      << not_ours.status();

  // A tokenizer model that cannot be read here: exit 5, not 4 (which says "no such job").
  options_.weights = kGolden;
  options_.tokenizer = dir_ / "missing.model";
  absl::StatusOr<int> no_model = RunSample(ctx_, "", options_);
  EXPECT_EQ(ExitCodeForStatus(no_model.status()), kExitLocalError) << no_model.status();
  EXPECT_NE(no_model.status().message().find("missing.model"), std::string::npos);
}

// A stand-in for a byte-fallback SentencePiece model: ids below 256 are bytes, decoded the way
// SentencePiece decodes byte pieces (an incomplete UTF-8 run becomes one U+FFFD per byte); 300 and
// 301 decode to "a" and "b", and 302 after 301 joins with it into "B" (a decoder that rewrites
// what it saw once it sees more).
class ByteFallbackDecoder final : public Tokenizer {
 public:
  absl::StatusOr<std::vector<int32_t>> Encode(absl::string_view, data::TextPart) const override {
    return std::vector<int32_t>();
  }
  std::string Decode(absl::Span<const int32_t> ids) const override {
    std::string out, run;
    auto flush = [&] {
      size_t i = 0;
      while (i < run.size()) {
        const unsigned char c = static_cast<unsigned char>(run[i]);
        const size_t need = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
        if (i + need <= run.size()) {
          out += run.substr(i, need);
          i += need;
        } else {
          for (; i < run.size(); ++i) out += "\xEF\xBF\xBD";
        }
      }
      run.clear();
    };
    for (size_t k = 0; k < ids.size(); ++k) {
      if (ids[k] < 256) {
        run += static_cast<char>(ids[k]);
        continue;
      }
      flush();
      if (ids[k] == 300) out += "a";
      if (ids[k] == 301) out += (k + 1 < ids.size() && ids[k + 1] == 302) ? "B" : "b";
    }
    flush();
    return out;
  }
  int64_t vocab() const override { return 303; }
  int32_t eod_id() const override { return -1; }
  std::string identity() const override { return "test"; }
};

// Feeds ids one at a time as sample does; returns what was printed.
std::string Stream(const std::vector<int32_t>& all) {
  ByteFallbackDecoder tok;
  std::vector<int32_t> ids;
  std::string shown, printed;
  for (int32_t id : all) {
    ids.push_back(id);
    printed += StreamedText(tok, ids, false, &shown);
  }
  printed += StreamedText(tok, ids, true, &shown);
  return printed;
}

TEST(StreamedTextTest, AByteRunIsPrintedOnceComplete) {
  // "a€a": € is E2 82 AC, three byte pieces decoded as U+FFFD until the run is complete.
  EXPECT_EQ(Stream({300, 0xE2, 0x82, 0xAC, 300}),
            "a\xE2\x82\xAC"
            "a");
  // An incomplete run at the end stays U+FFFD, printed by the last call.
  EXPECT_EQ(Stream({300, 0xE2, 0x82}), "a\xEF\xBF\xBD\xEF\xBF\xBD");
}

TEST(StreamedTextTest, ARewrittenDecodingIsPrintedByTheLastCall) {
  // "ab" is shown, then the decoder says "aB" and then "aBa": the last call prints what follows
  // the shared prefix "a", so every generated character reaches the output.
  EXPECT_EQ(Stream({300, 301, 302, 300}),
            "ab"
            "Ba");
  // A rewrite inside a character prints that character whole: e-acute (C3 A9) shown, then the
  // decoder says e-grave (C3 A8).
  ByteFallbackDecoder tok;
  std::string shown = "x\xC3\xA9";
  EXPECT_EQ(StreamedText(tok, {'x', 0xC3, 0xA8}, true, &shown), "\xC3\xA8");
}

}  // namespace
}  // namespace furnace::cli
