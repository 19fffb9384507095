// FileKvStore: a KvStore backed by a directory, one file per key, so that forked processes (tests,
// local tools) can rendezvous without a server. Set writes "<dir>/.tmp-..." and renames it over
// "<dir>/<key>", so a reader sees either no file or the whole value; Get polls the directory until
// every key exists. Keys are escaped into file names ([A-Za-z0-9_-] kept, anything else %XX), so
// any key up to about 80 characters works, '/' included.
//
// Owns nothing but the path. Thread-safe and process-safe (rename(2) is atomic on one file
// system). Errors: Set returns Unavailable when the directory cannot be created or written;
// InvalidArgument for a key whose file name would be too long; Get returns DeadlineExceeded
// naming the missing keys on timeout and Unavailable when a present file cannot be read.
#pragma once

#include <string>
#include <vector>

#include "runtime/comm/kv_store.h"

namespace furnace::comm {

class FileKvStore : public KvStore {
 public:
  // The directory is created (with parents) on the first Set if it does not exist.
  explicit FileKvStore(std::string dir);

  absl::Status Set(const std::string& key, const std::string& value) override;
  // A timeout_s <= 0 checks once without waiting.
  absl::StatusOr<std::vector<std::string>> Get(const std::vector<std::string>& keys,
                                               double timeout_s) override;

  const std::string& dir() const { return dir_; }

 private:
  const std::string dir_;
};

}  // namespace furnace::comm
