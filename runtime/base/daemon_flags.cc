#include "runtime/base/daemon_flags.h"

namespace furnace {

std::optional<int> ParseDaemonFlags(CLI::App& app, const std::string& name, int argc,
                                    const char* const* argv, std::ostream& out, std::ostream& err) {
  app.set_version_flag("--version", name + " " + FURNACE_VERSION);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e, out, err) == 0 ? 0 : kDaemonExitUsage;
  }
  return std::nullopt;
}

}  // namespace furnace
