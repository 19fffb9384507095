#include "runtime/base/yaml_config.h"

#include <algorithm>
#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "yaml-cpp/yaml.h"

namespace furnace {
namespace {

// The keys a config file may use: the long names of the options that take one.
std::vector<std::string> Keys(const CLI::App& app) {
  std::vector<std::string> keys;
  for (const CLI::Option* option : app.get_options()) {
    if (option->get_configurable() && !option->get_lnames().empty()) {
      keys.push_back(option->get_lnames().front());
    }
  }
  return keys;
}

bool Configurable(const CLI::App& app, const std::string& key) {
  const std::vector<std::string> keys = Keys(app);
  return std::find(keys.begin(), keys.end(), key) != keys.end();
}

}  // namespace

std::string YamlConfig::to_config(const CLI::App* app, bool default_also,
                                  bool /*write_description*/, std::string /*prefix*/) const {
  YAML::Emitter out;
  out << YAML::BeginMap;
  for (const CLI::Option* option : app->get_options()) {
    if (!option->get_configurable() || option->get_lnames().empty()) continue;
    std::string value;
    if (option->results().size() > 1) {  // a repeatable option given more than once: a list
      out << YAML::Key << option->get_lnames().front() << YAML::Value << YAML::Flow
          << YAML::BeginSeq;
      for (const std::string& result : option->results()) out << result;
      out << YAML::EndSeq;
      continue;
    }
    if (option->count() > 0) {
      value = option->results().front();
    } else if (default_also && !option->get_default_str().empty()) {
      value = option->get_default_str();
    } else {
      continue;
    }
    out << YAML::Key << option->get_lnames().front() << YAML::Value << value;
  }
  out << YAML::EndMap;
  return std::string(out.c_str()) + "\n";
}

std::vector<CLI::ConfigItem> YamlConfig::from_config(std::istream& input) const {
  YAML::Node root;
  try {
    root = YAML::Load(input);
  } catch (const YAML::Exception& e) {
    throw CLI::ConversionError(std::string("config file: ") + e.what());
  }
  std::vector<CLI::ConfigItem> items;
  if (root.IsNull()) return items;
  if (!root.IsMap()) throw CLI::ConversionError("config file: expected a map of flag: value");
  for (const auto& entry : root) {
    CLI::ConfigItem item;
    item.name = absl::StrReplaceAll(entry.first.as<std::string>(), {{"_", "-"}});
    const std::string where = absl::StrCat("config file, line ", entry.first.Mark().line + 1, ": ");
    if (app_ != nullptr && !Configurable(*app_, item.name)) {
      throw CLI::ConfigError(absl::StrCat(where, "unknown option '", item.name,
                                          "'; allowed: ", absl::StrJoin(Keys(*app_), ", ")));
    }
    // A repeatable option (--metrics-allowed-host) takes a list of values; any other, one.
    const CLI::Option* option =
        app_ != nullptr ? app_->get_option_no_throw("--" + item.name) : nullptr;
    const bool repeatable = option != nullptr && option->get_items_expected_max() > 1;
    if (repeatable && entry.second.IsSequence()) {
      for (const YAML::Node& element : entry.second) {
        if (!element.IsScalar()) {
          throw CLI::ConversionError(where + "'" + item.name + "' must be a list of values");
        }
        item.inputs.push_back(element.as<std::string>());
      }
      items.push_back(std::move(item));
      continue;
    }
    if (!entry.second.IsScalar()) {
      throw CLI::ConversionError(where + "'" + item.name + "' must be " +
                                 (repeatable ? "a value or a list of values" : "a single value"));
    }
    item.inputs = {entry.second.as<std::string>()};
    items.push_back(std::move(item));
  }
  return items;
}

void AddYamlConfigOption(CLI::App& app, const std::string& description) {
  app.config_formatter(std::make_shared<YamlConfig>(&app));
  app.allow_config_extras(CLI::config_extras_mode::error);
  app.set_config("--config", "", description);
}

}  // namespace furnace
