#include "controller/service/options.h"

#include "runtime/base/daemon_flags.h"
#include "runtime/base/decimal.h"
#include "runtime/base/yaml_config.h"

namespace furnace::controller {
namespace {

// resources.time_limit_s's own bound (controller/spec/sections_run.cc): a year.
constexpr double kMaxTimeLimitFlagS = 366.0 * 24 * 3600;

}  // namespace

void AddControllerOptions(CLI::App& app, ControllerFlags& flags) {
  AddYamlConfigOption(app, "YAML file with the same keys as the flags (flags override it)");
  app.add_option("--listen", flags.listen, "gRPC address (JobService, AgentService)")
      ->capture_default_str();
  app.add_option("--advertise", flags.advertise,
                 "address ranks and workers dial (default: --listen)");
  app.add_option("--state-dir", flags.state_dir, "SQLite job store and logs")
      ->capture_default_str();
  app.add_option("--local-workers", flags.local_workers,
                 "spawn and keep N furnace-worker daemons on this machine")
      ->capture_default_str();
  app.add_option("--worker-binary", flags.worker_binary,
                 "furnace-worker to launch (default: next to this binary)");
  app.add_option("--heartbeat-interval", flags.heartbeat_interval_s,
                 "seconds between agent heartbeats")
      ->check(FiniteRange(0.01, 3600.0))
      ->capture_default_str();
  app.add_option("--telemetry-flush", flags.telemetry_flush_s,
                 "seconds between an agent's telemetry and log pushes (told to agents): every rank "
                 "ends a step at once, so a longer interval spreads a step's records over more "
                 "time; 0: sized to the fleet (0.2 s, or one second per 10,000 agents, at most "
                 "2 s)")
      ->check(FiniteRange(0.0, 60.0))
      ->capture_default_str();
  app.add_option("--worker-timeout", flags.worker_timeout_s,
                 "seconds of silence after which an agent is lost")
      ->check(FiniteRange(0.02, 1e6))
      ->capture_default_str();
  app.add_option("--reattach-grace", flags.reattach_grace_s,
                 "seconds after a controller start that known agents get to register again "
                 "before their silence counts")
      ->check(FiniteRange(0.0, 1e6))
      ->capture_default_str();
  app.add_option("--forget-lost-workers", flags.forget_lost_s,
                 "seconds after which a lost agent that has not registered again is forgotten "
                 "(no longer listed, counted in furnace_workers or stored; it registers as new "
                 "if it comes back); 0 keeps lost agents forever")
      ->check(FiniteRange(0.0, 1e9))
      ->capture_default_str();
  app.add_option("--forget-ended-jobs", flags.forget_ended_s,
                 "seconds after its end that a job is deleted from the job store and memory, "
                 "with its controller-side log (its checkpoints stay; the audit log keeps its "
                 "entries); at least 3600; 0 keeps ended jobs forever")
      ->check(ZeroOrSeconds(3600, 1e10))
      ->capture_default_str();
  app.add_option("--reserve-after", flags.reserve_after_s,
                 "seconds a job may wait to start before the next workers to free up are "
                 "reserved for it: a job submitted after it then starts only on workers beyond "
                 "those, so a stream of smaller jobs cannot hold a larger one back forever; 0 "
                 "never reserves (a younger job starts on whatever is free)")
      ->check(FiniteRange(0.0, 1e9))
      ->capture_default_str();
  app.add_option("--default-time-limit", flags.default_time_limit_s,
                 "seconds of resources.time_limit_s a job that leaves it out gets (at most "
                 "--max-time-limit); 0: such a job gets --max-time-limit, or has no limit")
      ->check(FiniteRange(0.0, kMaxTimeLimitFlagS))
      ->capture_default_str();
  app.add_option("--max-time-limit", flags.max_time_limit_s,
                 "the largest resources.time_limit_s a job may ask for, in seconds: a job asking "
                 "more, or none (0), is refused at submit, one leaving it out gets "
                 "--default-time-limit or else this; 0: no maximum")
      ->check(FiniteRange(0.0, kMaxTimeLimitFlagS))
      ->capture_default_str();
  // A default above the maximum would give jobs that set no limit one they could not ask for.
  app.callback([&flags] {
    if (flags.max_time_limit_s > 0 && flags.default_time_limit_s > flags.max_time_limit_s) {
      throw CLI::ValidationError(
          "--default-time-limit",
          ShortestDecimal(flags.default_time_limit_s) + " s is more than --max-time-limit " +
              ShortestDecimal(flags.max_time_limit_s) + " s; allowed: at most " +
              ShortestDecimal(flags.max_time_limit_s));
    }
  });
  app.add_option("--log-level", flags.log_level, "trace | debug | info | warn | error")
      ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error"}))
      ->capture_default_str();
  app.add_option("--metrics-listen", flags.metrics_listen,
                 "HTTP address for /metrics (Prometheus) and the dashboard; empty to disable")
      ->capture_default_str();
  app.add_option("--metrics-allowed-host", flags.metrics_allowed_hosts,
                 "a DNS name the loopback --metrics-listen answers besides localhost and "
                 "addresses (repeatable): the public name of a reverse proxy in front that passes "
                 "its clients' Host header on; other names are refused (421) against DNS "
                 "rebinding");
  app.add_option("--web-root", flags.web_root,
                 "dashboard files (default: share/furnace/web next to bin/)");
  app.add_option("--tls-cert", flags.tls_cert,
                 "PEM certificate of the gRPC listener; with --tls-key and --tls-ca: mutual TLS "
                 "(agents need a client certificate the CA signed)");
  app.add_option("--tls-key", flags.tls_key, "PEM private key of --tls-cert");
  app.add_option("--tls-ca", flags.tls_ca, "PEM CA that signs the agents' client certificates");
  app.add_option("--token-file", flags.token_file,
                 "bearer tokens for JobService, one `<token> <role> <name>` a line (role admin: "
                 "everything; read: read-only calls); needs TLS");
  app.add_option("--join-token-file", flags.join_token_file,
                 "file with the token agents must present on every AgentService call; needs TLS");
  app.add_flag("--insecure", flags.insecure,
               "allow a non-loopback --listen or --metrics-listen without TLS and tokens "
               "(anyone who reaches it can submit jobs)");
  app.add_option("--data-root", flags.data_root,
                 "confine the data files jobs name (data.path, blend, validation, tokenizer) to "
                 "this directory: relative paths are joined to it, escapes refused at submit");
  app.add_option("--checkpoint-root", flags.checkpoint_root,
                 "confine checkpoint.dir to this directory (as --data-root)");
  app.add_option("--max-request-bytes", flags.max_request_bytes,
                 "largest request any RPC accepts, in bytes (at least 2 MiB: a job file may be "
                 "1 MiB)")
      ->check(CLI::Range(uint64_t{2} << 20, uint64_t{1} << 30))
      ->capture_default_str();
  app.add_option("--submit-rate", flags.submit_rate,
                 "job submissions per second each caller may make after its burst; 0: no limit")
      ->check(FiniteRange(0.0, 1e6))
      ->capture_default_str();
  app.add_option("--submit-burst", flags.submit_burst,
                 "job submissions each caller may make at once")
      ->check(FiniteRange(1.0, 1e6))
      ->capture_default_str();
  app.add_option("--audit-keep", flags.audit_keep,
                 "audit log entries kept (the newest; older ones are deleted); 0 keeps all")
      ->capture_default_str();
}

}  // namespace furnace::controller
