// The `furnace` commands. main.cc parses flags and calls these; each one talks to the controller
// through ctx.client (data prepare needs none), writes to ctx.out / ctx.err, and returns the
// process exit code for its outcome (0, or 1 for a job that ended FAILED or CANCELLED) or an error
// whose code main() maps through ExitCodeForStatus. None of them exits.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "controller/cli/client.h"
#include "google/protobuf/message.h"
#include "runtime/base/clock.h"
#include "runtime/data/sentencepiece_tokenizer.h"
#include "runtime/topology/topology.h"

namespace furnace::cli {

struct CommandContext {
  JobClient* client = nullptr;
  std::ostream* out = nullptr;
  std::ostream* err = nullptr;
  bool json = false;     // one JSON document per command instead of text
  bool tty = false;      // out is a terminal: watch redraws in place
  bool err_tty = false;  // err is a terminal: progress bars redraw in place
  int width = 0;         // terminal columns; 0 = do not cut lines
  const Clock* clock = nullptr;
  std::function<void(double seconds)> sleep;  // waits between polls
  double poll_interval_s = 0.5;
};

// The message as one JSON document (proto field names, default values included) and a newline.
absl::Status PrintJson(const google::protobuf::Message& message, std::ostream& out);

// Reads `path`, checks it (spec::CheckJobText: at most 1 MiB, valid UTF-8, else
// INVALID_ARGUMENT naming the file and the limit or the byte offset, and nothing is sent) and
// submits it. An invalid job comes back as INVALID_ARGUMENT with the controller's message; an
// unreadable file too. With `watch`, continues as Watch. A dry run stores no job: kClient parses
// and validates the file here as the controller would (without its --data-root /
// --checkpoint-root, workers and time limits) and sends nothing: prints "FILE: valid job <name>
// (<kind>, <ranks> ranks)" (--json: the resolved JobSpec); kServer has the controller check it as
// a submission (JobService.CheckJob) and prints that it would accept it, with what it would fill
// in (--json: the SubmitJobResponse, whose spec is the job as it would be stored).
enum class DryRun { kNo, kClient, kServer };
struct SubmitOptions {
  bool watch = false;
  DryRun dry_run = DryRun::kNo;
};
absl::StatusOr<int> RunSubmit(const CommandContext& ctx, const std::string& path,
                              const SubmitOptions& options);
// `states`: only jobs in one of these (JobState words as StateWord gives them, "active": not
// ended, "ended": succeeded, failed or cancelled); empty: every job.
absl::StatusOr<int> RunJobs(const CommandContext& ctx, const std::vector<std::string>& states = {});
absl::StatusOr<int> RunStatus(const CommandContext& ctx, const std::string& job_id);
// Polls until the job is final; exit code by ExitCodeForState. Once the controller has answered
// (`controller_answered`: before the first poll, as after a submission), an outage of up to
// kPollOutageGraceS is ridden out (poll_outage.h); a longer one ends the watch with its error.
absl::StatusOr<int> RunWatch(const CommandContext& ctx, const std::string& job_id,
                             bool controller_answered = false);

struct LogsOptions {
  int rank = -1;    // -1: all ranks
  int attempt = 0;  // 0: all attempts
  bool follow = false;
};
absl::StatusOr<int> RunLogs(const CommandContext& ctx, const std::string& job_id,
                            const LogsOptions& options);
// Cancels each job in turn. One job: its error is the command's. Several: a job that cannot be
// cancelled is said on stderr and the others still are; the exit code is the first failure's
// (--json: one document listing the jobs cancelled). Text: "job X is CANCELLED", and how the
// ranks left stop ("its 2 ranks stop after their step and write its checkpoint (within
// checkpoint.stop_grace_s 60 s)"). With `wait`, once every job is cancelled, waits until every
// rank of each one's last attempt has ended and prints how they ended, ranks that ended alike on
// one line (--json: the answers are printed then); a wait that fails counts as a failure.
struct CancelOptions {
  bool wait = false;
};
absl::StatusOr<int> RunCancel(const CommandContext& ctx, const std::vector<std::string>& job_ids,
                              const CancelOptions& options = {});
absl::StatusOr<int> RunWorkers(const CommandContext& ctx);

struct EventsOptions {
  std::string job_id;  // empty: every job
  uint32_t limit = 50;
};
// furnace events: the controller's audit log (ListAuditEvents), oldest first: time, who, what,
// job, outcome and why (--json: the response).
absl::StatusOr<int> RunEvents(const CommandContext& ctx, const EventsOptions& options);

struct ExportOptions {
  int64_t step = -1;                   // -1: the newest committed checkpoint that verifies
  std::string format = "safetensors";  // the only format
  std::string output;                  // the file to write
};
// Asks the controller for the job (GetJob) to learn its checkpoint directory, reads the committed
// checkpoint there directly (the directory must be visible from this machine), and writes its
// parameters as whole fp32 tensors with MODEL.md names and shapes (a parallel job's shards are
// reassembled: whole_checkpoint.h). Errors: an unknown format or no output file ->
// INVALID_ARGUMENT; the job unknown -> the controller's NOT_FOUND; no checkpoint directory or none
// committed yet, a checkpoint that does not verify (the loader's message naming the file) or whose
// shards leave part of a tensor out, an output that cannot be written -> a LocalError (exit 5).
// Newer checkpoints that were skipped as damaged, and replicas that disagree, are reported on
// ctx.err.
absl::StatusOr<int> RunExport(const CommandContext& ctx, const std::string& job_id,
                              const ExportOptions& options);

struct SampleOptions {
  std::string weights;       // a safetensors file instead of a JOB's checkpoint
  int64_t step = -1;         // the JOB's checkpoint of this step; -1: the newest that verifies
  std::string prompt;        // text (ids for the ids tokenizer)
  int tokens = 200;          // -n: tokens to generate at most
  double temperature = 1.0;  // 0: greedy
  int top_k = 0;             // 0: every token
  uint64_t seed = 0;
  std::string tokenizer;  // byte | ids | a tokenizer model; empty: the job's
};
// Generates text from a job's committed checkpoint (read here as export reads it, any layout) or a
// safetensors file with Furnace's model metadata, on this machine's CPU with a key-value cache,
// and prints it as it is drawn (runtime/model/generate.h: greedy at temperature 0, a fixed seed
// gives the same text). Errors: bad options -> INVALID_ARGUMENT naming the option; the job
// unknown -> NOT_FOUND; no checkpoint, an unreadable or foreign weights file -> a LocalError.
absl::StatusOr<int> RunSample(const CommandContext& ctx, const std::string& job_id,
                              const SampleOptions& options);

struct ReportOptions {
  std::string output;  // the directory to write (created, with parents)
};
// Fetches the job (GetJob) and all of its step records (GetJobSeries) and writes report.h's files
// into options.output; prints the directory and files written (--json: {job_id, dir, files,
// summary}). The job unknown -> the controller's NOT_FOUND; no output directory ->
// INVALID_ARGUMENT; a directory or file that cannot be written -> a LocalError (exit 5).
absl::StatusOr<int> RunReport(const CommandContext& ctx, const std::string& job_id,
                              const ReportOptions& options);

struct DataPrepareOptions {
  std::vector<std::string> inputs;  // text files (one document each) or JSON Lines files
  std::string output;               // the token file to write
  std::string tokenizer = "byte";   // "byte" or a SentencePiece model file
  std::string jsonl_field = {};     // non-empty: inputs are JSON Lines, one document per line
  bool eod = false;  // byte tokenizer: append the end-of-document id (256) after each document;
                     // a SentencePiece model always appends its own
};
// Tokenizes the inputs into one token file that records the tokenizer's identity
// (runtime/data/prepare.h); needs no controller. Shows a progress bar (input bytes) on ctx.err
// unless --json. No inputs or no output -> INVALID_ARGUMENT; a tokenizer or input that cannot be
// read or used (an empty file, a JSON Lines line without the field), or an output that cannot be
// written -> a LocalError (exit 5) naming the file.
absl::StatusOr<int> RunDataPrepare(const CommandContext& ctx, const DataPrepareOptions& options);

struct TokenizerTrainOptions {
  std::vector<std::string> inputs;     // text files; each line is a training sentence
  int64_t vocab = 0;                   // pieces in the model
  std::string model_type = "unigram";  // unigram | bpe
  std::string output;                  // the .model file to write
  // The share of the characters that get pieces of their own (the rest: byte fallback).
  double character_coverage = data::kDefaultCharacterCoverage;
};
// Trains a SentencePiece model (runtime/data/sentencepiece_tokenizer.h); needs no controller.
// Options the CLI can check (no inputs, no output, model type, vocab too small, character
// coverage out of range) ->
// INVALID_ARGUMENT; an input that cannot be read or is empty, a vocab the text cannot fill, an
// output that cannot be written -> a LocalError (exit 5).
absl::StatusOr<int> RunTokenizerTrain(const CommandContext& ctx,
                                      const TokenizerTrainOptions& options);

struct CertsInitOptions {
  std::string dir;
  std::vector<std::string> hosts;         // extra SAN entries of the controller's certificate
  std::vector<std::string> worker_hosts;  // hosts that get a worker certificate of their own
  bool force = false;                     // overwrite existing files
};
// furnace certs init DIR: writes a development CA, controller/worker/CLI certificates and tokens
// (transport/dev_certs.h) and prints the flags that use them; needs no controller. A file that
// exists without --force -> a LocalError (exit 5) naming it; a bad --host -> INVALID_ARGUMENT.
absl::StatusOr<int> RunCertsInit(const CommandContext& ctx, const CertsInitOptions& options);

struct PlanOptions {
  std::string profile;     // a CostProfile JSON (moe/cost_model.h); empty: the default profile
  int ranks_per_node = 0;  // default profile: ranks per node; 0 = every rank on one node
};
// furnace plan JOB.yaml, no controller needed: parses and validates the job file as submit's
// controller does (an invalid file -> INVALID_ARGUMENT with the same message), builds the MoE
// layers' shape (N = parallel.micro_batch * model.seq_len tokens per rank per micro-batch) and
// prints, for the MoE layers (they share one shape), each schedule's predicted forward and
// backward time, bytes per group (tp, ep, esp) per direction and op lists, and the schedule
// `auto` takes with its reason. Without a profile, a group is intra-node iff the whole group
// is on one node (PlanIntraNode). A profile that cannot be read -> a LocalError (exit
// 5); one that does not parse -> INVALID_ARGUMENT.
absl::StatusOr<int> RunPlan(const CommandContext& ctx, const std::string& path,
                            const PlanOptions& options);

// The default profile's placement rule, stated in `furnace plan --help`: ranks fill nodes in
// rank order, ranks_per_node to a node, and a group kind is intra-node iff every rank's group of
// that kind lies on one node (for ep: its EP group and each member's ESP group, the ranks an
// expert exchange reaches). The groups are the job's own (parallel.order included). Returns
// {tp, ep, esp}.
struct IntraNode {
  bool tp = true, ep = true, esp = true;
};
IntraNode PlanIntraNode(const topology::Topology& topology, int ranks_per_node);

}  // namespace furnace::cli
