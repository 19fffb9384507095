#include "runtime/comm/prefixed_kv_store.h"

#include <utility>

namespace furnace::comm {

PrefixedKvStore::PrefixedKvStore(KvStore& store, std::string prefix)
    : store_(store), prefix_(std::move(prefix)) {}

std::string PrefixedKvStore::Scoped(const std::string& key) const {
  return prefix_.empty() ? key : prefix_ + "/" + key;
}

absl::Status PrefixedKvStore::Set(const std::string& key, const std::string& value) {
  return store_.Set(Scoped(key), value);
}

absl::StatusOr<std::vector<std::string>> PrefixedKvStore::Get(const std::vector<std::string>& keys,
                                                              double timeout_s) {
  std::vector<std::string> scoped;
  scoped.reserve(keys.size());
  for (const std::string& key : keys) scoped.push_back(Scoped(key));
  return store_.Get(scoped, timeout_s);
}

}  // namespace furnace::comm
