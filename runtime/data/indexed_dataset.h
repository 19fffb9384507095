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
// are not increasing and non-overlapping or run past the .bin, document indices that are not
// non-decreasing from 0 to S, and token ids outside [0, vocab).
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
#include "runtime/data/mapped_file.h"
#include "runtime/data/token_stream.h"

namespace furnace::data {

inline constexpr char kIndexedMagic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', '\0', '\0'};
inline constexpr uint64_t kIndexedVersion = 1;
inline constexpr int64_t kIndexedHeaderBytes = 34;

// An open, validated indexed dataset: both files memory-mapped read-only. Immutable after Open:
// safe to read from any thread. Owns the mappings (unmapped on destruction).
class IndexedDataset : public TokenStream {
 public:
  // Opens PREFIX.idx and PREFIX.bin and validates all of both (see above); every token must be
  // below `vocab` (> 0: the model's). NotFound for a missing file, InvalidArgument for a format
  // this build does not read or a token beyond the vocab, DataLoss for a damaged file; every
  // message names the file.
  static absl::StatusOr<std::unique_ptr<IndexedDataset>> Open(const std::string& prefix,
                                                              int64_t vocab);
  // The two files of PREFIX: its index and its data.
  static std::string IndexPath(const std::string& prefix) { return prefix + ".idx"; }
  static std::string DataPath(const std::string& prefix) { return prefix + ".bin"; }
  ~IndexedDataset() override;
  IndexedDataset(const IndexedDataset&) = delete;
  IndexedDataset& operator=(const IndexedDataset&) = delete;

  const std::string& path() const override { return prefix_; }
  int64_t size() const override { return offsets_.back(); }  // tokens in all sequences
  int64_t vocab() const override { return vocab_; }
  void Read(int64_t begin, int64_t n, int32_t* out) const override;

  int64_t num_sequences() const { return static_cast<int64_t>(offsets_.size()) - 1; }
  int64_t num_documents() const { return num_documents_; }
  int dtype_code() const { return dtype_code_; }
  // Tokens of sequence i (i < num_sequences()).
  std::vector<int32_t> Sequence(int64_t i) const;

 private:
  IndexedDataset() = default;
  int64_t TokenAt(int64_t sequence, int64_t k) const;

  std::string prefix_;
  std::unique_ptr<MappedFile> idx_map_;
  std::unique_ptr<MappedFile> bin_map_;
  const unsigned char* bin_ = nullptr;
  const unsigned char* pointers_ = nullptr;  // i64[S] inside the .idx mapping
  std::vector<int64_t> offsets_;             // (S + 1) first stream token of each sequence
  int64_t num_documents_ = 0;
  int64_t vocab_ = 0;
  int dtype_code_ = 0;
  int width_ = 0;  // bytes per token
  bool is_signed_ = false;
};

}  // namespace furnace::data
