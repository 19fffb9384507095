#include "runtime/data/indexed_dataset.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/escaping.h"
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
  ASSIGN_OR_RETURN(std::unique_ptr<MappedFile> idx,
                   MappedFile::Open(idx_path, "indexed dataset index", FileAccess::kSequential));
  ASSIGN_OR_RETURN(std::unique_ptr<MappedFile> bin,
                   MappedFile::Open(bin_path, "indexed dataset data", FileAccess::kRandom));
  const unsigned char* h = idx->data();
  const int64_t idx_bytes = idx->size();
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
  const unsigned char* lengths = h + kIndexedHeaderBytes;
  const unsigned char* pointers = lengths + 4 * S;
  const unsigned char* documents = pointers + 8 * S;
  if (D < 1 || LoadI64(documents) != 0 ||
      LoadI64(documents + 8 * (D - 1)) != static_cast<int64_t>(S)) {
    return damaged(absl::StrCat(
        "document indices must run from 0 to the sequence count ", S, "; found ", D, " of them",
        D >= 1
            ? absl::StrCat(" from ", LoadI64(documents), " to ", LoadI64(documents + 8 * (D - 1)))
            : ""));
  }
  for (uint64_t d = 1; d < D; ++d) {
    if (LoadI64(documents + 8 * d) < LoadI64(documents + 8 * (d - 1))) {
      return damaged(absl::StrCat("document index ", d, " (", LoadI64(documents + 8 * d),
                                  ") is below the one before it (",
                                  LoadI64(documents + 8 * (d - 1)), ")"));
    }
  }

  std::unique_ptr<IndexedDataset> ds(new IndexedDataset());
  ds->prefix_ = prefix;
  ds->vocab_ = vocab;
  ds->dtype_code_ = dtype->code;
  ds->width_ = dtype->width;
  ds->is_signed_ = dtype->is_signed;
  ds->num_sequences_ = static_cast<int64_t>(S);
  ds->num_documents_ = static_cast<int64_t>(D) - 1;
  const int64_t bin_bytes = bin->size();
  int64_t end_of_previous = 0;
  int64_t tokens = 0;
  bool contiguous = true;
  for (uint64_t i = 0; i < S; ++i) {
    const int32_t length = static_cast<int32_t>(LoadU32(lengths + 4 * i));
    const int64_t pointer = LoadI64(pointers + 8 * i);
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
  ds->size_ = tokens;
  if (!contiguous) {
    ds->offsets_.resize(S + 1);
    for (uint64_t i = 0; i < S; ++i) {
      ds->offsets_[i + 1] = ds->offsets_[i] + int64_t{LoadU32(lengths + 4 * i)};
    }
  }
  // Read through; from now on (a .bin with gaps) looked up at random.
  idx->Advise(FileAccess::kRandom);
  ds->lengths_ = lengths;
  ds->pointers_ = pointers;
  ds->bin_ = bin->data();
  ds->idx_map_ = std::move(idx);
  ds->bin_map_ = std::move(bin);
  return ds;
}

int64_t IndexedDataset::Length(int64_t sequence) const {
  return int64_t{LoadU32(lengths_ + 4 * sequence)};
}

int64_t IndexedDataset::Pointer(int64_t sequence) const {
  return LoadI64(pointers_ + 8 * sequence);
}

int64_t IndexedDataset::TokenAtByte(int64_t byte) const {
  const unsigned char* p = bin_ + byte;
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

int64_t IndexedDataset::FirstOf(int64_t sequence) const {
  return contiguous() ? Pointer(sequence) / width_ : offsets_[sequence];
}

int64_t IndexedDataset::SequenceOf(int64_t position) const {
  // The last sequence whose first position is <= position (an empty sequence shares its first
  // position with the next one, which is the one that holds the token).
  int64_t lo = 0, hi = num_sequences_;
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (FirstOf(mid) <= position) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  return lo - 1;
}

void IndexedDataset::ReadStored(int64_t begin, int64_t n, int64_t* out) const {
  if (contiguous()) {
    for (int64_t i = 0; i < n; ++i) out[i] = TokenAtByte((begin + i) * width_);
    return;
  }
  int64_t s = SequenceOf(begin);
  int64_t k = begin - offsets_[s];
  for (int64_t i = 0; i < n; ++i) {
    while (k >= Length(s)) {
      ++s;
      k = 0;
    }
    out[i] = TokenAtByte(Pointer(s) + k++ * width_);
  }
}

void IndexedDataset::Prefetch(int64_t position) const {
  const int64_t s = SequenceOf(position);
  bin_map_->WillNeed(Pointer(s) + (position - FirstOf(s)) * width_, width_);
}

absl::Status IndexedDataset::BadToken(int64_t position, int64_t value) const {
  const int64_t s = SequenceOf(position);
  const int64_t k = position - FirstOf(s);
  return absl::InvalidArgumentError(
      absl::StrCat("indexed dataset data ", DataPath(prefix_), ": token ", k, " of sequence ", s,
                   " (byte offset ", Pointer(s) + k * width_, ") has value ", value,
                   ", outside the model's vocab [0, ", vocab_, ")"));
}

absl::StatusOr<std::vector<int32_t>> IndexedDataset::Sequence(int64_t i) const {
  std::vector<int32_t> out(static_cast<size_t>(Length(i)));
  RETURN_IF_ERROR(Read(FirstOf(i), static_cast<int64_t>(out.size()), out.data()));
  return out;
}

}  // namespace furnace::data
