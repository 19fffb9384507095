// What the whole-run tests of tests/runtime/parallel check and how they run a layout: a layout as
// they list it, the bit-for-bit comparison of two runs, and a layout run in a temporary directory
// of its own.
#pragma once

#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/runtime/parallel/layout_run.h"

namespace furnace::testing {

// A layout as the whole-run tests list it: its sizes and m micro-batches per data-parallel rank.
struct Layout {
  const char* name;
  int pp, dp, tp, ep, esp, m;
};

// `model` trained for `steps` on layout `l`.
inline LayoutCase CaseOn(const Layout& l, const model::ModelConfig& model, int steps) {
  LayoutCase c;
  c.model = model;
  c.sizes.pp = l.pp;
  c.sizes.dp = l.dp;
  c.sizes.tp = l.tp;
  c.sizes.ep = l.ep;
  c.sizes.esp = l.esp;
  c.micro_batches = l.m;
  c.steps = steps;
  return c;
}

// Losses, aux losses, gradient norms and every parameter byte of `got` equal `want`'s.
inline void ExpectBitIdentical(const RunResult& got, const RunResult& want) {
  EXPECT_EQ(got.loss, want.loss);
  EXPECT_EQ(got.aux_loss, want.aux_loss);
  EXPECT_EQ(got.grad_norm, want.grad_norm);
  ASSERT_EQ(got.params.size(), want.params.size());
  for (const auto& [name, values] : want.params) {
    auto it = got.params.find(name);
    ASSERT_NE(it, got.params.end()) << name;
    ASSERT_EQ(it->second.size(), values.size()) << name;
    EXPECT_EQ(std::memcmp(it->second.data(), values.data(), sizeof(float) * values.size()), 0)
        << name;
  }
}

// RunLayout in a fresh directory named after `tag` and this process, removed afterwards.
inline absl::StatusOr<RunResult> RunLayoutInTempDir(const LayoutCase& c, const std::string& tag) {
  const std::string dir = absl::StrCat(::testing::TempDir(), "/", tag, "-", getpid());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  absl::StatusOr<RunResult> r = RunLayout(c, dir);
  std::filesystem::remove_all(dir);
  return r;
}

}  // namespace furnace::testing
