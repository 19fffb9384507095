// The SentencePiece module (sentencepiece_bridge.h says why it is one). Includes SentencePiece and
// nothing of Abseil.
#include "runtime/data/sentencepiece_bridge.h"

#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <unordered_map>

// Exported by libsentencepiece but declared in no installed header.
namespace sentencepiece::logging {
void SetMinLogLevel(int v);
}  // namespace sentencepiece::logging

namespace furnace::data::spm {
namespace {

class ProcessorImpl final : public Processor {
 public:
  sentencepiece::util::Status Load(const std::string& serialized) {
    return sp_.LoadFromSerializedProto(serialized);
  }
  bool Encode(std::string_view text, std::vector<int>* ids, std::string* error) const override {
    const sentencepiece::util::Status status = sp_.Encode(text, ids);
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
  bool Train(const std::map<std::string, std::string>& flags, std::string* model,
             std::string* error) const override {
    const std::unordered_map<std::string, std::string> kwargs(flags.begin(), flags.end());
    const sentencepiece::util::Status status =
        sentencepiece::SentencePieceTrainer::Train(kwargs, nullptr, model);
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
