// What a fuzz target asserts beyond "no crash, no sanitizer report": a property of the code under
// test that must hold for every input. A violation prints what broke and aborts, which libFuzzer
// records as a crash (and saves the input) and the replay test (replay_main.cc) reports as a
// failure.
#pragma once

#include <cstdio>
#include <cstdlib>

#define FUZZ_CHECK(cond, ...)                                                            \
  do {                                                                                   \
    if (!(cond)) {                                                                       \
      std::fprintf(stderr, "%s:%d: FUZZ_CHECK(%s) failed: ", __FILE__, __LINE__, #cond); \
      std::fprintf(stderr, __VA_ARGS__);                                                 \
      std::fprintf(stderr, "\n");                                                        \
      std::abort();                                                                      \
    }                                                                                    \
  } while (0)
