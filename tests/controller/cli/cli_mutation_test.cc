// A property test of the job-file checks: 300 job files mutated at random (seeded: the same files
// every run) from the shipped configs. Every one goes through what `furnace submit --dry-run`
// runs (spec::CheckJobText, then spec::ParseJobYaml), which must accept it or refuse it with
// INVALID_ARGUMENT (exit 2), never another error (an RPC error, exit 3: once, invalid UTF-8
// reached protobuf that way) or a crash; a file that is not valid UTF-8 must be refused by the
// check, naming the file and the byte. Every 10th file also goes through the real binary, with
// --dry-run and, when not UTF-8, submitted for real to an address where nothing listens: exit 0
// or 2, and 2 before anything is sent, never 3 or a signal.
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "controller/spec/job_spec.h"
#include "gtest/gtest.h"
#include "tests/controller/cli/run_furnace.h"

namespace {

using furnace::cli::testing::RunFurnace;
using furnace::cli::testing::RunResult;

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// An independent UTF-8 check for the test's own bookkeeping (the strict decoder of std::wstring
// conversion would do too, but is deprecated): true when some byte sequence is invalid.
bool HasInvalidUtf8(const std::string& s) {
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    int len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (len == 0 || i + len > s.size()) return true;
    uint32_t cp = len == 1 ? c : c & (0x7F >> len);
    for (int k = 1; k < len; ++k) {
      const auto b = static_cast<unsigned char>(s[i + k]);
      if ((b & 0xC0) != 0x80) return true;
      cp = (cp << 6) | (b & 0x3F);
    }
    const uint32_t min[] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < min[len] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return true;
    i += len;
  }
  return false;
}

std::string Mutate(std::string text, std::mt19937& rng) {
  auto pick = [&rng](size_t n) {
    return n == 0 ? 0 : std::uniform_int_distribution<size_t>(0, n - 1)(rng);
  };
  const int edits = 1 + static_cast<int>(pick(4));
  for (int e = 0; e < edits; ++e) {
    switch (pick(6)) {
      case 0:  // flip a byte to any value
        if (!text.empty()) text[pick(text.size())] = static_cast<char>(pick(256));
        break;
      case 1:  // insert high bytes (invalid or partial UTF-8 more often than not)
        text.insert(pick(text.size() + 1),
                    std::string(1 + pick(3), static_cast<char>(0x80 + pick(128))));
        break;
      case 2:  // delete a span
        if (!text.empty()) {
          const size_t at = pick(text.size());
          text.erase(at, pick(20));
        }
        break;
      case 3:  // duplicate a span somewhere else
        if (!text.empty()) {
          const size_t at = pick(text.size());
          const std::string span = text.substr(at, pick(40));
          text.insert(pick(text.size() + 1), span);
        }
        break;
      case 4:  // YAML punctuation
        text.insert(pick(text.size() + 1), std::string(1, ":-{}[]&*!|>'\"%@`#,\t\n"[pick(21)]));
        break;
      default:  // truncate
        text.resize(pick(text.size() + 1));
        break;
    }
  }
  return text;
}

TEST(CliMutationTest, MutatedJobFilesExitZeroOrTwoNeverThreeOrACrash) {
  const std::vector<std::string> seeds = {ReadAll(FURNACE_SOURCE_DIR "/configs/demo.yaml"),
                                          ReadAll(FURNACE_SOURCE_DIR "/configs/commcheck.yaml"),
                                          ReadAll(FURNACE_SOURCE_DIR "/configs/text.yaml"),
                                          ReadAll(FURNACE_SOURCE_DIR "/configs/parm.yaml")};
  for (const auto& s : seeds) ASSERT_FALSE(s.empty());
  const std::filesystem::path dir = std::filesystem::path(::testing::TempDir()) /
                                    ("furnace_mutation_" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  std::mt19937 rng(20261202);
  int valid = 0, invalid_utf8 = 0;
  for (int i = 0; i < 300; ++i) {
    const std::string text = Mutate(seeds[static_cast<size_t>(i) % seeds.size()], rng);
    const std::string path = (dir / ("job-" + std::to_string(i) + ".yaml")).string();
    std::ofstream(path, std::ios::binary) << text;
    const absl::Status checked = furnace::spec::CheckJobText(text, path);
    const absl::Status parsed =
        checked.ok() ? furnace::spec::ParseJobYaml(text, path).status() : checked;
    ASSERT_TRUE(parsed.ok() || absl::IsInvalidArgument(parsed)) << path << ": " << parsed;
    if (parsed.ok()) {
      ++valid;
    } else {
      EXPECT_NE(parsed.message().find(path), std::string::npos) << parsed;
    }
    const bool not_utf8 = HasInvalidUtf8(text);
    if (not_utf8) {
      ++invalid_utf8;
      EXPECT_FALSE(checked.ok()) << path;
      EXPECT_NE(checked.message().find(path + ": byte "), std::string::npos) << checked;
    }
    if (i % 10 == 0) {
      const RunResult dry = RunFurnace("--controller 127.0.0.1:1 submit --dry-run " + path);
      ASSERT_TRUE(dry.exit_code == 0 || dry.exit_code == 2)
          << "job " << i << " (" << path << "): exit " << dry.exit_code << " signal " << dry.signal
          << ": " << dry.output;
      EXPECT_EQ(dry.exit_code, parsed.ok() ? 0 : 2) << path << ": " << dry.output;
      if (not_utf8) {
        const RunResult sent = RunFurnace("--controller 127.0.0.1:1 submit " + path);
        EXPECT_EQ(sent.exit_code, 2) << path << ": " << sent.output;
        EXPECT_NE(sent.output.find(path + ": byte "), std::string::npos) << sent.output;
        EXPECT_NE(sent.output.find("not valid UTF-8"), std::string::npos) << sent.output;
      }
    }
  }
  // The mutations exercise both outcomes and the UTF-8 path (the counts are the seed's).
  EXPECT_GT(invalid_utf8, 50);
  EXPECT_GT(valid, 0);
  std::filesystem::remove_all(dir);
}

}  // namespace
