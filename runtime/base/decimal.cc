#include "runtime/base/decimal.h"

#include <charconv>

namespace furnace {

std::string ShortestDecimal(double x) {
  char text[64];
  const std::to_chars_result r = std::to_chars(text, text + sizeof(text), x);
  return std::string(text, r.ptr);
}

}  // namespace furnace
