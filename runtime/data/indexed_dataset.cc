#include "runtime/data/indexed_dataset.h"

#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "runtime/base/status.h"

namespace furnace::data {
namespace {

struct DType {
  int code;
  const char* name;
  int width;
  bool is_signed;
};
// Megatron's DType table, integer codes only.
constexpr DType kDTypes[] = {{1, "uint8", 1, false}, {2, "int8", 1, true},
                             {3, "int16", 2, true},  {4, "int32", 4, true},
                             {5, "int64", 8, true},  {8, "uint16", 2, false}};
constexpr const char* kSupportedDTypes = "1 uint8, 2 int8, 3 int16, 4 int32, 5 int64, 8 uint16";

const DType* FindDType(int code) {
  for (const DType& d : kDTypes) {
    if (d.code == code) return &d;
  }
  return nullptr;
}

int64_t LoadI64(const unsigned char* p) { return static_cast<int64_t>(LoadU64(p)); }

// Entries of the index's arrays read at once while it is validated: 768 KiB of lengths and
// pointers, whatever the dataset's size.
constexpr uint64_t kIndexChunk = uint64_t{1} << 16;

// A prefix given with its .bin or .idx (data.path: /d/corpus.bin) names files that are not there
// (/d/corpus.bin.idx): say so where opening fails.
absl::Status WithPrefixHint(const std::string& prefix, const absl::Status& status) {
  for (absl::string_view suffix : {".bin", ".idx"}) {
    if (!absl::EndsWith(prefix, suffix)) continue;
    return absl::Status(
        status.code(),
        absl::StrCat(status.message(), " (an indexed dataset is named by its prefix, without ",
                     suffix, ": data.path: ", prefix.substr(0, prefix.size() - suffix.size()),
                     " for ", prefix, ")"));
  }
  return status;
}

}  // namespace

IndexedDataset::~IndexedDataset() = default;

absl::StatusOr<std::unique_ptr<IndexedDataset>> IndexedDataset::Open(const std::string& prefix,
                                                                     int64_t vocab) {
  const std::string idx_path = IndexPath(prefix);
  const std::string bin_path = DataPath(prefix);
  auto bad = [&](const std::string& what) {
    return absl::InvalidArgumentError(absl::StrCat("indexed dataset index ", idx_path, ": ", what));
  };
  auto damaged = [&](const std::string& what) {
    return absl::DataLossError(absl::StrCat("indexed dataset index ", idx_path, ": ", what));
  };
  // The index is read through at once; the data a window at a time.
  absl::StatusOr<std::unique_ptr<DataFile>> opened =
      DataFile::Open(idx_path, "indexed dataset index", FileAccess::kSequential);
  if (!opened.ok()) return WithPrefixHint(prefix, opened.status());
  std::unique_ptr<DataFile> idx = std::move(*opened);
  ASSIGN_OR_RETURN(std::unique_ptr<DataFile> bin,
                   DataFile::Open(bin_path, "indexed dataset data", FileAccess::kRandom));
  const int64_t idx_bytes = idx->size();
  unsigned char h[kIndexedHeaderBytes];
  RETURN_IF_ERROR(idx->ReadAt(0, std::min(idx_bytes, kIndexedHeaderBytes), h));
  // A prefix of the magic (an empty file too) is a file cut short, not another format.
  if (idx_bytes < 9 &&
      (idx_bytes == 0 || std::memcmp(h, kIndexedMagic, static_cast<size_t>(idx_bytes)) == 0)) {
    return damaged(absl::StrCat("truncated: ", idx_bytes, " bytes, shorter than the magic"));
  }
  if (idx_bytes < 9 || std::memcmp(h, kIndexedMagic, 9) != 0) {
    const std::string found(reinterpret_cast<const char*>(h),
                            static_cast<size_t>(std::min<int64_t>(idx_bytes, 9)));
    return bad(absl::StrCat("bad magic \"", absl::CEscape(found),
                            "\" (expected \"MMIDIDX\\000\\000\", Megatron's mmap indexed format; "
                            "the legacy cached format \"TNTIDX\" is not read)"));
  }
  if (idx_bytes < kIndexedHeaderBytes) {
    return damaged(absl::StrCat("truncated: ", idx_bytes, " bytes, shorter than the ",
                                kIndexedHeaderBytes, "-byte header"));
  }
  const uint64_t version = LoadU64(h + 9);
  if (version != kIndexedVersion) {
    return bad(absl::StrCat("unsupported version ", version, " (this build reads version ",
                            kIndexedVersion, ")"));
  }
  const DType* dtype = FindDType(h[17]);
  if (dtype == nullptr) {
    return bad(absl::StrCat("unsupported dtype code ", int{h[17]},
                            " (token ids must be integers; supported: ", kSupportedDTypes, ")"));
  }
  const uint64_t S = LoadU64(h + 18);
  const uint64_t D = LoadU64(h + 26);
  const uint64_t body = static_cast<uint64_t>(idx_bytes - kIndexedHeaderBytes);
  // Each count is bounded by the file before the products below are formed.
  if (S > body / 12 || D > body / 8 || 12 * S + 8 * D > body) {
    return damaged(absl::StrCat("truncated: the header says ", S, " sequences and ", D,
                                " document indices (", kIndexedHeaderBytes + 12 * S + 8 * D,
                                " bytes in all) but the file has ", idx_bytes, " bytes"));
  }
  const uint64_t expected = 12 * S + 8 * D;
  if (body == expected + S && S > 0) {
    return bad(absl::StrCat("has ", S,
                            " trailing bytes, one per sequence: a multimodal index (sequence "
                            "modes), which this build does not read"));
  }
  if (body != expected) {
    return damaged(absl::StrCat("has ", body - expected, " bytes after the ", S, " sequences and ",
                                D, " document indices the header describes"));
  }
  const int64_t lengths_at = kIndexedHeaderBytes;
  const int64_t pointers_at = lengths_at + static_cast<int64_t>(4 * S);
  const int64_t documents_at = pointers_at + static_cast<int64_t>(8 * S);
  // Read through in chunks: lengths and pointers side by side, or document indices.
  std::vector<unsigned char> chunk(12 * kIndexChunk);
  int64_t first_document = 0, last_document = 0;
  for (uint64_t d0 = 0; d0 < D; d0 += kIndexChunk) {
    const uint64_t k = std::min(kIndexChunk, D - d0);
    RETURN_IF_ERROR(idx->ReadAt(documents_at + static_cast<int64_t>(8 * d0),
                                static_cast<int64_t>(8 * k), chunk.data()));
    for (uint64_t i = 0; i < k; ++i) {
      const uint64_t d = d0 + i;
      const int64_t value = LoadI64(chunk.data() + 8 * i);
      if (d == 0) first_document = value;
      if (d > 0 && value < last_document) {
        return damaged(absl::StrCat("document index ", d, " (", value,
                                    ") is below the one before it (", last_document, ")"));
      }
      last_document = value;
    }
  }
  if (D < 1 || first_document != 0 || last_document != static_cast<int64_t>(S)) {
    return damaged(absl::StrCat(
        "document indices must run from 0 to the sequence count ", S, "; found ", D, " of them",
        D >= 1 ? absl::StrCat(" from ", first_document, " to ", last_document) : ""));
  }

  std::unique_ptr<IndexedDataset> ds(new IndexedDataset());
  ds->prefix_ = prefix;
  ds->vocab_ = vocab;
  ds->dtype_code_ = dtype->code;
  ds->width_ = dtype->width;
  ds->is_signed_ = dtype->is_signed;
  ds->num_sequences_ = static_cast<int64_t>(S);
  ds->num_documents_ = static_cast<int64_t>(D) - 1;
  ds->pointers_at_ = pointers_at;
  // Calls fn(s0, k, lengths, pointers) on the index's sequences [s0, s0 + k), a chunk at a time.
  const auto for_each_chunk = [&](const auto& fn) -> absl::Status {
    for (uint64_t s0 = 0; s0 < S; s0 += kIndexChunk) {
      const uint64_t k = std::min(kIndexChunk, S - s0);
      RETURN_IF_ERROR(idx->ReadAt(lengths_at + static_cast<int64_t>(4 * s0),
                                  static_cast<int64_t>(4 * k), chunk.data()));
      RETURN_IF_ERROR(idx->ReadAt(pointers_at + static_cast<int64_t>(8 * s0),
                                  static_cast<int64_t>(8 * k), chunk.data() + 4 * k));
      RETURN_IF_ERROR(fn(s0, k, chunk.data(), chunk.data() + 4 * k));
    }
    return absl::OkStatus();
  };
  const int64_t bin_bytes = bin->size();
  int64_t end_of_previous = 0;
  int64_t tokens = 0;
  bool contiguous = true;
  RETURN_IF_ERROR(for_each_chunk([&](uint64_t s0, uint64_t k, const unsigned char* lengths,
                                     const unsigned char* pointers) -> absl::Status {
    for (uint64_t j = 0; j < k; ++j) {
      const uint64_t i = s0 + j;
      const int32_t length = static_cast<int32_t>(LoadU32(lengths + 4 * j));
      const int64_t pointer = LoadI64(pointers + 8 * j);
      if (length < 0) return damaged(absl::StrCat("sequence ", i, " has length ", length));
      if (pointer < end_of_previous || pointer % dtype->width != 0) {
        return damaged(absl::StrCat(
            "sequence ", i, " starts at byte ", pointer,
            i > 0 ? absl::StrCat(", inside sequence ", i - 1, " (which ends at byte ",
                                 end_of_previous, ")")
                  : "",
            pointer % dtype->width != 0
                ? absl::StrCat(", not a multiple of the ", dtype->width, "-byte token width")
                : ""));
      }
      // Compared without forming pointer + bytes, which a damaged pointer near INT64_MAX wraps.
      const int64_t bytes = int64_t{length} * dtype->width;
      if (pointer > bin_bytes || bytes > bin_bytes - pointer) {
        return absl::DataLossError(absl::StrCat(
            "indexed dataset data ", bin_path, ": truncated: sequence ", i, " of ", idx_path, " (",
            bytes, " bytes at byte ", pointer, ") ends past the file's ", bin_bytes, " bytes"));
      }
      contiguous = contiguous && pointer == end_of_previous;
      end_of_previous = pointer + bytes;
      tokens += length;
    }
    return absl::OkStatus();
  }));
  ds->size_ = tokens;
  if (!contiguous) {
    ds->offsets_.resize(S + 1);
    ds->pointers_.resize(S);
    RETURN_IF_ERROR(for_each_chunk([&](uint64_t s0, uint64_t k, const unsigned char* lengths,
                                       const unsigned char* pointers) -> absl::Status {
      for (uint64_t j = 0; j < k; ++j) {
        ds->offsets_[s0 + j + 1] = ds->offsets_[s0 + j] + int64_t{LoadU32(lengths + 4 * j)};
        ds->pointers_[s0 + j] = LoadI64(pointers + 8 * j);
      }
      return absl::OkStatus();
    }));
  }
  // Read through; from now on (a sequence's place) looked up at random.
  idx->Advise(FileAccess::kRandom);
  ds->idx_ = std::move(idx);
  ds->bin_ = std::move(bin);
  return ds;
}

absl::StatusOr<int64_t> IndexedDataset::Length(int64_t sequence) const {
  if (!contiguous()) return offsets_[sequence + 1] - offsets_[sequence];
  unsigned char bytes[4];
  RETURN_IF_ERROR(idx_->ReadAt(kIndexedHeaderBytes + 4 * sequence, 4, bytes));
  return int64_t{LoadU32(bytes)};
}

absl::StatusOr<int64_t> IndexedDataset::Pointer(int64_t sequence) const {
  if (!contiguous()) return pointers_[sequence];
  unsigned char bytes[8];
  RETURN_IF_ERROR(idx_->ReadAt(pointers_at_ + 8 * sequence, 8, bytes));
  return LoadI64(bytes);
}

int64_t IndexedDataset::Decode(const unsigned char* p) const {
  switch (width_) {
    case 1:
      return is_signed_ ? int64_t{static_cast<int8_t>(p[0])} : int64_t{p[0]};
    case 2: {
      const uint16_t u = static_cast<uint16_t>(p[0] | p[1] << 8);
      return is_signed_ ? int64_t{static_cast<int16_t>(u)} : int64_t{u};
    }
    case 4:
      return int64_t{static_cast<int32_t>(LoadU32(p))};
    default:
      return LoadI64(p);
  }
}

absl::StatusOr<int64_t> IndexedDataset::FirstOf(int64_t sequence) const {
  if (!contiguous()) return offsets_[sequence];
  ASSIGN_OR_RETURN(const int64_t pointer, Pointer(sequence));
  return pointer / width_;
}

absl::StatusOr<int64_t> IndexedDataset::SequenceOf(int64_t position) const {
  // The last sequence whose first position is <= position (an empty sequence shares its first
  // position with the next one, which is the one that holds the token).
  int64_t lo = 0, hi = num_sequences_;
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    ASSIGN_OR_RETURN(const int64_t first, FirstOf(mid));
    if (first <= position) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  return lo - 1;
}

absl::Status IndexedDataset::ReadStored(int64_t begin, int64_t n, int64_t* out) const {
  unsigned char bytes[kMaxStoredRead * 8];
  if (contiguous()) {
    RETURN_IF_ERROR(bin_->ReadAt(begin * width_, n * width_, bytes));
  } else {
    // One read per sequence the range meets, of the part of it in the range.
    ASSIGN_OR_RETURN(int64_t s, SequenceOf(begin));
    int64_t k = begin - offsets_[s];
    for (int64_t done = 0; done < n;) {
      while (k >= offsets_[s + 1] - offsets_[s]) {
        ++s;
        k = 0;
      }
      const int64_t run = std::min(n - done, offsets_[s + 1] - offsets_[s] - k);
      ASSIGN_OR_RETURN(const int64_t pointer, Pointer(s));
      RETURN_IF_ERROR(bin_->ReadAt(pointer + k * width_, run * width_, bytes + done * width_));
      done += run;
      k += run;
    }
  }
  for (int64_t i = 0; i < n; ++i) out[i] = Decode(bytes + i * width_);
  return absl::OkStatus();
}

void IndexedDataset::Prefetch(int64_t position) const {
  if (contiguous()) {
    bin_->WillNeed(position * width_, width_);
    return;
  }
  // A hint: an index that cannot be read now is the read's to report.
  const absl::StatusOr<int64_t> s = SequenceOf(position);
  if (!s.ok()) return;
  const absl::StatusOr<int64_t> pointer = Pointer(*s);
  if (pointer.ok()) bin_->WillNeed(*pointer + (position - offsets_[*s]) * width_, width_);
}

absl::Status IndexedDataset::BadToken(int64_t position, int64_t value) const {
  ASSIGN_OR_RETURN(const int64_t s, SequenceOf(position));
  ASSIGN_OR_RETURN(const int64_t first, FirstOf(s));
  ASSIGN_OR_RETURN(const int64_t pointer, Pointer(s));
  const int64_t k = position - first;
  return absl::InvalidArgumentError(
      absl::StrCat("indexed dataset data ", DataPath(prefix_), ": token ", k, " of sequence ", s,
                   " (byte offset ", pointer + k * width_, ") has value ", value,
                   ", outside the model's vocab [0, ", vocab_, ")"));
}

absl::StatusOr<std::vector<int32_t>> IndexedDataset::Sequence(int64_t i) const {
  ASSIGN_OR_RETURN(const int64_t length, Length(i));
  ASSIGN_OR_RETURN(const int64_t first, FirstOf(i));
  std::vector<int32_t> out(static_cast<size_t>(length));
  RETURN_IF_ERROR(Read(first, length, out.data()));
  return out;
}

}  // namespace furnace::data
