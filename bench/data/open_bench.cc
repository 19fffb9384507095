// What a rank pays for its data before and during training, on a Megatron indexed dataset of a
// given size written here (uint16 tokens, documents of 1..2047 tokens, one sequence each):
//   open   MakeSamplers: the .idx read and validated, the fingerprint's 1,024 tokens (all a rank
//          reads before its first step);
//   scan   every token of the .bin read in order (4 MiB blocks) and compared with the vocab: what
//          a rank read before its first step when Open checked every token (before 2026-12-04).
//          That loop read through the mapping a token at a time, slower than this one when the
//          file is cached, so warm this is a lower bound of what it cost;
//   sample one training micro-batch (B x (T + 1) tokens from shuffled windows, each token
//          checked as it is read): what the check now costs a step.
// Each is measured cold (the files' pages dropped from the page cache with
// posix_fadvise(DONTNEED) first, so they come from the disk) and warm, A B A B over --rounds.
// The resident set after a cold open says what the open read: the .idx, and the pages the
// fingerprint's 1,024 reads brought in. (After a warm one it counts what the kernel maps around
// those reads from the page cache, shared and clean: with large page-cache folios, as on the
// 6.18 kernel of 2026-12-04's run, that was the whole file.)
//
// Usage: furnace_bench_data --dir DIR [--gib 2] [--rounds 3] [--keep 1]   (--keep: leave the
// dataset in DIR)
// Prints one JSON object.
#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "bench/common/stats.h"
#include "nlohmann/json.hpp"
#include "runtime/data/data_sources.h"
#include "runtime/data/indexed_dataset.h"

namespace {

using furnace::bench::Now;
using furnace::bench::Summary;
namespace data = furnace::data;

constexpr int kVocab = 50304;

// Writes PREFIX.bin / PREFIX.idx (Megatron's layout: sequences back to back) of about `bytes`;
// an error names the file that could not be written.
absl::Status WriteDataset(const std::string& prefix, int64_t bytes) {
  std::mt19937_64 rng(1);
  std::vector<int32_t> lengths;
  std::vector<int64_t> pointers;
  std::ofstream bin(prefix + ".bin", std::ios::binary);
  if (!bin) return absl::NotFoundError(absl::StrCat("cannot create ", prefix, ".bin"));
  std::vector<uint16_t> doc;
  int64_t offset = 0;
  while (offset < bytes) {
    doc.resize(1 + rng() % 2047);
    for (uint16_t& t : doc) t = static_cast<uint16_t>(rng() % kVocab);
    bin.write(reinterpret_cast<const char*>(doc.data()),
              static_cast<std::streamsize>(doc.size() * 2));
    lengths.push_back(static_cast<int32_t>(doc.size()));
    pointers.push_back(offset);
    offset += static_cast<int64_t>(doc.size()) * 2;
  }
  bin.close();
  if (!bin) return absl::DataLossError(absl::StrCat("cannot write ", prefix, ".bin (disk full?)"));
  std::ofstream idx(prefix + ".idx", std::ios::binary);
  if (!idx) return absl::NotFoundError(absl::StrCat("cannot create ", prefix, ".idx"));
  const auto put = [&](const void* p, size_t n) {
    idx.write(static_cast<const char*>(p), static_cast<std::streamsize>(n));
  };
  put(data::kIndexedMagic, 9);
  const uint64_t version = 1, S = lengths.size(), D = S + 1;
  const uint8_t dtype = 8;  // uint16
  put(&version, 8);
  put(&dtype, 1);
  put(&S, 8);
  put(&D, 8);
  put(lengths.data(), 4 * S);
  put(pointers.data(), 8 * S);
  for (uint64_t d = 0; d < D; ++d) put(&d, 8);
  idx.close();
  if (!idx) return absl::DataLossError(absl::StrCat("cannot write ", prefix, ".idx (disk full?)"));
  return absl::OkStatus();
}

void DropFromPageCache(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) return;
  ::fdatasync(fd);
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
}

double ResidentMiB() {
  std::ifstream statm("/proc/self/statm");
  long pages = 0, resident = 0;
  statm >> pages >> resident;
  return static_cast<double>(resident) * static_cast<double>(::sysconf(_SC_PAGESIZE)) / 1048576.0;
}

[[noreturn]] void Die(const absl::Status& s) {
  std::fprintf(stderr, "furnace_bench_data: %s\n", s.ToString().c_str());
  std::exit(1);
}

}  // namespace

int main(int argc, char** argv) {
  std::string dir;
  double gib = 2;
  int rounds = 3;
  bool keep = false;         // --keep 1: leave the dataset in --dir
  bool bad = argc % 2 == 0;  // every flag takes a value
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--keep") {
      keep = std::atoi(argv[i + 1]) != 0;
    } else if (flag == "--dir") {
      dir = argv[i + 1];
    } else if (flag == "--gib") {
      gib = std::atof(argv[i + 1]);
    } else if (flag == "--rounds") {
      rounds = std::atoi(argv[i + 1]);
    } else {
      bad = true;
    }
  }
  if (dir.empty() || bad || !(gib > 0) || rounds < 1) {
    std::fprintf(stderr, "usage: furnace_bench_data --dir DIR [--gib 2] [--rounds 3] [--keep 1]\n");
    return 2;
  }
  std::error_code dir_error;
  std::filesystem::create_directories(dir, dir_error);
  if (dir_error) {
    Die(absl::InvalidArgumentError(absl::StrCat("--dir ", dir, ": ", dir_error.message())));
  }
  const std::string prefix = dir + "/bench_corpus";
  const double t_write = Now();
  if (absl::Status s = WriteDataset(prefix, static_cast<int64_t>(gib * (1ull << 30))); !s.ok()) {
    Die(s);
  }
  const double write_s = Now() - t_write;
  const std::string files[] = {data::IndexedDataset::IndexPath(prefix),
                               data::IndexedDataset::DataPath(prefix)};
  const auto drop = [&] {
    for (const std::string& f : files) DropFromPageCache(f);
  };

  data::DataSourceConfig config;
  config.source = "indexed";
  config.paths = {{prefix}};
  config.model_vocab = kVocab;
  const data::SamplerConfig sampler{.batch = 8, .seq_len = 2048, .seed = 3, .global_batch = 64};

  std::vector<double> open_cold, open_warm, scan_cold, scan_warm, sample_cold, sample_warm;
  double before_cold = 0, before_warm = 0, resident_cold = 0, resident_warm = 0;
  int64_t tokens = 0;
  for (int r = 0; r < rounds; ++r) {
    for (const bool cold : {true, false}) {
      // Open, then sample 4 micro-batches, from the page cache's state `cold` says.
      if (cold) drop();
      (cold ? before_cold : before_warm) = ResidentMiB();
      double t0 = Now();
      absl::StatusOr<data::Samplers> made = data::MakeSamplers(config, sampler);
      if (!made.ok()) Die(made.status());
      (cold ? open_cold : open_warm).push_back(Now() - t0);
      (cold ? resident_cold : resident_warm) = ResidentMiB();
      t0 = Now();
      for (int g = 0; g < 4; ++g) {
        absl::StatusOr<data::Batch> batch = made->train->Sample(r * 16 + cold, 0, g);
        if (!batch.ok()) Die(batch.status());
      }
      (cold ? sample_cold : sample_warm).push_back((Now() - t0) / 4);
      made = absl::UnknownError("closed");  // closed: the drop below reaches every page

      // Every token read in order and checked, as Open did before tokens were checked as read
      // (with the kernel's read-ahead, as a sequential read gets it).
      if (cold) drop();
      t0 = Now();
      {
        std::ifstream bin(files[1], std::ios::binary);
        std::vector<uint16_t> block(1 << 21);
        int64_t bad = 0;
        tokens = 0;
        while (bin.read(reinterpret_cast<char*>(block.data()),
                        static_cast<std::streamsize>(block.size() * 2)) ||
               bin.gcount() > 0) {
          const int64_t n = bin.gcount() / 2;
          for (int64_t i = 0; i < n; ++i) bad += block[i] >= kVocab ? 1 : 0;
          tokens += n;
        }
        if (bad != 0) Die(absl::DataLossError("tokens outside the vocab"));
      }
      (cold ? scan_cold : scan_warm).push_back(Now() - t0);
    }
  }
  nlohmann::json out = {
      {"gib", gib},
      {"tokens", tokens},
      {"write_s", write_s},
      {"rounds", rounds},
      {"open_s", {{"cold", Summary(open_cold)}, {"warm", Summary(open_warm)}}},
      {"scan_s", {{"cold", Summary(scan_cold)}, {"warm", Summary(scan_warm)}}},
      {"sample_micro_batch_s", {{"cold", Summary(sample_cold)}, {"warm", Summary(sample_warm)}}},
      {"resident_mib",
       {{"before_cold_open", before_cold},
        {"after_cold_open", resident_cold},
        {"before_warm_open", before_warm},
        {"after_warm_open", resident_warm}}},
  };
  std::printf("%s\n", out.dump(2).c_str());
  if (!keep) {
    for (const std::string& f : files) std::remove(f.c_str());
  }
  return 0;
}
