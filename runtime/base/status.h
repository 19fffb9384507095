// Error propagation for everything above the kernels: absl::Status / absl::StatusOr with the two
// macros the codebase uses. No exception crosses a module boundary; nothing but main() exits.
#pragma once

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define FURNACE_CONCAT_INNER_(a, b) a##b
#define FURNACE_CONCAT_(a, b) FURNACE_CONCAT_INNER_(a, b)

// Returns from the enclosing function if `expr` (an absl::Status) is not OK.
#define RETURN_IF_ERROR(expr)                          \
  do {                                                 \
    ::absl::Status furnace_status_ = (expr);           \
    if (!furnace_status_.ok()) return furnace_status_; \
  } while (0)

// `ASSIGN_OR_RETURN(auto x, F())`: assigns the value of a StatusOr or returns its error.
#define ASSIGN_OR_RETURN(lhs, expr) \
  ASSIGN_OR_RETURN_IMPL_(FURNACE_CONCAT_(furnace_statusor_, __LINE__), lhs, expr)
#define ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr)   \
  auto tmp = (expr);                             \
  if (!tmp.ok()) return std::move(tmp).status(); \
  lhs = std::move(tmp).value()
