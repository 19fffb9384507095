// The daemons' `--config FILE` for CLI11: a flat YAML map whose keys are the long flag names
// (`state-dir` or `state_dir`), each with one scalar value. CLI11 gives a file value only to an
// option the command line did not set, so flags override the file, and each option is defined
// once (flag, key and default in one add_option). furnace-controller and furnace-worker both use
// it; it is a library of its own (CLI11, yaml-cpp), not part of furnace_base.
#pragma once

#include <istream>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"

namespace furnace {

class YamlConfig : public CLI::Config {
 public:
  // With `app`, from_config refuses a key that names none of its options, with the line and the
  // keys allowed; `app` owns this formatter (App::config_formatter), so it outlives it.
  explicit YamlConfig(const CLI::App* app = nullptr) : app_(app) {}

  // The options of `app` that have a value (or a default, with default_also) as a YAML map in
  // the order they were added; from_config reads it back. Subcommands and descriptions are not
  // written (the file is flat).
  std::string to_config(const CLI::App* app, bool default_also, bool write_description,
                        std::string prefix) const override;

  // Throws CLI::ConversionError when the text is not YAML, not a map, or has a value that is not
  // a single scalar, and CLI::ConfigError for an unknown key.
  std::vector<CLI::ConfigItem> from_config(std::istream& input) const override;

 private:
  const CLI::App* app_;
};

// Adds `--config FILE` to `app`, read with a YamlConfig that knows `app`'s options.
void AddYamlConfigOption(CLI::App& app, const std::string& description);

}  // namespace furnace
