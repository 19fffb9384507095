#include "runtime/device/current_stream.h"

namespace furnace::device {
namespace {
thread_local Stream* current_stream = nullptr;
}  // namespace

Stream* CurrentStream() { return current_stream; }

Stream& CurrentStreamOf(Device& device) {
  return current_stream != nullptr ? *current_stream : device.default_stream();
}

StreamScope::StreamScope(Stream& stream) : previous_(current_stream) { current_stream = &stream; }

StreamScope::~StreamScope() { current_stream = previous_; }

}  // namespace furnace::device
