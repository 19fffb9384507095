#include "controller/service/rendezvous.h"

#include <algorithm>
#include <optional>
#include <unordered_map>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "runtime/base/utf8.h"

namespace furnace::controller {

struct Rendezvous::KeyWait {
  std::vector<std::string> keys;
  size_t seen = 0;  // keys[0, seen) exist
  double timeout_s = 0;
  std::function<void(Values)> done;
  bool finished = false;
  std::multimap<std::string, std::shared_ptr<KeyWait>>::iterator slot;  // valid unless finished
};

struct Rendezvous::IndexedWait {
  uint32_t count = 0;
  std::function<void(absl::StatusOr<Arrivals>)> done;
  bool finished = false;
  std::multimap<uint32_t, std::shared_ptr<IndexedWait>>::iterator slot;  // valid unless finished
};

// Which indices of one prefix exist. Built when the prefix is first waited on, then kept by Set.
// Which indices of one prefix exist. Built when the prefix is first waited on, then kept by Set.
struct Rendezvous::IndexedGroup {
  std::vector<bool> have;
  uint32_t marked = 0;                                          // indices that exist
  uint32_t first_missing = 0;                                   // every index below it exists
  std::multimap<uint32_t, std::shared_ptr<IndexedWait>> waits;  // by count

  void Mark(uint32_t index) {
    if (have.size() <= index) have.resize(index + 1);
    if (have[index]) return;
    have[index] = true;
    ++marked;
    while (first_missing < have.size() && have[first_missing]) ++first_missing;
  }
  // O(1) for `present` when no index at or past `count` exists (the usual case); the scan for
  // the missing ones stops after kMaxMissingListed of them.
  Arrivals Answer(uint32_t count) const {
    Arrivals a;
    a.complete = first_missing >= count;
    if (a.complete) {
      a.present = count;
      return a;
    }
    if (have.size() <= count) {
      a.present = marked;
    } else {
      a.present = first_missing;
      for (uint32_t i = first_missing; i < count; ++i) a.present += have[i] ? 1 : 0;
    }
    for (uint32_t i = first_missing; i < count && a.missing.size() < kMaxMissingListed; ++i) {
      if (i >= have.size() || !have[i]) a.missing.push_back(i);
    }
    return a;
  }
};

struct Rendezvous::ScopeState {
  std::set<std::string> workers;  // set when the scope opens; guarded by Rendezvous::mu_
  Limits limits;                  // set when the scope opens; guarded by Rendezvous::mu_
  std::mutex mu;
  // The bytes (key and value) of each key admitted or set, and their sum: what Admit bounds.
  std::unordered_map<std::string, size_t> sizes;
  size_t bytes = 0;
  // Closed or shut down: Set is ignored and every wait gets end_status. Guarded by mu, as the rest.
  bool ended = false;
  absl::Status end_status;
  std::unordered_map<std::string, std::string> values;
  std::multimap<std::string, std::shared_ptr<KeyWait>> key_waits;  // by the key each misses
  std::map<std::string, IndexedGroup> groups;                      // by prefix
};

namespace {

// The index `key` names under `prefix`, if it is one.
std::optional<uint32_t> IndexOf(const std::string& key, const std::string& prefix) {
  if (!absl::StartsWith(key, prefix) || key.size() == prefix.size()) return std::nullopt;
  const size_t digits = key.size() - prefix.size();
  if (digits > 7 || (digits > 1 && key[prefix.size()] == '0')) return std::nullopt;
  uint32_t n = 0;
  for (size_t i = prefix.size(); i < key.size(); ++i) {
    if (key[i] < '0' || key[i] > '9') return std::nullopt;
    n = n * 10 + static_cast<uint32_t>(key[i] - '0');
  }
  if (n >= Rendezvous::kMaxIndexedCount) return std::nullopt;
  return n;
}

absl::Status MissingKeys(const std::vector<std::string>& keys, size_t seen,
                         const std::unordered_map<std::string, std::string>& values,
                         double timeout_s) {
  std::vector<std::string> missing;
  for (size_t i = seen; i < keys.size(); ++i) {
    if (values.find(keys[i]) == values.end()) missing.push_back(keys[i]);
  }
  // A thousand-rank rendezvous can miss thousands of keys: the first few name the problem.
  constexpr size_t kNamed = 16;
  std::string named =
      absl::StrJoin(missing.begin(), missing.begin() + std::min(missing.size(), kNamed), ", ");
  if (missing.size() > kNamed) named += absl::StrFormat(", ... (%d more)", missing.size() - kNamed);
  return absl::DeadlineExceededError(absl::StrFormat(
      "rendezvous: keys still missing after %.3f s: [%s]", std::max(timeout_s, 0.0), named));
}

std::vector<std::string> ValuesOf(const std::vector<std::string>& keys,
                                  const std::unordered_map<std::string, std::string>& values) {
  std::vector<std::string> out;
  out.reserve(keys.size());
  for (const std::string& key : keys) out.push_back(values.at(key));
  return out;
}

absl::Status ClosedError(const Rendezvous::Scope& scope) {
  return absl::FailedPreconditionError(absl::StrCat("rendezvous scope of job ", scope.first,
                                                    " attempt ", scope.second, " is closed"));
}

absl::Status ShutDownError() {
  return absl::UnavailableError("rendezvous: the controller is shutting down; retry");
}

void RunAll(std::vector<std::function<void()>>& answers) {
  for (auto& answer : answers) answer();
}

}  // namespace

Rendezvous::~Rendezvous() { Shutdown(); }

absl::Status Rendezvous::Refused(const Scope& scope) {
  std::lock_guard<std::mutex> lock(mu_);
  if (shut_down_) return ShutDownError();
  if (ClosedLocked(scope)) return ClosedError(scope);
  return absl::FailedPreconditionError(absl::StrCat("rendezvous: attempt ", scope.second,
                                                    " of job ", scope.first, " is not running"));
}

std::shared_ptr<Rendezvous::ScopeState> Rendezvous::Find(const Scope& scope) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = scopes_.find(scope);
  return it == scopes_.end() ? nullptr : it->second;
}

Rendezvous::Limits Rendezvous::LimitsFor(size_t ranks) {
  Limits limits;
  limits.ranks = ranks;
  limits.value_bytes = kBaseValueBytes + kValueBytesPerRank * ranks;
  limits.keys = kBaseKeys + kKeysPerRank * ranks;
  limits.bytes = kBaseBytes + kValuesPerRank * ranks * limits.value_bytes;
  return limits;
}

void Rendezvous::OpenScope(const Scope& scope, std::set<std::string> workers) {
  std::lock_guard<std::mutex> lock(mu_);
  if (shut_down_ || ClosedLocked(scope)) return;
  auto& state = scopes_[scope];
  if (!state) state = std::make_shared<ScopeState>();
  state->limits = LimitsFor(workers.size());  // one rank a worker
  state->workers = std::move(workers);
}

namespace {

// Records that `key` holds `bytes` (its key and value) in `sizes` and their sum `total`.
void Account(std::unordered_map<std::string, size_t>& sizes, size_t& total, const std::string& key,
             size_t bytes) {
  auto [it, added] = sizes.try_emplace(key, 0);
  total = total - it->second + bytes;
  it->second = bytes;
}

// A key as an error names it: the rank's own bytes, kept short and valid UTF-8.
std::string KeyName(const std::string& key) { return SanitizeUtf8(key, 128); }

std::string Bytes(size_t n) {
  if (n >= (size_t{1} << 20) && n % (size_t{1} << 20) == 0) return absl::StrCat(n >> 20, " MiB");
  if (n >= 1024 && n % 1024 == 0) return absl::StrCat(n >> 10, " KiB");
  return absl::StrCat(n, " bytes");
}

}  // namespace

absl::Status Rendezvous::Admit(const Scope& scope, const std::string& key, size_t value_bytes) {
  Limits limits;
  std::shared_ptr<ScopeState> state;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = scopes_.find(scope);
    if (it != scopes_.end()) {
      state = it->second;
      limits = state->limits;
    }
  }
  if (!state) return Refused(scope);
  const std::string attempt = absl::StrCat("attempt ", scope.second, " of job ", scope.first, " (",
                                           limits.ranks, limits.ranks == 1 ? " rank)" : " ranks)");
  if (key.size() > kMaxKeyBytes) {
    return absl::ResourceExhaustedError(absl::StrCat("rendezvous: a key of ", key.size(),
                                                     " bytes in ", attempt, "; a key is at most ",
                                                     Bytes(kMaxKeyBytes)));
  }
  if (value_bytes > limits.value_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "rendezvous: a value of ", value_bytes, " bytes for key ", KeyName(key), " in ", attempt,
        "; a value is at most ", Bytes(limits.value_bytes), " there (", Bytes(kBaseValueBytes),
        " + ", kValueBytesPerRank, " bytes per rank; a Gloo group's rendezvous takes 136 a peer)"));
  }
  std::lock_guard<std::mutex> lock(state->mu);
  const auto known = state->sizes.find(key);
  const size_t before = known == state->sizes.end() ? 0 : known->second;
  if (known == state->sizes.end() && state->sizes.size() >= limits.keys) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "rendezvous: ", attempt, " holds ", state->sizes.size(), " keys, the most it may (",
        kBaseKeys, " + ", kKeysPerRank, " per rank); key ", KeyName(key), " is refused"));
  }
  const size_t after = state->bytes - before + key.size() + value_bytes;
  if (after > limits.bytes) {
    return absl::ResourceExhaustedError(
        absl::StrCat("rendezvous: key ", KeyName(key), " would bring ", attempt, " to ", after,
                     " bytes of keys and values, over the ", Bytes(limits.bytes), " it may hold (",
                     Bytes(kBaseBytes), " + ", kValuesPerRank, " largest values per rank)"));
  }
  Account(state->sizes, state->bytes, key, key.size() + value_bytes);
  return absl::OkStatus();
}

bool Rendezvous::ClosedLocked(const Scope& scope) const {
  auto it = closed_through_.find(scope.first);
  return it != closed_through_.end() && scope.second <= it->second;
}

absl::Status Rendezvous::CheckOpen(const Scope& scope) {
  return Find(scope) ? absl::OkStatus() : Refused(scope);
}

absl::Status Rendezvous::CheckCaller(const Scope& scope, const std::string& worker) {
  bool open = false, held = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = scopes_.find(scope);
    open = it != scopes_.end();
    held = open && it->second->workers.count(worker) > 0;
  }
  if (!open) return Refused(scope);
  if (worker.empty() || held) return absl::OkStatus();
  return absl::PermissionDeniedError(absl::StrCat("rendezvous: worker ", worker,
                                                  " holds no rank of attempt ", scope.second,
                                                  " of job ", scope.first));
}

void Rendezvous::Set(const Scope& scope, const std::string& key, const std::string& value) {
  std::shared_ptr<ScopeState> state = Find(scope);
  if (!state) return;
  std::vector<std::function<void()>> answers;
  {
    std::lock_guard<std::mutex> lock(state->mu);
    if (state->ended) return;  // closed after Find: refused, as a closed scope asks
    // Keys reloaded after a controller restart were admitted by the one before.
    Account(state->sizes, state->bytes, key, key.size() + value.size());
    const bool added = state->values.insert_or_assign(key, value).second;
    if (!added) return;  // an overwrite completes nothing new
    // Key waits that missed exactly this key move on to their next missing one.
    auto [first, last] = state->key_waits.equal_range(key);
    std::vector<std::shared_ptr<KeyWait>> woken;
    for (auto it = first; it != last; ++it) woken.push_back(it->second);
    state->key_waits.erase(first, last);
    for (auto& w : woken) {
      while (w->seen < w->keys.size() && state->values.count(w->keys[w->seen])) ++w->seen;
      if (w->seen < w->keys.size()) {
        w->slot = state->key_waits.emplace(w->keys[w->seen], w);
        continue;
      }
      w->finished = true;
      answers.push_back(
          [w, values = ValuesOf(w->keys, state->values)]() mutable { w->done(std::move(values)); });
    }
    for (auto& [prefix, group] : state->groups) {
      const std::optional<uint32_t> index = IndexOf(key, prefix);
      if (!index) continue;
      group.Mark(*index);
      auto end = group.waits.upper_bound(group.first_missing);
      for (auto it = group.waits.begin(); it != end; ++it) {
        std::shared_ptr<IndexedWait> w = it->second;
        w->finished = true;
        answers.push_back([w, a = group.Answer(w->count)]() mutable { w->done(std::move(a)); });
      }
      group.waits.erase(group.waits.begin(), end);
    }
  }
  RunAll(answers);
}

void Rendezvous::Get(const Scope& scope, const std::vector<std::string>& keys, double timeout_s,
                     std::function<void(Values)> done) {
  std::shared_ptr<ScopeState> state = Find(scope);
  if (!state) {
    done(Refused(scope));
    return;
  }
  auto w = std::make_shared<KeyWait>();
  w->keys = keys;
  w->timeout_s = std::min(timeout_s, kMaxWaitS);
  w->done = std::move(done);
  std::optional<Values> now;
  {
    std::lock_guard<std::mutex> lock(state->mu);
    if (state->ended) {
      now = state->end_status;
    } else {
      while (w->seen < w->keys.size() && state->values.count(w->keys[w->seen])) ++w->seen;
      if (w->seen == w->keys.size()) {
        now = ValuesOf(w->keys, state->values);
      } else if (w->timeout_s <= 0) {
        now = MissingKeys(w->keys, w->seen, state->values, w->timeout_s);
      } else {
        w->slot = state->key_waits.emplace(w->keys[w->seen], w);
      }
    }
  }
  if (now) {
    w->done(std::move(*now));
    return;
  }
  std::weak_ptr<ScopeState> weak_state = state;
  std::weak_ptr<KeyWait> weak_wait = w;
  timer_.After(w->timeout_s, [weak_state, weak_wait] {
    std::shared_ptr<ScopeState> s = weak_state.lock();
    std::shared_ptr<KeyWait> w = weak_wait.lock();
    if (!s || !w) return;
    absl::Status missing;
    {
      std::lock_guard<std::mutex> lock(s->mu);
      if (w->finished) return;
      w->finished = true;
      s->key_waits.erase(w->slot);
      missing = MissingKeys(w->keys, w->seen, s->values, w->timeout_s);
    }
    w->done(std::move(missing));
  });
}

void Rendezvous::WaitIndexed(const Scope& scope, const std::string& prefix, uint32_t count,
                             double timeout_s, std::function<void(absl::StatusOr<Arrivals>)> done) {
  if (count > kMaxIndexedCount) {
    done(absl::InvalidArgumentError(absl::StrFormat(
        "rendezvous: an indexed wait for %d keys; at most %d", count, kMaxIndexedCount)));
    return;
  }
  std::shared_ptr<ScopeState> state = Find(scope);
  if (!state) {
    done(Refused(scope));
    return;
  }
  auto w = std::make_shared<IndexedWait>();
  w->count = count;
  w->done = std::move(done);
  timeout_s = std::min(timeout_s, kMaxWaitS);
  std::optional<absl::StatusOr<Arrivals>> now;
  {
    std::lock_guard<std::mutex> lock(state->mu);
    if (state->ended) {
      now = state->end_status;
    } else {
      auto [it, created] = state->groups.try_emplace(prefix);
      IndexedGroup& group = it->second;
      if (created) {
        for (const auto& [key, value] : state->values) {
          if (auto index = IndexOf(key, prefix)) group.Mark(*index);
        }
      }
      if (group.first_missing >= count || timeout_s <= 0) {
        now = group.Answer(count);
      } else {
        w->slot = group.waits.emplace(count, w);
      }
    }
  }
  if (now) {
    w->done(std::move(*now));
    return;
  }
  std::weak_ptr<ScopeState> weak_state = state;
  std::weak_ptr<IndexedWait> weak_wait = w;
  timer_.After(timeout_s, [weak_state, weak_wait, prefix] {
    std::shared_ptr<ScopeState> s = weak_state.lock();
    std::shared_ptr<IndexedWait> w = weak_wait.lock();
    if (!s || !w) return;
    Arrivals a;
    {
      std::lock_guard<std::mutex> lock(s->mu);
      if (w->finished) return;
      w->finished = true;
      IndexedGroup& group = s->groups.at(prefix);
      group.waits.erase(w->slot);
      a = group.Answer(w->count);
    }
    w->done(std::move(a));
  });
}

bool Rendezvous::Has(const Scope& scope, const std::string& key) {
  std::shared_ptr<ScopeState> state = Find(scope);
  if (!state) return false;
  std::lock_guard<std::mutex> lock(state->mu);
  return !state->ended && state->values.count(key) > 0;
}

std::vector<std::function<void()>> Rendezvous::EndAll(ScopeState& state, const absl::Status& fail) {
  std::vector<std::function<void()>> answers;
  std::lock_guard<std::mutex> lock(state.mu);
  state.ended = true;
  state.end_status = fail;
  state.values.clear();
  for (auto& [key, w] : state.key_waits) {
    w->finished = true;
    answers.push_back([w = w, fail] { w->done(fail); });
  }
  state.key_waits.clear();
  for (auto& [prefix, group] : state.groups) {
    for (auto& [count, w] : group.waits) {
      w->finished = true;
      answers.push_back([w = w, fail] { w->done(fail); });
    }
    group.waits.clear();
  }
  return answers;
}

void Rendezvous::Close(const Scope& scope) {
  std::shared_ptr<ScopeState> state;
  {
    std::lock_guard<std::mutex> lock(mu_);
    uint32_t& through = closed_through_[scope.first];
    through = std::max(through, scope.second);
    auto it = scopes_.find(scope);
    if (it == scopes_.end()) return;
    state = std::move(it->second);
    scopes_.erase(it);
  }
  std::vector<std::function<void()>> answers = EndAll(*state, ClosedError(scope));
  RunAll(answers);
}

void Rendezvous::Shutdown() {
  std::map<Scope, std::shared_ptr<ScopeState>> scopes;
  {
    std::lock_guard<std::mutex> lock(mu_);
    shut_down_ = true;
    scopes.swap(scopes_);
  }
  for (auto& [scope, state] : scopes) {
    std::vector<std::function<void()>> answers = EndAll(*state, ShutDownError());
    RunAll(answers);
  }
}

}  // namespace furnace::controller
