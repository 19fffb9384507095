// GlooStore adapts a Furnace KvStore to gloo::rendezvous::Store so that Gloo's connectFullMesh
// can rendezvous through whatever store the rank has (the controller, in production).
//
// Blocking waits are loops of KvStore::Get calls of at most one second each, calling
// `on_wait_tick` after every unsuccessful slice, so a rank can keep reporting liveness while it
// waits for slow peers. Gloo's Store contract is to throw on failure: a wait that runs past its
// timeout throws gloo::IoException("... timed out ..."), any other store error throws
// gloo::IoException with the store's message. Callers (ConnectGloo) catch at their boundary.
//
// Timeouts are measured on `clock` (RealClock() unless given; tests pass a FakeClock and a store
// that advances it, so they need no real sleeps). Holds references to the KvStore and the clock,
// which must outlive it. Thread-compatible, like Gloo's stores: one rendezvous uses it from one
// thread.
#pragma once

#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include "gloo/rendezvous/store.h"
#include "runtime/base/clock.h"
#include "runtime/comm/kv_store.h"

namespace furnace::comm {

class GlooStore : public gloo::rendezvous::Store {
 public:
  GlooStore(KvStore& store, std::chrono::milliseconds default_timeout,
            std::function<void()> on_wait_tick = nullptr, const Clock& clock = RealClock());

  void set(const std::string& key, const std::vector<char>& data) override;
  // Waits (up to the default timeout) for the key to exist, as Gloo expects.
  std::vector<char> get(const std::string& key) override;
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override;

 private:
  // Waits for every key and returns the values in key order; throws as described above.
  std::vector<std::string> WaitAndGet(const std::vector<std::string>& keys,
                                      std::chrono::milliseconds timeout);

  KvStore& store_;
  std::chrono::milliseconds default_timeout_;
  std::function<void()> on_wait_tick_;
  const Clock& clock_;
};

}  // namespace furnace::comm
