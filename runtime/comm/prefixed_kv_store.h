// PrefixedKvStore scopes every key of an underlying KvStore under "<prefix>/", so that several
// process groups (tp, dp, ep, ...) can rendezvous through one store without their keys (Gloo's
// fixed per-rank keys, NCCL's unique id) colliding. An empty prefix passes keys through unchanged.
//
// Holds a reference to the underlying store, which must outlive it. Thread-safe as the underlying
// store is; errors are the underlying store's (key names in messages are the prefixed ones).
#pragma once

#include <string>
#include <vector>

#include "runtime/comm/kv_store.h"

namespace furnace::comm {

class PrefixedKvStore : public KvStore {
 public:
  PrefixedKvStore(KvStore& store, std::string prefix);

  absl::Status Set(const std::string& key, const std::string& value) override;
  absl::StatusOr<std::vector<std::string>> Get(const std::vector<std::string>& keys,
                                               double timeout_s) override;

  // The key as the underlying store sees it.
  std::string Scoped(const std::string& key) const;

 private:
  KvStore& store_;
  const std::string prefix_;
};

}  // namespace furnace::comm
