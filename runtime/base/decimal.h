// The shortest decimal text that reads back as the same double ("0.01", not
// "0.01000000000000000021"): equal texts are equal values, so recorded settings compare as text.
#pragma once

#include <string>

namespace furnace {

std::string ShortestDecimal(double x);

}  // namespace furnace
