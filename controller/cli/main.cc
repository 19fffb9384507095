// The `furnace` command line: flag parsing only (CLI11 lives in this file alone); the commands are
// in cmd_*.cc. This is the one place that turns an error into an exit code (exit_codes.h).
#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "controller/cli/commands.h"
#include "controller/cli/exit_codes.h"
#include "google/protobuf/struct.pb.h"
#include "runtime/base/file_sync.h"
#include "transport/credentials.h"
#include "transport/token_file.h"

namespace {

int TerminalWidth() {
  winsize ws{};
  if (ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0) return ws.ws_col;
  return 80;
}

// The word given where the command belongs when it names none of `app`'s commands ("" when the
// command line names a known one, or none at all): CLI11 only says that a command is required.
std::string UnknownCommand(CLI::App& app, int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg.rfind('-', 0) == 0) {
      const CLI::Option* option =
          arg.find('=') == std::string::npos ? app.get_option_no_throw(arg) : nullptr;
      if (option != nullptr && option->get_expected_min() > 0) ++i;  // skip its value
      continue;
    }
    const std::vector<CLI::App*> commands = app.get_subcommands({});
    const bool known = std::any_of(commands.begin(), commands.end(),
                                   [&](const CLI::App* c) { return c->check_name(arg); });
    return known ? std::string() : arg;
  }
  return "";
}

// {"error": {"code", "message", "exit_code"}}: a failed command's one document under --json.
void PrintJsonError(std::ostream& out, const absl::Status& status, int exit_code) {
  google::protobuf::Struct doc;
  auto& error = *(*doc.mutable_fields())["error"].mutable_struct_value()->mutable_fields();
  error["code"].set_string_value(absl::StatusCodeToString(status.code()));
  error["message"].set_string_value(std::string(status.message()));
  error["exit_code"].set_number_value(exit_code);
  (void)furnace::cli::PrintJson(doc, out);
  out.flush();
}

std::string CommandNames(CLI::App& app) {
  std::string names;
  for (const CLI::App* sub : app.get_subcommands({})) {
    names += (names.empty() ? "" : ", ") + sub->get_name();
  }
  return names;
}

// A whole-number option that may not be negative; `why` is the message for one that is (CLI11's
// own range check names a bound of 300 digits).
CLI::Validator NotNegative(const std::string& why, const std::string& name) {
  return CLI::Validator(
      [why](std::string& value) {
        return !value.empty() && value[0] == '-' ? absl::StrCat(why, " (got ", value, ")")
                                                 : std::string();
      },
      name);
}

}  // namespace

int main(int argc, char** argv) {
  using namespace furnace::cli;
  // Ctrl-C during `data prepare`, `tokenizer train`, `export` or `report` leaves no half-written
  // temporary file beside the output.
  furnace::RemoveTempFilesOnSignal();

  CLI::App app{"furnace: submit, follow and export Mixture-of-Experts training jobs", "furnace"};
  app.set_version_flag("--version", std::string("furnace ") + FURNACE_VERSION);
  app.footer(ExitCodeHelp());
  app.require_subcommand(1);
  app.fallthrough();  // global flags may follow the command: `furnace jobs --json`

  std::string controller = "127.0.0.1:7070";
  bool json = false;
  app.add_option("--controller", controller, "furnace-controller address host:port")
      ->capture_default_str();
  app.add_flag("--json", json, "machine-readable output: one JSON document per command");
  // TLS and the token (README "Security"). The token is never a flag value (it would show in ps
  // and shell history): a file, or FURNACE_TOKEN.
  furnace::transport::ClientSecurity security;
  std::string token_file;
  app.add_option("--tls-ca", security.tls.ca,
                 "PEM CA of the controller's certificate: connect with TLS")
      ->envname("FURNACE_TLS_CA");
  app.add_option("--tls-cert", security.tls.cert, "PEM client certificate (optional with TLS)")
      ->envname("FURNACE_TLS_CERT");
  app.add_option("--tls-key", security.tls.key, "PEM private key of --tls-cert")
      ->envname("FURNACE_TLS_KEY");
  app.add_option("--token-file", token_file,
                 "file holding the bearer token (default: the FURNACE_TOKEN environment variable)")
      ->envname("FURNACE_TOKEN_FILE");

  CertsInitOptions certs_options;
  auto* certs = app.add_subcommand("certs", "development TLS certificates and tokens");
  certs->require_subcommand(1);
  auto* certs_init = certs->add_subcommand(
      "init",
      "make a development CA, controller/worker/CLI certificates (ECDSA P-256, one year) and "
      "admin, read and join tokens in DIR (keys and tokens 0600)");
  certs_init->add_option("DIR", certs_options.dir, "directory to write")->required();
  certs_init->add_option("--host", certs_options.hosts,
                         "another DNS name or IP address of the controller for its certificate "
                         "(it always has localhost, 127.0.0.1 and ::1); repeatable");
  certs_init->add_option("--worker-host", certs_options.worker_hosts,
                         "a host that gets a worker certificate of its own (worker-HOST.pem: the "
                         "controller lets it act only as the workers HOST and HOST/<slot>); "
                         "repeatable");
  certs_init->add_flag("--force", certs_options.force, "overwrite files that exist");

  std::string file;
  SubmitOptions submit_options;
  auto* submit = app.add_subcommand(
      "submit",
      "submit a job file (at most 1 MiB of UTF-8 text, checked before sending); the controller "
      "validates it");
  submit->add_option("FILE", file, "job YAML")->required();
  CLI::Option* submit_watch =
      submit->add_flag("--watch", submit_options.watch, "then watch the job until it ends");
  // A flag that takes a value only after '=' (`--dry-run FILE` stays a flag and a file): "true"
  // when given bare, "false" from --dry-run=false as the flag always allowed.
  std::string dry_run;
  submit
      ->add_flag("--dry-run", dry_run,
                 "store no job: --dry-run validates the file here as the controller would, "
                 "sending nothing; --dry-run=server has the controller check it as a submission "
                 "(its workers, time limits, roots and checkpoint directories too)")
      ->option_text("[=server]")
      ->excludes(submit_watch)
      ->check(CLI::Validator(
          [](std::string& kind) -> std::string {
            if (kind == "true" || kind == "false" || kind == "client" || kind == "server") {
              return "";
            }
            return "'" + kind +
                   "' is not a kind of dry run; allowed: --dry-run (checked here) or "
                   "--dry-run=server";
          },
          "", ""));

  std::string job_id;
  std::vector<std::string> job_states;
  auto* jobs = app.add_subcommand("jobs", "list jobs");
  jobs->add_option("--state", job_states,
                   "only jobs in these states (repeat, or comma-separated): pending, scheduled, "
                   "starting, running, recovering, succeeded, failed, cancelled; active (not "
                   "ended), ended")
      ->delimiter(',')
      ->check(CLI::IsMember({"pending", "scheduled", "starting", "running", "recovering",
                             "succeeded", "failed", "cancelled", "active", "ended"}));
  auto* status = app.add_subcommand("status", "a job's state, attempts, ranks, results, events");
  status->add_option("JOB", job_id, "job id")->required();
  auto* watch = app.add_subcommand("watch", "follow a job until it ends");
  watch->add_option("JOB", job_id, "job id")->required();

  LogsOptions logs_options;
  auto* logs = app.add_subcommand("logs", "print a job's rank output");
  logs->add_option("JOB", job_id, "job id")->required();
  logs->add_option("--rank", logs_options.rank, "only this rank")->check(CLI::Range(0, 1 << 20));
  logs->add_option("--attempt", logs_options.attempt, "only this attempt (1, 2, ...)")
      ->check(CLI::Range(1, 1 << 20));
  logs->add_flag("--follow,-f", logs_options.follow,
                 "keep printing until the job ends (not with --json)");

  std::vector<std::string> cancel_ids;
  auto* cancel = app.add_subcommand("cancel", "cancel jobs");
  cancel->add_option("JOB", cancel_ids, "job ids (one or more)")->required();
  CancelOptions cancel_options;
  cancel->add_flag("--wait", cancel_options.wait,
                   "then wait until the ranks have stopped (a train job's write the checkpoint of "
                   "their step first) and print how they ended");
  app.add_subcommand("workers", "list workers");

  EventsOptions events_options;
  auto* events = app.add_subcommand(
      "events", "the audit log: who submitted, cancelled or changed what, and the outcome");
  events->add_option("--job", events_options.job_id, "only this job's events");
  events->add_option("--limit", events_options.limit, "the newest N events")
      ->check(CLI::Range(1, 10000))
      ->capture_default_str();

  ExportOptions export_options;
  auto* export_cmd = app.add_subcommand(
      "export", "write a job's committed checkpoint as a safetensors file (fp32, MODEL.md names)");
  export_cmd->add_option("JOB", job_id, "job id")->required();
  export_cmd
      ->add_option("--step", export_options.step,
                   "the checkpoint of this step (default: the newest that verifies)")
      ->check(NotNegative("a step is >= 0", "STEP"));
  export_cmd->add_option("--format", export_options.format, "output format: safetensors")
      ->capture_default_str();
  export_cmd->add_option("-o,--output", export_options.output, "the file to write")->required();

  SampleOptions sample_options;
  std::string sample_job;
  auto* sample = app.add_subcommand(
      "sample",
      "generate text from a job's committed checkpoint (or an exported safetensors file) on this "
      "machine's CPU, with a key-value cache");
  sample->add_option("JOB", sample_job, "job id (or --weights FILE)");
  sample->add_option("--weights", sample_options.weights,
                     "a safetensors file written by `furnace export` instead of a JOB");
  sample
      ->add_option("--step", sample_options.step,
                   "the JOB's checkpoint of this step (default: the newest that verifies)")
      ->check(NotNegative("a step is >= 0", "STEP"));
  sample->add_option("--prompt", sample_options.prompt, "the text to continue")->required();
  sample->add_option("-n,--tokens", sample_options.tokens, "tokens to generate at most")
      ->capture_default_str()
      ->check(NotNegative("-n is the number of tokens to generate, >= 0", "N"));
  sample->add_option("--temperature", sample_options.temperature, "0 for greedy decoding")
      ->capture_default_str();
  sample->add_option("--top-k", sample_options.top_k, "draw among the k likeliest tokens (0: all)")
      ->capture_default_str();
  sample->add_option("--seed", sample_options.seed, "the same seed gives the same text")
      ->capture_default_str();
  sample->add_option("--tokenizer", sample_options.tokenizer,
                     "byte, ids (token ids in decimal), or a tokenizer model file (default: the "
                     "job's data.tokenizer, ids for Markov data; required with --weights and for "
                     "data that does not record its tokenizer: indexed, or tokens without "
                     "data.tokenizer)");

  ReportOptions report_options;
  auto* report = app.add_subcommand(
      "report",
      "plots (SVG) and a summary of a training job's step series, written to a directory");
  report->add_option("JOB", job_id, "job id")->required();
  report->add_option("-o,--output", report_options.output, "the directory to write")->required();

  auto* data = app.add_subcommand("data", "prepare training data (no controller needed)");
  data->require_subcommand(1);
  DataPrepareOptions prepare_options;
  auto* prepare = data->add_subcommand(
      "prepare",
      "text files or JSON Lines -> a token file that records its tokenizer (byte-level, or a "
      "SentencePiece model from `data tokenizer train`); documents end with the "
      "end-of-document id (a SentencePiece model's always; the byte tokenizer's with --eod, "
      "else they run together)");
  prepare
      ->add_option("--input,-i", prepare_options.inputs,
                   "text files, one document each, or with --jsonl-field JSON Lines files, one "
                   "document per line (--input A B or --input A --input B)")
      ->required();
  prepare->add_option("-o,--output", prepare_options.output, "the token file to write")->required();
  prepare
      ->add_option("--tokenizer", prepare_options.tokenizer,
                   "`byte` (vocab 256, 257 with --eod) or a SentencePiece .model file")
      ->capture_default_str();
  prepare->add_option("--jsonl-field", prepare_options.jsonl_field,
                      "the inputs are JSON Lines; each line's document is this string field "
                      "(e.g. text)");
  prepare->add_flag("--eod", prepare_options.eod,
                    "byte tokenizer: append the end-of-document token (256) after each document "
                    "(a SentencePiece model always appends its own)");

  auto* tokenizer_cmd = data->add_subcommand("tokenizer", "subword tokenizers (SentencePiece)");
  tokenizer_cmd->require_subcommand(1);
  TokenizerTrainOptions train_options;
  auto* tokenizer_train = tokenizer_cmd->add_subcommand(
      "train",
      "train a SentencePiece vocabulary (unigram or BPE) on text files -> a .model file for "
      "`data prepare --tokenizer` and data.tokenizer; lossless on UTF-8 (byte fallback), "
      "end-of-document id 1");
  tokenizer_train
      ->add_option("--input,-i", train_options.inputs,
                   "text files; each line is one training sentence (at most a million are "
                   "sampled; a line over 4192 bytes is cut into pieces under that)")
      ->required();
  tokenizer_train
      ->add_option("--vocab", train_options.vocab,
                   "pieces in the model, including the 256 byte pieces (at least 260)")
      ->required();
  tokenizer_train->add_option("--model-type", train_options.model_type, "unigram or bpe")
      ->capture_default_str();
  tokenizer_train
      ->add_option("--character-coverage", train_options.character_coverage,
                   "the share of the text's characters (the most frequent first) that get a "
                   "piece of their own, 0.98 to 1 (0.9995 for text with thousands of "
                   "characters: Chinese, Japanese); the rest are spelled as their UTF-8 bytes")
      ->capture_default_str();
  tokenizer_train->add_option("-o,--output", train_options.output, "the .model file to write")
      ->required();

  PlanOptions plan_options;
  auto* plan = app.add_subcommand(
      "plan",
      "the MoE schedules (deepspeed, s1, s2) priced by the cost model on a job file's shapes: "
      "time and bytes per group per direction, op lists, and the schedule `auto` takes; then "
      "each pipeline stage's memory per rank: parameters and model state, activations of a "
      "micro-batch under none, selective and full_recompute, the least a memory.device_budget "
      "may be, and the job's memory settings weighed against them (no controller needed)");
  plan->add_option("FILE", file, "job YAML")->required();
  plan->add_option("--profile", plan_options.profile,
                   "a cost profile JSON (e.g. one a job's calibration wrote); default: the stated "
                   "default profile, intra- or inter-node links per --ranks-per-node");
  plan->add_option("--ranks-per-node", plan_options.ranks_per_node,
                   "ranks per node for the default profile (default: every rank on one node). "
                   "Ranks fill nodes in rank order; a group (tp, ep, esp) is intra-node iff "
                   "every rank's group of that kind, as parallel.order lays it out, lies on one "
                   "node (ep: with each member's esp group)")
      ->check(CLI::Range(1, 1 << 30));

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    std::string message;
    if (const std::string unknown = UnknownCommand(app, argc, argv); !unknown.empty()) {
      message = "unknown command '" + unknown + "'; the commands are " + CommandNames(app) +
                " (furnace --help)";
      std::cerr << "furnace: " << message << "\n";
    } else {
      const int code = app.exit(e);
      if (code == 0) return kExitOk;  // --help, --version
      message = e.what();
    }
    // --json's one document, for a command line that did not parse either (the flag is looked
    // for by hand: the parse that would have set it failed).
    if (std::any_of(argv + 1, argv + argc,
                    [](const char* a) { return std::string(a) == "--json"; })) {
      PrintJsonError(std::cout, absl::InvalidArgumentError(message), kExitUsage);
    }
    return kExitUsage;
  }
  submit_options.dry_run = dry_run.empty() || dry_run == "false" ? DryRun::kNo
                           : dry_run == "server"                 ? DryRun::kServer
                                                                 : DryRun::kClient;

  // Commands that talk to the controller need the credentials; certs, plan, data, a dry run here
  // and sampling from a weights file do not (nor fail on FURNACE_TOKEN without a CA).
  const bool needs_controller = !*certs && !*plan && !*data &&
                                !(*submit && submit_options.dry_run == DryRun::kClient) &&
                                !(*sample && !sample_options.weights.empty());
  std::unique_ptr<JobClient> client;
  if (needs_controller) {
    absl::Status token = absl::OkStatus();
    if (!token_file.empty()) {
      auto read = furnace::transport::ReadClientToken(token_file, "--token-file");
      token = read.status();
      if (read.ok()) security.token = *read;
    } else if (const char* env = std::getenv("FURNACE_TOKEN"); env != nullptr && *env != '\0') {
      token = furnace::transport::CheckToken(env, "FURNACE_TOKEN");
      security.token = env;
    }
    auto credentials = token.ok()
                           ? furnace::transport::MakeChannelCredentials(security)
                           : absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>>(token);
    if (!credentials.ok()) {
      // A token or TLS file that cannot be read is a local error (5); a malformed one, usage (2).
      std::cerr << "furnace: " << credentials.status().message() << "\n";
      return absl::IsNotFound(credentials.status()) ? kExitLocalError : kExitUsage;
    }
    client = NewGrpcJobClient(controller, *credentials);
  }
  CommandContext ctx;
  ctx.client = client.get();
  ctx.out = &std::cout;
  ctx.err = &std::cerr;
  ctx.json = json;
  ctx.tty = isatty(STDOUT_FILENO) != 0;
  ctx.err_tty = isatty(STDERR_FILENO) != 0;
  ctx.width = ctx.tty ? TerminalWidth() : 0;
  ctx.clock = &furnace::RealClock();
  ctx.sleep = [](double s) { std::this_thread::sleep_for(std::chrono::duration<double>(s)); };

  absl::StatusOr<int> result = absl::InternalError("no command");
  if (*submit) {
    result = RunSubmit(ctx, file, submit_options);
  } else if (*jobs) {
    result = RunJobs(ctx, job_states);
  } else if (*status) {
    result = RunStatus(ctx, job_id);
  } else if (*watch) {
    result = RunWatch(ctx, job_id);
  } else if (*logs) {
    result = RunLogs(ctx, job_id, logs_options);
  } else if (*cancel) {
    result = RunCancel(ctx, cancel_ids, cancel_options);
  } else if (app.got_subcommand("workers")) {
    result = RunWorkers(ctx);
  } else if (*events) {
    result = RunEvents(ctx, events_options);
  } else if (*export_cmd) {
    result = RunExport(ctx, job_id, export_options);
  } else if (*sample) {
    result = RunSample(ctx, sample_job, sample_options);
  } else if (*report) {
    result = RunReport(ctx, job_id, report_options);
  } else if (*prepare) {
    result = RunDataPrepare(ctx, prepare_options);
  } else if (*tokenizer_train) {
    result = RunTokenizerTrain(ctx, train_options);
  } else if (*plan) {
    result = RunPlan(ctx, file, plan_options);
  } else if (*certs_init) {
    result = RunCertsInit(ctx, certs_options);
  }
  std::cout.flush();
  if (result.ok()) return *result;
  const int exit_code = ExitCodeForStatus(result.status());
  // --json promises one JSON document per command: a failed one is an error document (the message
  // goes to stderr too, for a person reading the terminal).
  if (json) PrintJsonError(std::cout, result.status(), exit_code);
  // An invalid job file is the controller's report, meant to be read as it is.
  if (absl::IsInvalidArgument(result.status())) {
    std::cerr << result.status().message() << "\n";
  } else {
    std::cerr << "furnace: " << result.status().message() << "\n";
  }
  return exit_code;
}
