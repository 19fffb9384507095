// Checks on SVG text for the report tests: a small XML well-formedness check (nesting, quoting,
// entities) and counters for what the plotter drew.
#pragma once

#include <string>
#include <vector>

namespace furnace::cli::testing {

// "" when `xml` is well-formed (one root element, tags nested and closed, attribute values
// quoted, '&' only in entities); else what is wrong and where.
inline std::string XmlProblem(const std::string& xml) {
  std::vector<std::string> open;
  int roots = 0;
  size_t i = 0;
  while (i < xml.size()) {
    if (xml[i] == '&') {
      const size_t semi = xml.find(';', i);
      const std::string entity = semi == std::string::npos ? "" : xml.substr(i, semi - i + 1);
      if (entity != "&amp;" && entity != "&lt;" && entity != "&gt;" && entity != "&quot;" &&
          entity != "&apos;") {
        return "bad entity at " + std::to_string(i);
      }
      i = semi + 1;
      continue;
    }
    if (xml[i] != '<') {
      if (xml[i] == '>') return "stray '>' at " + std::to_string(i);
      ++i;
      continue;
    }
    if (xml.compare(i, 2, "<?") == 0) {
      const size_t end = xml.find("?>", i);
      if (end == std::string::npos) return "unclosed <?";
      i = end + 2;
      continue;
    }
    // Find the tag's end outside quoted attribute values.
    size_t j = i + 1;
    char quote = 0;
    for (; j < xml.size(); ++j) {
      if (quote) {
        if (xml[j] == quote)
          quote = 0;
        else if (xml[j] == '<')
          return "'<' inside an attribute at " + std::to_string(j);
      } else if (xml[j] == '"' || xml[j] == '\'') {
        quote = xml[j];
      } else if (xml[j] == '>') {
        break;
      }
    }
    if (j >= xml.size()) return "unclosed tag at " + std::to_string(i);
    std::string tag = xml.substr(i + 1, j - i - 1);
    i = j + 1;
    if (tag.empty()) return "empty tag";
    if (tag[0] == '/') {
      const std::string name = tag.substr(1);
      if (open.empty() || open.back() != name) {
        return "</" + name + "> closes " + (open.empty() ? std::string("nothing") : open.back());
      }
      open.pop_back();
      continue;
    }
    const bool self_closing = tag.back() == '/';
    const std::string name = tag.substr(0, tag.find_first_of(" \t\n/"));
    if (open.empty()) ++roots;
    if (roots > 1) return "more than one root element";
    if (!self_closing) open.push_back(name);
  }
  if (!open.empty()) return "<" + open.back() + "> never closed";
  if (roots != 1) return "no root element";
  return "";
}

// How many times `needle` occurs in `text`.
inline int Count(const std::string& text, const std::string& needle) {
  int n = 0;
  for (size_t p = text.find(needle); p != std::string::npos; p = text.find(needle, p + 1)) ++n;
  return n;
}

// The points of every <polyline class="series"> together.
inline int SeriesPoints(const std::string& svg) {
  int n = 0;
  const std::string key = "<polyline class=\"series\"";
  for (size_t p = svg.find(key); p != std::string::npos; p = svg.find(key, p + 1)) {
    const size_t a = svg.find("points=\"", p) + 8;
    const size_t b = svg.find('"', a);
    n += Count(svg.substr(a, b - a), ",");
  }
  return n;
}

}  // namespace furnace::cli::testing
