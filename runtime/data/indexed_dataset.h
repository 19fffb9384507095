// Megatron-LM's memory-mapped indexed dataset (megatron/core/datasets/indexed_dataset.py), the
// format Megatron, NeMo and their derivatives write with preprocess_data.py: PREFIX.bin holds the
// token ids of every sequence back to back; PREFIX.idx describes them (little-endian):
//
//   offset 0   char[9]  magic "MMIDIDX\0\0"
//          9   u64      version (1: the only version Megatron has written)
//          17  u8       dtype code of the .bin tokens: 1 uint8, 2 int8, 3 int16, 4 int32,
//                       5 int64, 8 uint16 (6 float64 and 7 float32 exist in Megatron's table and
//                       are refused: not token ids)
//          18  u64      S, the sequence count
//          26  u64      D, the document-index count (documents + 1)
//          34  i32[S]   sequence lengths in tokens
//              i64[S]   sequence pointers: byte offset of each sequence in the .bin
//              i64[D]   document indices: sequence index where each document starts, 0 first,
//                       S last
//
// Read: version 1 with those integer dtypes. Refused with an error naming the file and the
// found and supported values: another magic (e.g. the legacy "TNTIDX" cached format), another
// version, a float or unknown dtype, an .idx whose size is not exactly that layout (a multimodal
// index, which appends i8[S] sequence modes, is refused as such), negative lengths, pointers that
// are not increasing and non-overlapping, not a multiple of the token width (Megatron's writer
// never makes one) or run past the .bin (all as damage: DataLoss), document indices that are not
// non-decreasing from 0 to S. Token ids outside [0, vocab) are refused when read (token_stream.h:
// Open reads the .idx whole and the .bin not at all).
//
// Memory: Megatron writes the sequences back to back from byte 0, so stream position p is the
// token at byte p * width and nothing per sequence is kept. A .bin with gaps between sequences
// (another writer's; pointers need only increase) keeps each sequence's first stream position
// and byte offset, 16 bytes a sequence, and searches them.
//
// Documents: the tokens of a document are its sequences in order; Furnace reads the dataset as
// one stream of all sequences in file order (token_stream.h), so document boundaries are what
// the data's own end-of-document tokens make them.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/data/data_file.h"
#include "runtime/data/token_stream.h"

namespace furnace::data {

inline constexpr char kIndexedMagic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', '\0', '\0'};
inline constexpr uint64_t kIndexedVersion = 1;
inline constexpr int64_t kIndexedHeaderBytes = 34;

// An open, validated indexed dataset: both files open read-only and read as needed (data_file.h).
// Immutable after Open: safe to read from any thread. Owns the files (closed on destruction).
class IndexedDataset : public TokenStream {
 public:
  // Opens PREFIX.idx and PREFIX.bin and validates the index against the data's size (see above);
  // every token read must be below `vocab` (> 0: the model's; InvalidArgument naming the token's
  // place otherwise). NotFound for a missing file, InvalidArgument for a format this build does
  // not read, DataLoss for a damaged file; every message names the file.
  static absl::StatusOr<std::unique_ptr<IndexedDataset>> Open(const std::string& prefix,
                                                              int64_t vocab);
  // The two files of PREFIX: its index and its data.
  static std::string IndexPath(const std::string& prefix) { return prefix + ".idx"; }
  static std::string DataPath(const std::string& prefix) { return prefix + ".bin"; }
  ~IndexedDataset() override;
  IndexedDataset(const IndexedDataset&) = delete;
  IndexedDataset& operator=(const IndexedDataset&) = delete;

  const std::string& path() const override { return prefix_; }
  int64_t size() const override { return size_; }  // tokens in all sequences
  int64_t vocab() const override { return vocab_; }

  int64_t num_sequences() const { return num_sequences_; }
  int64_t num_documents() const { return num_documents_; }
  int dtype_code() const { return dtype_code_; }
  // Whether the sequences lie back to back from byte 0 of the .bin (Megatron's layout).
  bool contiguous() const { return offsets_.empty(); }
  // Tokens of sequence i (i < num_sequences()), checked as Read checks them.
  absl::StatusOr<std::vector<int32_t>> Sequence(int64_t i) const;

 protected:
  absl::Status ReadStored(int64_t begin, int64_t n, int64_t* out) const override;
  absl::Status BadToken(int64_t position, int64_t value) const override;
  void Prefetch(int64_t position) const override;

 private:
  IndexedDataset() = default;
  // Read from the .idx, or from offsets_ and pointers_ when there are gaps; the read's error.
  absl::StatusOr<int64_t> Length(int64_t sequence) const;
  absl::StatusOr<int64_t> Pointer(int64_t sequence) const;  // byte offset in the .bin
  absl::StatusOr<int64_t> FirstOf(int64_t sequence) const;  // stream position of its first token
  // The sequence that holds the token at stream position `position` (< size()): binary search.
  absl::StatusOr<int64_t> SequenceOf(int64_t position) const;
  int64_t Decode(const unsigned char* p) const;  // the token stored at p, as the dtype says

  std::string prefix_;
  std::unique_ptr<DataFile> idx_;
  std::unique_ptr<DataFile> bin_;
  int64_t pointers_at_ = 0;  // byte offset of i64[S] in the .idx
  // Empty when contiguous(); else (S + 1) first stream position of each sequence, and (S) its
  // byte offset in the .bin (a window meets many sequences; each is not a read of the .idx).
  std::vector<int64_t> offsets_;
  std::vector<int64_t> pointers_;
  int64_t size_ = 0;
  int64_t num_sequences_ = 0;
  int64_t num_documents_ = 0;
  int64_t vocab_ = 0;
  int dtype_code_ = 0;
  int width_ = 0;  // bytes per token
  bool is_signed_ = false;
};

}  // namespace furnace::data
