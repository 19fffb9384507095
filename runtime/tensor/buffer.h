// Buffer: a move-only RAII handle to bytes handed out by a DeviceArena or a HostPool. Destroying
// (or Reset()ing) it returns the bytes to their owner, which updates its accounting. The owner
// must outlive every Buffer it handed out. A Buffer is used by one thread at a time; returning
// bytes is thread-safe (the owners lock).
#pragma once

#include <cstdint>
#include <string>
#include <utility>

namespace furnace::tensor {

class Buffer;

// Implemented by DeviceArena and HostPool.
class BufferOwner {
 public:
  virtual ~BufferOwner() = default;

 private:
  friend class Buffer;
  virtual void Return(void* data, uint64_t bytes) = 0;
};

class Buffer {
 public:
  Buffer() = default;
  Buffer(BufferOwner* owner, void* data, uint64_t bytes, std::string tag)
      : owner_(owner), data_(data), bytes_(bytes), tag_(std::move(tag)) {}
  ~Buffer() { Reset(); }

  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  Buffer(Buffer&& other) noexcept { *this = std::move(other); }
  Buffer& operator=(Buffer&& other) noexcept {
    if (this != &other) {
      Reset();
      owner_ = std::exchange(other.owner_, nullptr);
      data_ = std::exchange(other.data_, nullptr);
      bytes_ = std::exchange(other.bytes_, 0);
      tag_ = std::move(other.tag_);
    }
    return *this;
  }

  // Returns the bytes to the owner now; the Buffer becomes empty.
  void Reset() {
    if (owner_ != nullptr) owner_->Return(data_, bytes_);
    owner_ = nullptr;
    data_ = nullptr;
    bytes_ = 0;
  }

  bool valid() const { return owner_ != nullptr; }
  void* data() const { return data_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(data_);
  }
  uint64_t bytes() const { return bytes_; }
  const std::string& tag() const { return tag_; }

 private:
  BufferOwner* owner_ = nullptr;
  void* data_ = nullptr;
  uint64_t bytes_ = 0;
  std::string tag_;
};

}  // namespace furnace::tensor
