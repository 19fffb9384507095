#include "controller/service/rendezvous.h"

#include "absl/strings/str_cat.h"

namespace furnace::controller {

std::shared_ptr<InMemoryKvStore> Rendezvous::Open(const Scope& scope) {
  std::lock_guard<std::mutex> lock(mu_);
  if (closed_.count(scope)) return nullptr;
  auto& store = scopes_[scope];
  if (!store) store = std::make_shared<InMemoryKvStore>();
  return store;
}

void Rendezvous::Set(const Scope& scope, const std::string& key, const std::string& value) {
  // A store closed after Open refuses the value, which is what a closed scope asks for.
  if (auto store = Open(scope)) store->Set(key, value).IgnoreError();
}

absl::StatusOr<std::vector<std::string>> Rendezvous::Get(const Scope& scope,
                                                         const std::vector<std::string>& keys,
                                                         double timeout_s) {
  auto closed = [&] {
    return absl::FailedPreconditionError(absl::StrCat(
        "rendezvous scope of job ", scope.first, " attempt ", scope.second, " is closed"));
  };
  std::shared_ptr<InMemoryKvStore> store = Open(scope);
  if (!store) return closed();
  auto values = store->Get(keys, timeout_s);
  if (absl::IsFailedPrecondition(values.status())) return closed();
  if (!values.ok()) return absl::Status(values.status().code(),
                                        absl::StrCat("rendezvous: ", values.status().message()));
  return values;
}

void Rendezvous::Close(const Scope& scope) {
  std::shared_ptr<InMemoryKvStore> store;
  {
    std::lock_guard<std::mutex> lock(mu_);
    closed_.insert(scope);
    auto it = scopes_.find(scope);
    if (it == scopes_.end()) return;
    store = std::move(it->second);
    scopes_.erase(it);
  }
  store->Close();
}

}  // namespace furnace::controller
