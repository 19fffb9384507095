// The rendezvous store of the ranks, as runtime/comm names it: the KvStore interface and the
// in-memory store live in runtime/base (runtime/base/kv_store.h), where the controller's
// rendezvous uses the same implementation.
#pragma once

#include "runtime/base/kv_store.h"

namespace furnace::comm {

using ::furnace::InMemoryKvStore;
using ::furnace::KvStore;

}  // namespace furnace::comm
