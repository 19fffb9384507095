// The seam between Furnace and SentencePiece: a standard-library-only interface, implemented in a
// module of its own (libfurnace_sentencepiece.so, sentencepiece_bridge.cc) that the process loads
// with dlopen(RTLD_LOCAL | RTLD_DEEPBIND) (sentencepiece_tokenizer.cc). Why a module:
//   - Debian's libsentencepiece carries its own copy of protobuf-lite 3.14 and exports its
//     symbols. Linked into a process that also links the system protobuf (3.21, which the CLI
//     needs for gRPC), one copy's calls bind to the other's code, and the process aborts at
//     start-up ("compiled against version 3.14.0 ... installed version 3.21.12"). Loaded with
//     RTLD_DEEPBIND, SentencePiece binds to its own copy first and the two never meet.
//     The price of RTLD_DEEPBIND: the module must not write to std::cout or std::cerr (they bind
//     to libstdc++'s own, unconstructed objects), so SentencePiece's log is switched off.
//   - sentencepiece_processor.h declares `namespace absl { using std::string_view; }`, which
//     clashes with Debian's Abseil (its absl::string_view is a class), so the file that includes
//     SentencePiece includes nothing of Abseil; this header is the only thing both sides share.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace furnace::data::spm {

inline constexpr int kLogNothing = 4;  // above FATAL (3): SentencePiece prints nothing

// A loaded model. Immutable after loading: Encode and Decode may be called from any thread.
class Processor {
 public:
  virtual ~Processor() = default;
  // Ids of `text`; false with *error set when SentencePiece refuses it. `document_start`,
  // `document_end`: whether the text starts or ends its document (a part of a document cut after
  // newlines may do neither), so the dummy whitespace a model adds at a text's start (or, as a
  // suffix, its end) is added at the document's only (sentencepiece_tokenizer.h says for which
  // models).
  virtual bool Encode(std::string_view text, bool document_start, bool document_end,
                      std::vector<int>* ids, std::string* error) const = 0;
  // Text of `ids`, every id in [0, piece_size()); false with *error set on failure.
  virtual bool Decode(const std::vector<int>& ids, std::string* text, std::string* error) const = 0;
  virtual int piece_size() const = 0;
  virtual int eos_id() const = 0;  // -1 when the model has none
};

// The sentences a model is trained on, one at a time (the trainer samples what it keeps, so the
// whole input never has to be in memory). Called from the training thread only.
class SentenceSource {
 public:
  virtual ~SentenceSource() = default;
  // The next sentence in *sentence: true; false at the end of the input or on an error (error()).
  virtual bool Next(std::string* sentence) = 0;
  // Why Next returned false when it was an error (naming the file); empty at the end of the input.
  virtual std::string error() const = 0;
};

// The module's entry points. Stateless apart from SentencePiece's global log level.
class Library {
 public:
  virtual ~Library() = default;
  // Loads a serialized ModelProto (a .model file's bytes). Null with *error set when it does not
  // parse as one.
  virtual std::unique_ptr<Processor> Load(const std::string& serialized,
                                          std::string* error) const = 0;
  // Trains a model from SentencePiece trainer flags (name -> value, as `spm_train --name=value`;
  // no `input`: the sentences come from `sentences`) and returns the serialized ModelProto in
  // *model. False with *error set when the trainer refuses (SentencePiece's own message) or
  // `sentences` fails (its error()).
  virtual bool Train(const std::map<std::string, std::string>& flags, SentenceSource* sentences,
                     std::string* model, std::string* error) const = 0;
  // SentencePiece's log level: 0 info (its default: a page per training), 1 warnings, 2 errors,
  // kLogNothing: none.
  virtual void SetLogLevel(int level) const = 0;
};

}  // namespace furnace::data::spm

// The one symbol the module exports (looked up with dlsym): its Library, alive as long as the
// module is loaded.
extern "C" const furnace::data::spm::Library* FurnaceSentencePieceLibrary();
inline constexpr char kFurnaceSentencePieceEntry[] = "FurnaceSentencePieceLibrary";
inline constexpr char kFurnaceSentencePieceModule[] = "libfurnace_sentencepiece.so";
