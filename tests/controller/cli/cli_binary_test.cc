// Runs the built `furnace` binary against 127.0.0.1:1, where nothing listens.
#include <sys/stat.h>
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <string>

#include "gtest/gtest.h"
#include "tests/controller/cli/run_furnace.h"

namespace {

using furnace::cli::testing::RunFurnace;
using furnace::cli::testing::RunResult;

TEST(CliBinaryTest, UnreachableControllerExits3) {
  for (const char* command : {"jobs", "status j-1", "workers", "--json watch j-1"}) {
    const RunResult run = RunFurnace(std::string("--controller 127.0.0.1:1 ") + command);
    EXPECT_EQ(run.exit_code, 3) << command << ": " << run.output;
    EXPECT_NE(run.output.find("cannot reach the controller at 127.0.0.1:1"), std::string::npos)
        << run.output;
  }
}

// --json promises one JSON document per command: a failed one prints an error document.
TEST(CliBinaryTest, AFailedJsonCommandPrintsAnErrorDocument) {
  const RunResult run = RunFurnace("--controller 127.0.0.1:1 --json status j-1");
  EXPECT_EQ(run.exit_code, 3) << run.output;
  EXPECT_NE(run.output.find("\"error\": {"), std::string::npos) << run.output;
  EXPECT_NE(run.output.find("\"code\": \"UNAVAILABLE\""), std::string::npos) << run.output;
  EXPECT_NE(run.output.find("\"exit_code\": 3"), std::string::npos) << run.output;
}

TEST(CliBinaryTest, UsageErrorsExit2) {
  EXPECT_EQ(RunFurnace("").exit_code, 2);
  EXPECT_EQ(RunFurnace("status").exit_code, 2);
  EXPECT_EQ(RunFurnace("--controller 127.0.0.1:1 submit /nonexistent/job.yaml").exit_code, 2);
  // A misspelt command is named, with the commands there are (not "a subcommand is required").
  for (const char* line : {"frobnicate", "--controller 127.0.0.1:1 stauts j-1"}) {
    const RunResult run = RunFurnace(line);
    EXPECT_EQ(run.exit_code, 2) << line;
    EXPECT_NE(run.output.find("unknown command '"), std::string::npos) << run.output;
    EXPECT_NE(run.output.find("the commands are certs, submit, jobs, status"), std::string::npos)
        << run.output;
  }
  // A negative count is said as such (CLI11's own range check printed a 300-digit bound).
  RunResult run = RunFurnace("sample j-1 --prompt x -n -3");
  EXPECT_EQ(run.exit_code, 2);
  EXPECT_NE(run.output.find("-n is the number of tokens to generate, >= 0 (got -3)"),
            std::string::npos)
      << run.output;
  run = RunFurnace("export j-1 --step -1 -o x.safetensors");
  EXPECT_EQ(run.exit_code, 2);
  EXPECT_NE(run.output.find("a step is >= 0 (got -1)"), std::string::npos) << run.output;
}

// A credential file that cannot be read is a local error (5), one that is malformed bad usage (2).
TEST(CliBinaryTest, UnreadableCredentialFilesExit5) {
  RunResult run = RunFurnace("--controller 127.0.0.1:1 --token-file /nonexistent/admin.token jobs");
  EXPECT_EQ(run.exit_code, 5) << run.output;
  EXPECT_NE(run.output.find("--token-file /nonexistent/admin.token: cannot read the file"),
            std::string::npos)
      << run.output;
  run = RunFurnace("--controller 127.0.0.1:1 --tls-ca /nonexistent/ca.pem jobs");
  EXPECT_EQ(run.exit_code, 5) << run.output;
  const std::string bad = ::testing::TempDir() + "/furnace_bad_ca.pem";
  FILE* f = fopen(bad.c_str(), "w");
  ASSERT_NE(f, nullptr);
  fputs("not a certificate\n", f);
  fclose(f);
  run = RunFurnace("--controller 127.0.0.1:1 --tls-ca " + bad + " jobs");
  EXPECT_EQ(run.exit_code, 2) << run.output;
}

// A token file other users may read is refused before anything is sent (bad usage, 2), naming the
// file, its mode and the fix.
TEST(CliBinaryTest, ATokenFileOthersMayReadIsRefused) {
  const std::string token = ::testing::TempDir() + "/furnace_cli_shared.token";
  FILE* f = fopen(token.c_str(), "w");
  ASSERT_NE(f, nullptr);
  fputs("furnace-test-token-0123456789abcdef\n", f);
  fclose(f);
  ASSERT_EQ(chmod(token.c_str(), 0644), 0);
  const RunResult run = RunFurnace("--controller 127.0.0.1:1 --token-file " + token + " jobs");
  EXPECT_EQ(run.exit_code, 2) << run.output;
  EXPECT_NE(run.output.find("--token-file " + token + ": mode 0644"), std::string::npos)
      << run.output;
  EXPECT_NE(run.output.find("chmod 600 " + token), std::string::npos) << run.output;
  ASSERT_EQ(chmod(token.c_str(), 0600), 0);  // then it is read (and needs TLS to be sent)
  const RunResult private_file =
      RunFurnace("--controller 127.0.0.1:1 --token-file " + token + " jobs");
  EXPECT_EQ(private_file.output.find("mode 0"), std::string::npos) << private_file.output;
  EXPECT_NE(private_file.output.find("a token is only sent over TLS"), std::string::npos)
      << private_file.output;
  std::remove(token.c_str());
}

TEST(CliBinaryTest, DataPrepareNeedsNoController) {
  const std::string dir = ::testing::TempDir();
  const std::string input = dir + "/furnace_cli_binary_prepare.txt";
  const std::string output = dir + "/furnace_cli_binary_prepare.tok";
  FILE* f = fopen(input.c_str(), "w");
  ASSERT_NE(f, nullptr);
  fputs("abc", f);
  fclose(f);
  RunResult run = RunFurnace("--controller 127.0.0.1:1 data prepare --input " + input + " -o " +
                             output + " --eod");
  EXPECT_EQ(run.exit_code, 0) << run.output;
  EXPECT_NE(run.output.find("1 document, 4 tokens, vocab 257"), std::string::npos) << run.output;
  run = RunFurnace("data prepare --input " + dir + "/furnace_no_such_file.txt -o " + output);
  EXPECT_EQ(run.exit_code, 5) << run.output;
  EXPECT_EQ(RunFurnace("data").exit_code, 2);
  EXPECT_EQ(RunFurnace("data prepare -o " + output).exit_code, 2);  // --input is required
  // The output would be renamed over the input (by any path to it): refused, the text kept.
  run = RunFurnace("data prepare --input " + input + " -o " + dir +
                   "/./furnace_cli_binary_prepare.txt");
  EXPECT_EQ(run.exit_code, 2) << run.output;
  EXPECT_NE(run.output.find("is the same file as --input"), std::string::npos) << run.output;
  FILE* kept = fopen(input.c_str(), "r");
  ASSERT_NE(kept, nullptr);
  char text[8] = {};
  EXPECT_EQ(fread(text, 1, sizeof(text), kept), 3u);
  fclose(kept);
  EXPECT_STREQ(text, "abc");
  std::remove(input.c_str());
  std::remove(output.c_str());
}

// A dry run sends nothing: a token in the environment without a CA (which a command that talks
// to the controller refuses: a token only goes over TLS) does not stop it.
TEST(CliBinaryTest, ADryRunNeedsNoCredentials) {
  const std::string job = std::string(FURNACE_SOURCE_DIR) + "/configs/commcheck.yaml";
  setenv("FURNACE_TOKEN", "furnace-test-token-0123456789abcdef", 1);
  const RunResult dry = RunFurnace("submit --dry-run " + job);
  const RunResult sent = RunFurnace("--controller 127.0.0.1:1 submit " + job);
  unsetenv("FURNACE_TOKEN");
  EXPECT_EQ(dry.exit_code, 0) << dry.output;
  EXPECT_NE(dry.output.find("not submitted (--dry-run)"), std::string::npos) << dry.output;
  EXPECT_EQ(sent.exit_code, 2) << sent.output;  // the token would go in the clear
}

// The real binary links gRPC's protobuf and loads SentencePiece (with its own protobuf-lite) as a
// module: training and using a vocabulary in that process must work.
TEST(CliBinaryTest, TokenizerTrainAndPrepare) {
  const std::string dir = ::testing::TempDir();
  const std::string input = dir + "/furnace_cli_binary_corpus.txt";
  const std::string model = dir + "/furnace_cli_binary_tok.model";
  const std::string output = dir + "/furnace_cli_binary_sp.tok";
  FILE* f = fopen(input.c_str(), "w");
  ASSERT_NE(f, nullptr);
  for (int i = 0; i < 200; ++i) fprintf(f, "line %d of the naïve corpus, café %d\n", i % 13, i);
  fclose(f);
  RunResult run = RunFurnace("data tokenizer train --input " + input + " --vocab 300 -o " + model);
  EXPECT_EQ(run.exit_code, 0) << run.output;
  EXPECT_NE(run.output.find("SentencePiece unigram model, vocab 300"), std::string::npos)
      << run.output;
  run = RunFurnace("data prepare --tokenizer " + model + " --input " + input + " -o " + output);
  EXPECT_EQ(run.exit_code, 0) << run.output;
  EXPECT_NE(run.output.find("1 document, "), std::string::npos) << run.output;
  EXPECT_NE(run.output.find("(sentencepiece:"), std::string::npos) << run.output;
  EXPECT_EQ(RunFurnace("data tokenizer train --input " + input + " -o " + model).exit_code, 2);
  std::remove(input.c_str());
  std::remove(model.c_str());
  std::remove(output.c_str());
}

TEST(CliBinaryTest, ExportRefusesOtherFormatsBeforeAskingTheController) {
  const RunResult run = RunFurnace("--controller 127.0.0.1:1 export j-1 --format onnx -o x");
  EXPECT_EQ(run.exit_code, 2) << run.output;
  EXPECT_NE(run.output.find("allowed: safetensors"), std::string::npos) << run.output;
  EXPECT_EQ(RunFurnace("--controller 127.0.0.1:1 export j-1 -o x").exit_code, 3);
  EXPECT_EQ(RunFurnace("export j-1").exit_code, 2);  // -o is required
  EXPECT_EQ(RunFurnace("export j-1 --step -2 -o x").exit_code, 2);
}

TEST(CliBinaryTest, PlanNeedsNoController) {
  const std::string config = std::string(FURNACE_SOURCE_DIR) + "/configs/layouts/tp2_ep2.yaml";
  RunResult run = RunFurnace("--controller 127.0.0.1:1 plan " + config);
  EXPECT_EQ(run.exit_code, 0) << run.output;
  for (const char* line :
       {"\ndeepspeed: forward ", "\ns1: forward ", "\ns2: forward ", "\nauto: "}) {
    EXPECT_NE(run.output.find(line), std::string::npos) << line << "\n" << run.output;
  }
  run = RunFurnace("plan " + config + " --ranks-per-node 1");
  EXPECT_EQ(run.exit_code, 0) << run.output;
  EXPECT_NE(run.output.find("tp 2 inter-node, ep 2 inter-node"), std::string::npos) << run.output;
  EXPECT_EQ(RunFurnace("plan /nonexistent/job.yaml").exit_code, 2);
  EXPECT_EQ(RunFurnace("plan").exit_code, 2);
  run = RunFurnace("plan --help");
  EXPECT_NE(run.output.find("parallel.order"), std::string::npos) << run.output;
}

TEST(CliBinaryTest, HelpDocumentsExitCodes) {
  const RunResult run = RunFurnace("--help");
  EXPECT_EQ(run.exit_code, 0);
  EXPECT_NE(run.output.find("Exit codes:"), std::string::npos) << run.output;
  EXPECT_NE(run.output.find("4  job not found"), std::string::npos) << run.output;
  EXPECT_EQ(RunFurnace("--version").exit_code, 0);
}

}  // namespace
