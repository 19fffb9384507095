#include "controller/spec/suggest.h"

#include <algorithm>

namespace furnace::spec {
namespace {

// Optimal string alignment distance (Damerau-Levenshtein without repeated edits of a substring).
size_t EditDistance(absl::string_view a, absl::string_view b) {
  std::vector<std::vector<size_t>> d(a.size() + 1, std::vector<size_t>(b.size() + 1));
  for (size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
  for (size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1]) {
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
      }
    }
  }
  return d[a.size()][b.size()];
}

}  // namespace

std::string ClosestMatch(absl::string_view word, const std::vector<std::string>& candidates) {
  const size_t limit = word.size() <= 3 ? 1 : 2;
  std::string best;
  size_t best_distance = limit + 1;
  for (const std::string& candidate : candidates) {
    // The lengths alone bound the distance from below: a long key (a file may hold one of
    // hundreds of kilobytes) costs nothing against the schema's short names.
    const size_t length_gap = word.size() > candidate.size() ? word.size() - candidate.size()
                                                             : candidate.size() - word.size();
    if (length_gap >= best_distance) continue;
    size_t distance = EditDistance(word, candidate);
    if (distance < best_distance && distance < std::max(word.size(), candidate.size())) {
      best = candidate;
      best_distance = distance;
    }
  }
  return best;
}

}  // namespace furnace::spec
