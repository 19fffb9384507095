// What the process logs through spdlog's default logger while an instance lives: the daemons'
// warnings are part of their contract with an operator (what a failed TLS handshake says, that a
// submitted file name cannot forge a line), and these tests read them. Replaces the default logger
// and puts the former one back when destroyed; one at a time. Thread-safe.
#pragma once

#include <memory>
#include <mutex>
#include <string>

#include "spdlog/sinks/base_sink.h"
#include "spdlog/spdlog.h"

namespace furnace::testing_util {

class LogCapture {
 public:
  explicit LogCapture(spdlog::level::level_enum level = spdlog::level::info)
      : sink_(std::make_shared<StringSink>()), former_(spdlog::default_logger()) {
    auto logger = std::make_shared<spdlog::logger>("capture", sink_);
    logger->set_pattern("[%l] %v");
    logger->set_level(level);
    spdlog::set_default_logger(std::move(logger));
  }
  ~LogCapture() { spdlog::set_default_logger(former_); }
  LogCapture(const LogCapture&) = delete;
  LogCapture& operator=(const LogCapture&) = delete;

  // Everything logged so far, one "[level] message" a line.
  std::string Text() const { return sink_->Text(); }
  // How many times `needle` occurs in Text().
  int Count(const std::string& needle) const {
    const std::string text = Text();
    int n = 0;
    for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) {
      ++n;
    }
    return n;
  }

 private:
  class StringSink : public spdlog::sinks::base_sink<std::mutex> {
   public:
    std::string Text() {
      std::lock_guard<std::mutex> lock(this->mutex_);
      return text_;
    }

   protected:
    void sink_it_(const spdlog::details::log_msg& msg) override {
      spdlog::memory_buf_t formatted;
      this->formatter_->format(msg, formatted);
      text_.append(formatted.data(), formatted.size());
    }
    void flush_() override {}

   private:
    std::string text_;
  };

  std::shared_ptr<StringSink> sink_;
  std::shared_ptr<spdlog::logger> former_;
};

}  // namespace furnace::testing_util
