// "Did you mean X?" for misspelled keys and enum values.
#pragma once

#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace furnace::spec {

// The candidate closest to `word` by edit distance (insert, delete, substitute, swap adjacent), if
// it is close enough to be a plausible typo (1 edit for words of up to 3 letters, else 2); "" if
// none is. Ties go to the earlier candidate.
std::string ClosestMatch(absl::string_view word, const std::vector<std::string>& candidates);

}  // namespace furnace::spec
