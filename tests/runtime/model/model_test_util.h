// Shared fixtures of the model tests: the tiny config of the brief and seeded random inputs.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "runtime/model/config.h"

namespace furnace::model::testing {

// V=32, T=8, d=16, h=2, L=2, moe_every=2 (layer 0 dense, layer 1 MoE), E=4, k=2, f=24.
inline ModelConfig TinyConfig(double capacity_factor = 0) {
  ModelConfig c;
  c.vocab = 32;
  c.seq_len = 8;
  c.d_model = 16;
  c.heads = 2;
  c.layers = 2;
  c.dense_ffn = 0;  // 4d = 64
  c.moe_every = 2;
  c.experts = 4;
  c.top_k = 2;
  c.expert_ffn = 24;
  c.capacity_factor = capacity_factor;
  c.normalize_topk = true;
  c.aux_alpha = 0.01;
  return c;
}

inline std::vector<int32_t> RandomTokens(int n, int vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> dist(0, vocab - 1);
  std::vector<int32_t> out(n);
  for (int32_t& t : out) t = dist(rng);
  return out;
}

}  // namespace furnace::model::testing
