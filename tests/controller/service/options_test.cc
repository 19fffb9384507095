// furnace-controller's options: defaults, the --config file, flags over the file, the shipped
// example config, and what is refused.
#include "controller/service/options.h"

#include <gtest/gtest.h>

#include <fstream>
#include <string>
#include <vector>

namespace furnace::controller {
namespace {

const std::string kSource = FURNACE_SOURCE_DIR;

// Parses `args` (without the program name) into `flags`; CLI11 errors propagate.
void Parse(const std::vector<std::string>& args, ControllerFlags& flags) {
  CLI::App app{"furnace-controller"};
  AddControllerOptions(app, flags);
  std::vector<const char*> argv = {"furnace-controller"};
  for (const std::string& a : args) argv.push_back(a.c_str());
  app.parse(static_cast<int>(argv.size()), argv.data());
}

ControllerFlags Parsed(const std::vector<std::string>& args) {
  ControllerFlags flags;
  Parse(args, flags);
  return flags;
}

std::string WriteConfig(const std::string& name, const std::string& text) {
  const std::string path = ::testing::TempDir() + name;
  std::ofstream(path) << text;
  return path;
}

TEST(ControllerOptions, DefaultsWithoutArguments) {
  const ControllerFlags f = Parsed({});
  EXPECT_EQ(f.listen, "127.0.0.1:7070");
  EXPECT_EQ(f.advertise, "");
  EXPECT_EQ(f.state_dir, "./furnace-state");
  EXPECT_EQ(f.local_workers, 0u);
  EXPECT_EQ(f.worker_binary, "");
  EXPECT_EQ(f.heartbeat_interval_s, 1.0);
  EXPECT_EQ(f.telemetry_flush_s, 0.0);  // sized to the fleet
  EXPECT_EQ(f.worker_timeout_s, 10.0);
  EXPECT_EQ(f.reattach_grace_s, 30.0);
  EXPECT_EQ(f.log_level, "info");
  EXPECT_EQ(f.metrics_listen, "127.0.0.1:9464");
  EXPECT_EQ(f.web_root, "");
}

TEST(ControllerOptions, FlagsSetEveryOption) {
  const ControllerFlags f = Parsed({"--listen",
                                    "0.0.0.0:7000",
                                    "--advertise",
                                    "ctl:7000",
                                    "--state-dir",
                                    "/s",
                                    "--local-workers",
                                    "4",
                                    "--worker-binary",
                                    "/w",
                                    "--heartbeat-interval",
                                    "0.5",
                                    "--worker-timeout",
                                    "5",
                                    "--reattach-grace",
                                    "2.5",
                                    "--log-level",
                                    "debug",
                                    "--metrics-listen",
                                    "",
                                    "--web-root",
                                    "/web"});
  EXPECT_EQ(f.listen, "0.0.0.0:7000");
  EXPECT_EQ(f.advertise, "ctl:7000");
  EXPECT_EQ(f.state_dir, "/s");
  EXPECT_EQ(f.local_workers, 4u);
  EXPECT_EQ(f.worker_binary, "/w");
  EXPECT_EQ(f.heartbeat_interval_s, 0.5);
  EXPECT_EQ(f.worker_timeout_s, 5.0);
  EXPECT_EQ(f.reattach_grace_s, 2.5);
  EXPECT_EQ(f.log_level, "debug");
  EXPECT_EQ(f.metrics_listen, "");  // empty disables the HTTP server
  EXPECT_EQ(f.web_root, "/web");
}

TEST(ControllerOptions, SecurityKeysFromTheConfigFile) {
  const std::string path = WriteConfig("controller_security.yaml",
                                       "tls-cert: /etc/furnace/controller.pem\n"
                                       "tls_key: /etc/furnace/controller.key\n"
                                       "tls-ca: /etc/furnace/ca.pem\n"
                                       "token-file: /etc/furnace/tokens\n"
                                       "join-token-file: /etc/furnace/join.token\n"
                                       "insecure: true\n");
  const ControllerFlags f = Parsed({"--config", path});
  EXPECT_EQ(f.tls_cert, "/etc/furnace/controller.pem");
  EXPECT_EQ(f.tls_key, "/etc/furnace/controller.key");
  EXPECT_EQ(f.tls_ca, "/etc/furnace/ca.pem");
  EXPECT_EQ(f.token_file, "/etc/furnace/tokens");
  EXPECT_EQ(f.join_token_file, "/etc/furnace/join.token");
  EXPECT_TRUE(f.insecure);
  EXPECT_FALSE(Parsed({}).insecure);
}

TEST(ControllerOptions, ConfigFileSetsOptionsAndFlagsOverrideIt) {
  const std::string path = WriteConfig("controller_all.yaml",
                                       "listen: 10.0.0.1:7070\n"
                                       "advertise: ctl.example:7070\n"
                                       "state_dir: /var/lib/f\n"  // '_' spells '-' too
                                       "local-workers: 3\n"
                                       "worker-binary: /opt/furnace-worker\n"
                                       "heartbeat-interval: 0.25\n"
                                       "telemetry-flush: 1.5\n"
                                       "worker_timeout: 7.5\n"
                                       "reattach-grace: 12\n"
                                       "log-level: warn\n"
                                       "metrics-listen: \"\"\n"
                                       "web-root: /srv/web\n");
  const ControllerFlags file = Parsed({"--config", path});
  EXPECT_EQ(file.listen, "10.0.0.1:7070");
  EXPECT_EQ(file.advertise, "ctl.example:7070");
  EXPECT_EQ(file.state_dir, "/var/lib/f");
  EXPECT_EQ(file.local_workers, 3u);
  EXPECT_EQ(file.worker_binary, "/opt/furnace-worker");
  EXPECT_EQ(file.heartbeat_interval_s, 0.25);
  EXPECT_EQ(file.telemetry_flush_s, 1.5);
  EXPECT_EQ(file.worker_timeout_s, 7.5);
  EXPECT_EQ(file.reattach_grace_s, 12.0);
  EXPECT_EQ(file.log_level, "warn");
  EXPECT_EQ(file.metrics_listen, "");
  EXPECT_EQ(file.web_root, "/srv/web");

  // Flags win whether they come before or after --config; the rest still comes from the file.
  const ControllerFlags both = Parsed({"--state-dir", "/mine", "--config", path, "--worker-timeout",
                                       "3", "--metrics-listen", ":9999"});
  EXPECT_EQ(both.state_dir, "/mine");
  EXPECT_EQ(both.worker_timeout_s, 3.0);
  EXPECT_EQ(both.metrics_listen, ":9999");
  EXPECT_EQ(both.listen, "10.0.0.1:7070");
  EXPECT_EQ(both.local_workers, 3u);
  EXPECT_EQ(both.log_level, "warn");
}

TEST(ControllerOptions, TheShippedExampleConfigParses) {
  const ControllerFlags f =
      Parsed({"--config", kSource + "/deploy/controller.example.yaml", "--local-workers", "2"});
  EXPECT_EQ(f.listen, "127.0.0.1:7070");
  EXPECT_EQ(f.state_dir, "/var/lib/furnace");
  EXPECT_EQ(f.local_workers, 2u);
  EXPECT_EQ(f.heartbeat_interval_s, 1.0);
  EXPECT_EQ(f.worker_timeout_s, 10.0);
  EXPECT_EQ(f.reattach_grace_s, 30.0);
  EXPECT_EQ(f.log_level, "info");
}

TEST(ControllerOptions, AnEmptyConfigFileChangesNothing) {
  const ControllerFlags f = Parsed({"--config", WriteConfig("controller_empty.yaml", "")});
  EXPECT_EQ(f.state_dir, "./furnace-state");
  EXPECT_EQ(f.metrics_listen, "127.0.0.1:9464");
}

TEST(ControllerOptions, RefusesUnknownKeysBadValuesAndBadFiles) {
  ControllerFlags f;
  try {
    Parse({"--config", WriteConfig("controller_unknown.yaml", "listen: a:1\nport: 1\n")}, f);
    ADD_FAILURE() << "an unknown key was accepted";
  } catch (const CLI::ConfigError& e) {
    EXPECT_EQ(std::string(e.what()),
              "config file, line 2: unknown option 'port'; allowed: listen, advertise, state-dir, "
              "local-workers, worker-binary, heartbeat-interval, telemetry-flush, worker-timeout, "
              "reattach-grace, forget-lost-workers, forget-ended-jobs, reserve-after, "
              "default-time-limit, max-time-limit, log-level, "
              "metrics-listen, "
              "metrics-allowed-host, web-root, tls-cert, "
              "tls-key, tls-ca, "
              "token-file, join-token-file, insecure, data-root, checkpoint-root, "
              "max-request-bytes, submit-rate, submit-burst, audit-keep");
  }
  EXPECT_THROW(Parse({"--config", WriteConfig("controller_list.yaml", "listen: [a, b]\n")}, f),
               CLI::ConversionError);
  EXPECT_THROW(Parse({"--config", WriteConfig("controller_scalar.yaml", "just text\n")}, f),
               CLI::ConversionError);
  EXPECT_THROW(Parse({"--config", WriteConfig("controller_bad.yaml", "listen: [unclosed\n")}, f),
               CLI::ConversionError);
  EXPECT_THROW(Parse({"--config", ::testing::TempDir() + "no_such_controller.yaml"}, f),
               CLI::FileError);
  EXPECT_THROW(Parse({"--local-workers", "many"}, f), CLI::ConversionError);
  EXPECT_THROW(Parse({"--log-level", "loud"}, f), CLI::ValidationError);
  EXPECT_THROW(Parse({"--config", WriteConfig("controller_level.yaml", "log-level: loud\n")}, f),
               CLI::ValidationError);
  EXPECT_THROW(Parse({"--no-such-flag", "1"}, f), CLI::ExtrasError);
  // Timing values out of range are refused (a negative or zero interval started before).
  for (const char* flag : {"--heartbeat-interval", "--worker-timeout"}) {
    EXPECT_THROW(Parse({flag, "0"}, f), CLI::ValidationError) << flag;
    EXPECT_THROW(Parse({flag, "-1"}, f), CLI::ValidationError) << flag;
  }
  EXPECT_THROW(Parse({"--reattach-grace", "-5"}, f), CLI::ValidationError);
  for (const char* flag : {"--heartbeat-interval", "--worker-timeout", "--reattach-grace",
                           "--forget-lost-workers", "--telemetry-flush", "--submit-rate"}) {
    EXPECT_THROW(Parse({flag, "nan"}, f), CLI::ValidationError) << flag;  // CLI::Range took nan
    EXPECT_THROW(Parse({flag, "inf"}, f), CLI::ValidationError) << flag;
  }
  EXPECT_THROW(
      Parse({"--config", WriteConfig("controller_timeout.yaml", "worker-timeout: -1\n")}, f),
      CLI::ValidationError);
}

TEST(ControllerOptions, RootsLimitsAndRatesFromFlagsAndTheConfigFile) {
  ControllerFlags f = Parsed({});
  EXPECT_EQ(f.data_root, "");
  EXPECT_EQ(f.checkpoint_root, "");
  EXPECT_EQ(f.max_request_bytes, uint64_t{64} << 20);
  EXPECT_EQ(f.submit_rate, 2.0);
  EXPECT_EQ(f.submit_burst, 20.0);
  EXPECT_EQ(f.audit_keep, 1'000'000u);
  EXPECT_EQ(Parsed({"--audit-keep", "0"}).audit_keep, 0u);
  f = Parsed({"--data-root", "/d", "--checkpoint-root", "/c", "--max-request-bytes", "4194304",
              "--submit-rate", "0", "--submit-burst", "3"});
  EXPECT_EQ(f.data_root, "/d");
  EXPECT_EQ(f.checkpoint_root, "/c");
  EXPECT_EQ(f.max_request_bytes, 4194304u);
  EXPECT_EQ(f.submit_rate, 0.0);
  EXPECT_EQ(f.submit_burst, 3.0);
  const std::string path = WriteConfig("controller_roots.yaml",
                                       "data_root: /srv/data\ncheckpoint-root: /srv/ckpt\n"
                                       "submit-rate: 0.5\n");
  f = Parsed({"--config", path});
  EXPECT_EQ(f.data_root, "/srv/data");
  EXPECT_EQ(f.checkpoint_root, "/srv/ckpt");
  EXPECT_EQ(f.submit_rate, 0.5);
  // A request limit too small for a 1 MiB job file, a burst under one, a negative rate.
  EXPECT_THROW(Parse({"--max-request-bytes", "1000"}, f), CLI::ValidationError);
  EXPECT_THROW(Parse({"--submit-burst", "0.5"}, f), CLI::ValidationError);
  EXPECT_THROW(Parse({"--submit-rate", "-1"}, f), CLI::ValidationError);
}

// --default-time-limit / --max-time-limit: none by default; seconds from a flag or the config
// file, at most a year (resources.time_limit_s's own bound), never negative.
TEST(ControllerOptions, TimeLimitsFromFlagsAndTheConfigFile) {
  ControllerFlags f = Parsed({});
  EXPECT_EQ(f.default_time_limit_s, 0.0);
  EXPECT_EQ(f.max_time_limit_s, 0.0);
  f = Parsed({"--default-time-limit", "3600", "--max-time-limit", "86400"});
  EXPECT_EQ(f.default_time_limit_s, 3600.0);
  EXPECT_EQ(f.max_time_limit_s, 86400.0);
  f = Parsed({"--config", WriteConfig("controller_limits.yaml",
                                      "default_time_limit: 600\nmax-time-limit: 7200\n")});
  EXPECT_EQ(f.default_time_limit_s, 600.0);
  EXPECT_EQ(f.max_time_limit_s, 7200.0);
  EXPECT_THROW(Parse({"--max-time-limit", "-1"}, f), CLI::ValidationError);
  EXPECT_THROW(Parse({"--default-time-limit", "4e7"}, f), CLI::ValidationError);
  // A default above the maximum, whichever of flags and file gives each.
  try {
    Parse({"--default-time-limit", "1209601", "--max-time-limit", "1209600"}, f);
    ADD_FAILURE() << "a default above the maximum was accepted";
  } catch (const CLI::ValidationError& e) {
    EXPECT_EQ(std::string(e.what()),
              "--default-time-limit: 1209601 s is more than --max-time-limit 1209600 s; allowed: "
              "at most 1209600");
  }
  EXPECT_THROW(Parse({"--config", WriteConfig("controller_limits_bad.yaml", "max-time-limit: 60\n"),
                      "--default-time-limit", "61"},
                     f),
               CLI::ValidationError);
  EXPECT_EQ(Parsed({"--default-time-limit", "60", "--max-time-limit", "60"}).default_time_limit_s,
            60.0);
}

// --metrics-allowed-host is repeatable: on the command line, and in the config file as one name
// or a list; a config written from the flags keeps the list. Other options take one value.
TEST(ControllerOptions, TheAllowedHostsAreAListEverywhere) {
  EXPECT_TRUE(Parsed({}).metrics_allowed_hosts.empty());
  const std::vector<std::string> two = {"a.example", "b.example"};
  EXPECT_EQ(Parsed({"--metrics-allowed-host", "a.example", "--metrics-allowed-host", "b.example"})
                .metrics_allowed_hosts,
            two);
  EXPECT_EQ(
      Parsed({"--config", WriteConfig("controller_host.yaml", "metrics-allowed-host: a.example\n")})
          .metrics_allowed_hosts,
      std::vector<std::string>{"a.example"});
  EXPECT_EQ(Parsed({"--config", WriteConfig("controller_hosts.yaml",
                                            "metrics-allowed-host: [a.example, b.example]\n")})
                .metrics_allowed_hosts,
            two);
  ControllerFlags given;
  CLI::App app{"furnace-controller"};
  AddControllerOptions(app, given);
  std::vector<const char*> argv = {"furnace-controller", "--metrics-allowed-host", "a.example",
                                   "--metrics-allowed-host", "b.example"};
  app.parse(static_cast<int>(argv.size()), argv.data());
  const std::string written = WriteConfig("controller_hosts_written.yaml", app.config_to_str());
  EXPECT_EQ(Parsed({"--config", written}).metrics_allowed_hosts, two);
  ControllerFlags f;
  EXPECT_THROW(
      Parse({"--config", WriteConfig("controller_listen_list.yaml", "listen: [a:1, b:2]\n")}, f),
      CLI::ConversionError);
}

TEST(ControllerOptions, HelpNamesEveryOptionWithItsDefault) {
  ControllerFlags f;
  CLI::App app{"furnace-controller"};
  AddControllerOptions(app, f);
  const std::string help = app.help();
  for (const char* option :
       {"--config",         "--listen",          "--advertise",          "--state-dir",
        "--local-workers",  "--worker-binary",   "--heartbeat-interval", "--worker-timeout",
        "--reattach-grace", "--log-level",       "--metrics-listen",     "--web-root",
        "--data-root",      "--checkpoint-root", "--max-request-bytes",  "--submit-rate",
        "--submit-burst",   "--telemetry-flush", "127.0.0.1:7070",       "./furnace-state",
        "127.0.0.1:9464"}) {
    EXPECT_NE(help.find(option), std::string::npos) << option << " missing from:\n" << help;
  }
}

TEST(ControllerOptions, WrittenConfigReadsBackToTheSameOptions) {
  ControllerFlags given;
  CLI::App app{"furnace-controller"};
  AddControllerOptions(app, given);
  std::vector<const char*> argv = {"furnace-controller",
                                   "--state-dir",
                                   "/x y",
                                   "--local-workers",
                                   "5",
                                   "--web-root",
                                   "a: b#c",
                                   "--metrics-listen",
                                   ""};
  app.parse(static_cast<int>(argv.size()), argv.data());
  const std::string path =
      WriteConfig("controller_written.yaml", app.config_to_str(/*default_also=*/true));
  const ControllerFlags read = Parsed({"--config", path});
  EXPECT_EQ(read.state_dir, "/x y");
  EXPECT_EQ(read.local_workers, 5u);
  EXPECT_EQ(read.web_root, "a: b#c");
  EXPECT_EQ(read.metrics_listen, "");
  EXPECT_EQ(read.listen, "127.0.0.1:7070");
  EXPECT_EQ(read.worker_timeout_s, 10.0);
}

}  // namespace
}  // namespace furnace::controller
