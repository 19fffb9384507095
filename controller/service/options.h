// furnace-controller's options: each defined once (flag, YAML key, default, help) on a CLI11 app.
// `--config FILE` reads the same keys from YAML (runtime/base/yaml_config.h: `state-dir` or
// `state_dir`); a flag on the command line overrides the file, and an unknown key is an error.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"

namespace furnace::controller {

struct ControllerFlags {
  std::string listen = "127.0.0.1:7070";
  std::string advertise;  // empty: --listen
  std::string state_dir = "./furnace-state";
  uint32_t local_workers = 0;
  std::string worker_binary;  // empty: next to this binary
  double heartbeat_interval_s = 1.0;
  double telemetry_flush_s = 0;  // 0: sized to the fleet (ControllerOptions)
  double worker_timeout_s = 10.0;
  double reattach_grace_s = 30.0;
  double forget_lost_s = 86400.0;   // 0: lost workers are kept forever
  double forget_ended_s = 0;        // 0: ended jobs are kept forever
  double reserve_after_s = 600;     // 0: no reservations for long-pending jobs
  double default_time_limit_s = 0;  // 0: a job without resources.time_limit_s has none
  double max_time_limit_s = 0;      // 0: no maximum
  std::string log_level = "info";
  std::string metrics_listen = "127.0.0.1:9464";  // empty: no HTTP server
  std::string web_root;                           // empty: share/furnace/web next to bin/
  // Names the loopback HTTP listener answers besides localhost (a reverse proxy's public name).
  std::vector<std::string> metrics_allowed_hosts;
  // Transport security (server_security.h, README "Security").
  std::string tls_cert;         // PEM certificate of the gRPC (and HTTPS) listener
  std::string tls_key;          // its private key
  std::string tls_ca;           // CA that signs agents' client certificates
  std::string token_file;       // `<token> <role> <name>` lines; empty: JobService open
  std::string join_token_file;  // the token agents present; empty: certificate only
  bool insecure = false;        // allow a non-loopback listen without TLS and tokens
  std::string data_root;        // empty: job data paths are not confined
  std::string checkpoint_root;  // empty: checkpoint.dir is not confined
  // The largest request any RPC accepts (agents push telemetry in batches of up to 1000 records;
  // a job file is at most 1 MiB).
  uint64_t max_request_bytes = uint64_t{64} << 20;
  double submit_rate = 2.0;         // job submissions per second per caller, after the burst
  double submit_burst = 20.0;       // submissions a caller may make at once
  uint64_t audit_keep = 1'000'000;  // audit entries kept (the newest); 0: all, forever
};

// Adds --config and every option to `app`, each bound to its field of `flags` (which must
// outlive the parse); the fields' initial values are the defaults --help shows.
// A --default-time-limit above --max-time-limit fails the parse (CLI::ValidationError).
void AddControllerOptions(CLI::App& app, ControllerFlags& flags);

}  // namespace furnace::controller
