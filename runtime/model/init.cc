#include "runtime/model/init.h"

#include <cmath>
#include <numbers>

#include "absl/strings/match.h"

namespace furnace::model {
namespace {

uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

uint64_t Fnv1a(const std::string& s) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (unsigned char ch : s) {
    h ^= ch;
    h *= 0x100000001b3ULL;
  }
  return h;
}

// Uniform in (0, 1]: never 0, so log() is finite.
double Unit(uint64_t bits) { return (static_cast<double>(bits >> 11) + 1.0) * 0x1.0p-53; }

std::string LastComponent(const std::string& name) {
  const size_t dot = name.rfind('.');
  return dot == std::string::npos ? name : name.substr(dot + 1);
}

}  // namespace

InitRule InitRuleFor(const std::string& name, int layers) {
  const std::string last = LastComponent(name);
  const bool layer_norm = absl::StrContains(name, "ln1.") || absl::StrContains(name, "ln2.") ||
                          absl::StartsWith(name, "lnf.");
  if (layer_norm) return {last == "weight" ? InitKind::kOnes : InitKind::kZeros, 0};
  if (last == "bqkv" || last == "bo" || last == "b1" || last == "b2") return {InitKind::kZeros, 0};
  if (absl::EndsWith(name, "attn.wo") || last == "w2") {
    return {InitKind::kNormal, 0.02 / std::sqrt(2.0 * layers)};
  }
  return {InitKind::kNormal, 0.02};
}

namespace {

// The stream of parameter `name`: a function of the seed and the name only.
uint64_t StreamKey(uint64_t seed, const std::string& name) {
  return SplitMix64(seed ^ SplitMix64(Fnv1a(name)));
}

double StandardNormalAt(uint64_t key, int64_t index) {
  const uint64_t counter = key + 2 * static_cast<uint64_t>(index);
  const double u1 = Unit(SplitMix64(counter));
  const double u2 = Unit(SplitMix64(counter + 1));
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
}

}  // namespace

double StandardNormal(uint64_t seed, const std::string& name, int64_t index) {
  return StandardNormalAt(StreamKey(seed, name), index);
}

namespace {

float Draw(const InitRule& rule, uint64_t key, int64_t index) {
  switch (rule.kind) {
    case InitKind::kZeros:
      return 0;
    case InitKind::kOnes:
      return 1;
    case InitKind::kNormal:
      break;
  }
  return static_cast<float>(rule.std * StandardNormalAt(key, index));
}

}  // namespace

void InitParameterRange(uint64_t seed, const train::ParamInfo& param, int layers, float* out,
                        int64_t begin, int64_t end) {
  // The rule and the stream depend on the parameter only: computed once, not per element.
  const InitRule rule = InitRuleFor(param.name, layers);
  const uint64_t key = StreamKey(seed, param.name);
  for (int64_t i = begin; i < end; ++i) out[i] = Draw(rule, key, param.GlobalIndex(i));
}

void InitParameter(uint64_t seed, const train::ParamInfo& param, int layers, float* out) {
  InitParameterRange(seed, param, layers, out, 0, param.numel());
}

}  // namespace furnace::model
