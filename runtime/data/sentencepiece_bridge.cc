// The SentencePiece module (sentencepiece_bridge.h says why it is one). Includes SentencePiece and
// nothing of Abseil.
#include "runtime/data/sentencepiece_bridge.h"

#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>

// Exported by libsentencepiece but declared in no installed header.
namespace sentencepiece::logging {
void SetMinLogLevel(int v);
}  // namespace sentencepiece::logging

namespace furnace::data::spm {
namespace {

// The few fields of a serialized ModelProto (sentencepiece_model.proto) that say how the model
// treats the start of a text, read from the protobuf wire format: a singular field seen twice
// takes its last value, and a message field seen twice is merged, as protobuf parses them.
struct StartOfText {
  bool add_dummy_prefix = true;             // NormalizerSpec field 3
  bool remove_extra_whitespaces = true;     // NormalizerSpec field 4
  bool treat_whitespace_as_suffix = false;  // TrainerSpec field 24
};

bool ReadVarint(std::string_view& in, uint64_t* value) {
  *value = 0;
  for (int shift = 0; shift < 64 && !in.empty(); shift += 7) {
    const uint8_t byte = static_cast<uint8_t>(in.front());
    in.remove_prefix(1);
    *value |= uint64_t{byte & 0x7Fu} << shift;
    if ((byte & 0x80) == 0) return true;
  }
  return false;
}

// Calls on_field(number, wire_type, varint value, length-delimited bytes, the field's bytes) for
// each field of `message`; false when it does not parse.
template <typename OnField>
bool ForEachField(std::string_view message, OnField on_field) {
  while (!message.empty()) {
    const std::string_view start = message;
    uint64_t tag = 0, value = 0;
    if (!ReadVarint(message, &tag)) return false;
    std::string_view bytes;
    switch (tag & 7) {
      case 0:
        if (!ReadVarint(message, &value)) return false;
        break;
      case 1:
      case 5: {
        const size_t width = (tag & 7) == 1 ? 8 : 4;
        if (message.size() < width) return false;
        message.remove_prefix(width);
        break;
      }
      case 2:
        if (!ReadVarint(message, &value) || value > message.size()) return false;
        bytes = message.substr(0, value);
        message.remove_prefix(value);
        break;
      default:
        return false;  // groups: not in sentencepiece_model.proto
    }
    on_field(tag >> 3, tag & 7, value, bytes, start.substr(0, start.size() - message.size()));
  }
  return true;
}

StartOfText ReadStartOfText(std::string_view model) {
  StartOfText out;
  ForEachField(model, [&](uint64_t number, uint64_t wire, uint64_t, std::string_view bytes,
                          std::string_view) {
    if (wire != 2) return;
    if (number == 3) {  // normalizer_spec
      ForEachField(bytes,
                   [&](uint64_t n, uint64_t w, uint64_t v, std::string_view, std::string_view) {
                     if (w == 0 && n == 3) out.add_dummy_prefix = v != 0;
                     if (w == 0 && n == 4) out.remove_extra_whitespaces = v != 0;
                   });
    } else if (number == 2) {  // trainer_spec
      ForEachField(bytes,
                   [&](uint64_t n, uint64_t w, uint64_t v, std::string_view, std::string_view) {
                     if (w == 0 && n == 24) out.treat_whitespace_as_suffix = v != 0;
                   });
    }
  });
  return out;
}

// The model without its dummy prefix: every top-level field but the self-test samples (field 4,
// which were segmented with the prefix and would fail the load's self-test), then a
// normalizer_spec of add_dummy_prefix false, which protobuf merges into the model's own.
std::string WithoutDummyPrefix(std::string_view model) {
  std::string out;
  out.reserve(model.size() + 4);
  ForEachField(model,
               [&](uint64_t number, uint64_t, uint64_t, std::string_view, std::string_view field) {
                 if (number != 4) out.append(field);
               });
  out.append("\x1a\x02\x18\x00", 4);  // field 3 (2 bytes: field 3 = false)
  return out;
}

class ProcessorImpl final : public Processor {
 public:
  // A model that adds a dummy whitespace to each text it encodes and keeps whitespace as it is
  // (Llama's, Mistral's) would add a "▁" to every part of a document encoded in parts: the parts
  // that do not start the document (or, where the dummy is a suffix, do not end it) are encoded
  // by a second copy of the model without it. A model that removes extra whitespace strips each
  // part's leading and trailing whitespace and adds the dummy back: where its normalizer makes
  // the newline before a cut a space (nmt_nfkc, T5's), that is the one "▁" the whole document
  // has there, so it encodes every part as it is (elsewhere a part gains a "▁", which no copy of
  // the model could take back without changing how it treats the whitespace inside the part).
  sentencepiece::util::Status Load(const std::string& serialized) {
    sentencepiece::util::Status status = sp_.LoadFromSerializedProto(serialized);
    if (!status.ok()) return status;
    const StartOfText start = ReadStartOfText(serialized);
    suffix_ = start.treat_whitespace_as_suffix;
    if (start.add_dummy_prefix && !start.remove_extra_whitespaces) {
      no_dummy_ = std::make_unique<sentencepiece::SentencePieceProcessor>();
      status = no_dummy_->LoadFromSerializedProto(WithoutDummyPrefix(serialized));
    }
    return status;
  }
  bool Encode(std::string_view text, bool document_start, bool document_end, std::vector<int>* ids,
              std::string* error) const override {
    const bool dummy = suffix_ ? document_end : document_start;
    const sentencepiece::SentencePieceProcessor& sp =
        dummy || no_dummy_ == nullptr ? sp_ : *no_dummy_;
    const sentencepiece::util::Status status = sp.Encode(text, ids);
    if (!status.ok()) *error = status.ToString();
    return status.ok();
  }
  bool Decode(const std::vector<int>& ids, std::string* text, std::string* error) const override {
    const sentencepiece::util::Status status = sp_.Decode(ids, text);
    if (!status.ok()) *error = status.ToString();
    return status.ok();
  }
  int piece_size() const override { return sp_.GetPieceSize(); }
  int eos_id() const override { return sp_.eos_id(); }

 private:
  sentencepiece::SentencePieceProcessor sp_;
  bool suffix_ = false;  // the model's dummy whitespace is a suffix
  // The model without its dummy whitespace; null where sp_ encodes every part.
  std::unique_ptr<sentencepiece::SentencePieceProcessor> no_dummy_;
};

// A SentenceSource as SentencePiece's iterator; a source's error stops the training.
class SourceIterator final : public sentencepiece::SentenceIterator {
 public:
  explicit SourceIterator(SentenceSource* source) : source_(source) { Next(); }
  bool done() const override { return done_; }
  void Next() override { done_ = !source_->Next(&value_); }
  const std::string& value() const override { return value_; }
  sentencepiece::util::Status status() const override {
    const std::string error = source_->error();
    if (error.empty()) return sentencepiece::util::Status();
    return sentencepiece::util::Status(sentencepiece::util::StatusCode::kNotFound, error);
  }

 private:
  SentenceSource* source_;
  std::string value_;
  bool done_ = false;
};

class LibraryImpl final : public Library {
 public:
  std::unique_ptr<Processor> Load(const std::string& serialized,
                                  std::string* error) const override {
    auto p = std::make_unique<ProcessorImpl>();
    const sentencepiece::util::Status status = p->Load(serialized);
    if (!status.ok()) {
      *error = status.ToString();
      return nullptr;
    }
    return p;
  }
  bool Train(const std::map<std::string, std::string>& flags, SentenceSource* sentences,
             std::string* model, std::string* error) const override {
    const std::unordered_map<std::string, std::string> kwargs(flags.begin(), flags.end());
    SourceIterator iterator(sentences);
    const sentencepiece::util::Status status =
        sentencepiece::SentencePieceTrainer::Train(kwargs, &iterator, model);
    if (!sentences->error().empty()) {
      *error = sentences->error();
      return false;
    }
    if (!status.ok()) *error = status.ToString();
    return status.ok();
  }
  void SetLogLevel(int level) const override { sentencepiece::logging::SetMinLogLevel(level); }
};

}  // namespace
}  // namespace furnace::data::spm

extern "C" const furnace::data::spm::Library* FurnaceSentencePieceLibrary() {
  static const furnace::data::spm::LibraryImpl library;
  return &library;
}
