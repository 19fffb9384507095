#include "controller/spec/cross_checks.h"

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "controller/spec/scalars.h"
#include "runtime/base/blend_slots.h"

namespace furnace::spec {
namespace {

// memory.host_link_gbps's least value other than 0 (unpaced): 1 MB/s.
constexpr double kMinHostLinkGbps = 0.001;
// The recovery limits' floors (seconds); see their check.
constexpr double kMinHangTimeoutS = 2;
constexpr double kMinStartTimeoutS = 1;
constexpr double kMinHealthCheckS = 1;

// "1, 2, 4, 8" for small n; "divisors of n" when the list would be long.
std::string Divisors(uint64_t n) {
  std::vector<uint64_t> out;
  for (uint64_t d = 1; d <= n && d <= 4096; ++d) {
    if (n % d == 0) out.push_back(d);
  }
  if (n > 4096 || out.size() > 16) return absl::StrCat("divisors of ", n);
  return absl::StrJoin(out, ", ");
}

class Checker {
 public:
  explicit Checker(Diagnostics* diag) : diag_(diag) {}

  // Reports `problem` about `paths[0]` (the field the message is about) unless a field in `paths`,
  // or one below it (a section's field, a list's entry), already failed on its own: its value was
  // then read as its default, and a problem judged on that would be the first one's echo. The
  // position is that of the first path present in the file, so the user is sent to a line they
  // wrote; a subject taking its default value is marked as such.
  void Fail(std::initializer_list<absl::string_view> paths, Problem problem) {
    for (absl::string_view p : paths) {
      if (diag_->FailedAtOrBelow(p)) return;
    }
    const absl::string_view subject = *paths.begin();
    absl::string_view anchor = subject;
    for (absl::string_view p : paths) {
      if (diag_->Present(p)) {
        anchor = p;
        break;
      }
    }
    if (!diag_->Present(subject) && !problem.got.empty()) {
      absl::StrAppend(&problem.got, ", the default");
    }
    diag_->Add(diag_->Where(anchor), subject, std::move(problem));
  }

  // `field`, written in the file, is not read under the setting of `related`: refused rather than
  // accepted and ignored.
  void RefuseIfPresent(absl::string_view field, absl::string_view related, Problem problem) {
    if (diag_->Present(field)) Fail({field, related}, std::move(problem));
  }

  // The first of `paths` present in the file, else the first.
  absl::string_view FirstPresent(std::initializer_list<absl::string_view> paths) const {
    for (absl::string_view p : paths) {
      if (diag_->Present(p)) return p;
    }
    return *paths.begin();
  }

  // `divisor` must divide `dividend`. Reported on the divisor when the user wrote it (that is the
  // knob being turned, e.g. parallel.tp against model.heads), else on the dividend.
  // `why`, when given, is appended to the message (", " + why): the condition that makes the check
  // apply.
  void Divides(absl::string_view divisor_path, uint64_t divisor, absl::string_view dividend_path,
               uint64_t dividend, absl::string_view why = "") {
    if (divisor == 0 || dividend % divisor == 0) return;
    if (diag_->Failed(divisor_path) || diag_->Failed(dividend_path)) return;
    const std::string suffix = why.empty() ? "" : absl::StrCat(", ", why);
    if (diag_->Present(divisor_path) || !diag_->Present(dividend_path)) {
      Fail({divisor_path}, Problem{absl::StrCat("inconsistent sizes: must divide ", dividend_path,
                                                " (= ", dividend, ")", suffix),
                                   absl::StrCat(divisor), Divisors(dividend)});
    } else {
      Fail({dividend_path},
           Problem{absl::StrCat("inconsistent sizes: must be a multiple of ", divisor_path,
                                " (= ", divisor, ")", suffix),
                   absl::StrCat(dividend), absl::StrCat("multiples of ", divisor)});
    }
  }

 private:
  Diagnostics* diag_;
};

// data: which of path / blend / validation each source takes (runtime/data/data_sources.h).
// The blend entry whose path is `path`, else -1.
int BlendEntryOf(const furnace::v1::DataSpec& d, const std::string& path) {
  if (path.empty()) return -1;
  for (int b = 0; b < d.blend_size(); ++b) {
    if (d.blend(b).path() == path) return b;
  }
  return -1;
}

// The rank's rules for a blend's weights (runtime/base/blend_slots.h), which need no file: a sum
// that is a finite number and a share of at least one of the 4096 slots for every dataset. One
// dataset alone takes every slot, whatever its weight.
void CheckBlendShares(Checker& c, const furnace::v1::DataSpec& d) {
  if (d.blend_size() < 2) return;
  std::vector<double> weights;
  double total = 0;
  for (const auto& b : d.blend()) {
    if (!(b.weight() > 0)) return;  // refused on its own (data.blend[i].weight: > 0)
    weights.push_back(b.weight());
    total += b.weight();
  }
  const std::optional<std::vector<int64_t>> counts = BlendSlotCounts(weights);
  if (!counts.has_value()) {
    c.Fail({"data.blend"}, Problem{"the weights' sum is not a finite number", absl::StrCat(total),
                                   "positive weights whose sum is finite; only their ratios "
                                   "matter"});
    return;
  }
  for (int b = 0; b < d.blend_size(); ++b) {
    if ((*counts)[b] > 0) continue;
    const std::string field = absl::StrCat("data.blend[", b, "].weight");
    c.Fail({field, "data.blend"},
           Problem{absl::StrCat("is below 1/", kBlendSlots,
                                " of the blend, the smallest share it lays out"),
                   absl::StrCat(d.blend(b).weight(), " of ", total, " in all"),
                   absl::StrCat("a weight >= 1/", kBlendSlots, " of the weights' sum")});
  }
}

void CheckData(const furnace::v1::DataSpec& d, const Diagnostics* diag, Checker& c) {
  const bool file_source = d.source() == "tokens" || d.source() == "indexed";
  if (d.source() == "indexed" && d.path().empty() && d.blend_size() == 0) {
    c.Fail({"data.path", "data.source"},
           Problem{"required when data.source is indexed (or data.blend)", "",
                   "an indexed-dataset prefix (PREFIX.bin and PREFIX.idx)"});
  } else if (d.source() == "tokens" && d.path().empty()) {
    c.Fail({"data.path", "data.source"},
           Problem{"required when data.source is tokens", "", "the path of a token file"});
  } else if (!file_source && diag->Present("data.path")) {
    c.Fail({"data.path", "data.source"},
           Problem{"only used when data.source is tokens or indexed",
                   absl::StrCat("'", d.path(), "' with source ", d.source()),
                   "omit it, or set data.source: tokens or indexed"});
  }
  if (d.blend_size() > 0) {
    if (d.source() != "indexed") {
      c.Fail({"data.blend", "data.source"},
             Problem{"only used when data.source is indexed",
                     absl::StrCat("a blend with source ", d.source()),
                     "omit it, or set data.source: indexed"});
    } else if (!d.path().empty()) {
      c.Fail({"data.blend", "data.path"},
             Problem{"give either data.path or data.blend, not both", "both",
                     "data.path: PREFIX, or data.blend: [{path: PREFIX, weight: W}, ...]"});
    }
    for (const auto& b : d.blend()) {
      if (b.path().empty()) {
        c.Fail({"data.blend.path"},
               Problem{"every blend entry needs a path", "", "an indexed-dataset prefix"});
        break;
      }
    }
    CheckBlendShares(c, d);
  }
  if (file_source && diag->Present("data.seed")) {
    c.Fail(
        {"data.seed"},
        Problem{"only used when data.source is markov (it seeds the chain); a file's "
                "shuffled order follows train.seed",
                absl::StrCat(d.seed(), " with source ", d.source()), "omit it, or set train.seed"});
  }
  const auto& v = d.validation();
  if (v.fraction() > 0 && !v.path().empty()) {
    c.Fail({"data.validation.fraction", "data.validation.path"},
           Problem{"give either data.validation.fraction or data.validation.path, not both", "both",
                   "fraction: F in (0, 0.5], or path: FILE"});
  } else if (!v.path().empty() && v.path() == d.path()) {
    // (A copy under another name is refused by the ranks, which compare the contents.)
    c.Fail({"data.validation.path", "data.path"},
           Problem{"is the training data: its loss would be measured on what is trained on",
                   absl::StrCat("'", v.path(), "'"),
                   "a held-out file, or data.validation.fraction to hold part of data.path out"});
  } else if (const int b = BlendEntryOf(d, v.path()); b >= 0) {
    const std::string blend_path = absl::StrCat("data.blend[", b, "].path");
    c.Fail({"data.validation.path", blend_path},
           Problem{absl::StrCat("is the training data (", blend_path,
                                "): its loss would be measured on what is trained on"),
                   absl::StrCat("'", v.path(), "'"),
                   "a held-out dataset, or data.validation.fraction to hold part of each "
                   "blended dataset out"});
  } else if (d.source() == "markov" && (v.fraction() > 0 || !v.path().empty())) {
    c.Fail({v.fraction() > 0 ? "data.validation.fraction" : "data.validation.path", "data.source"},
           Problem{"not used with data.source markov: its held-out data are independent draws "
                   "of the same chain",
                   "a held-out split of markov data", "omit data.validation"});
  }
}

}  // namespace

void CheckCrossFields(const furnace::v1::JobSpec& spec, Diagnostics* diag) {
  Checker c(diag);
  const auto& m = spec.model();
  // Fields that only a setting of another field gives a meaning: refused, not ignored.
  if (spec.train().schedule() == "constant" && diag->Present("train.min_lr")) {
    c.Fail({"train.min_lr", "train.schedule"},
           Problem{"only used by train.schedule cosine (the floor it decays to)",
                   absl::StrCat(spec.train().min_lr(), " with schedule constant"),
                   "omit it, or set train.schedule: cosine"});
  }
  if (spec.fault().mode().empty()) {
    for (const char* field : {"fault.rank", "fault.at_step", "fault.exit_code", "fault.worker",
                              "fault.every_attempt", "fault.mean_steps"}) {
      if (!diag->Present(field)) continue;
      c.Fail({field}, Problem{"only used with fault.mode (no fault is injected without one)", "",
                              "omit it, or set fault.mode: crash, hang, exit or health_check"});
      break;
    }
  }
  const auto& p = spec.parallel();
  const auto& moe = spec.moe();
  const uint64_t world = uint64_t{p.pp()} * p.dp() * p.tp();
  // A fault mode reads only some of the fault fields (worker/rank_progress.cc: MaybeInjectFault,
  // worker/health_check.cc): the others would be accepted and never act.
  const auto& fault = spec.fault();
  if (fault.mode() == "health_check") {
    // The check runs at each attempt's start, before any step, between two or more ranks, and
    // only with a bound (worker/health_check.cc).
    for (const char* field : {"fault.at_step", "fault.mean_steps"}) {
      c.RefuseIfPresent(field, "fault.mode",
                        Problem{"not used by fault.mode health_check (it fails the health check "
                                "at the attempt's start, before any step)",
                                "", "omit it, or fault.mode: crash, hang or exit"});
    }
    if (world < 2) {
      c.Fail({"fault.mode", "parallel.dp"},
             Problem{"health_check needs two or more ranks (a rank of one has no peer to check, "
                     "so no health check runs and the fault would never be injected)",
                     absl::StrCat("'health_check' with ", world, " rank"),
                     "crash, hang or exit, or pp * dp * tp >= 2"});
    } else if (spec.recovery().health_check_s() <= 0) {
      c.Fail({"fault.mode", "recovery.health_check_s"},
             Problem{"health_check needs recovery.health_check_s > 0 (at 0 no health check runs, "
                     "so the fault would never be injected)",
                     "'health_check'", "crash, hang or exit, or recovery.health_check_s > 0"});
    }
  }
  if (!fault.worker().empty()) {
    // The rank is whichever runs on that worker (worker/rank_progress.cc FaultTargets).
    c.RefuseIfPresent("fault.rank", "fault.worker",
                      Problem{"not used with fault.worker (the fault hits whichever rank runs on "
                              "that worker)",
                              absl::StrCat(fault.rank()), "omit fault.rank or fault.worker"});
  }
  if (!fault.mode().empty() && fault.mode() != "exit") {
    c.RefuseIfPresent(
        "fault.exit_code", "fault.mode",
        Problem{absl::StrCat("only used by fault.mode exit (this fault is ", fault.mode(), ")"),
                absl::StrCat(fault.exit_code()), "omit it, or fault.mode: exit"});
  }

  // Ranks are int32 on the wire (fault.rank) and uint32 in resources.workers.
  if (world > INT32_MAX) {
    c.Fail({c.FirstPresent({"parallel.pp", "parallel.dp", "parallel.tp"}), "parallel.pp",
            "parallel.dp", "parallel.tp"},
           Problem{"inconsistent sizes: pp * dp * tp is too large",
                   absl::StrCat(p.pp(), " * ", p.dp(), " * ", p.tp(), " = ", world),
                   absl::StrCat("pp * dp * tp <= ", INT32_MAX)});
  }

  if (diag->Present("resources.workers") && spec.resources().workers() != world) {
    c.Fail({"resources.workers", "parallel.pp", "parallel.dp", "parallel.tp"},
           Problem{"inconsistent sizes: resources.workers must equal parallel.pp * parallel.dp * "
                   "parallel.tp",
                   absl::StrCat(spec.resources().workers()),
                   absl::StrCat(world, " = pp ", p.pp(), " * dp ", p.dp(), " * tp ", p.tp())});
  }

  // A section only the other kind reads is refused rather than accepted and ignored: a
  // commcheck builds no model and trains nothing (its ranks run collectives on
  // resources.device), and a train job runs no commcheck.
  static constexpr absl::string_view kTrainSections[] = {"model", "moe",        "memory", "train",
                                                         "data",  "checkpoint", "eval"};
  if (spec.kind() == "commcheck") {
    for (absl::string_view section : kTrainSections) {
      if (!diag->Present(section)) continue;
      c.Fail({section, "kind"},
             Problem{"applies to train jobs only (a commcheck builds no model and trains nothing)",
                     absl::StrCat("a '", section, "' section"),
                     absl::StrCat("no '", section, "' section, or kind: train")});
    }
  }
  // And the parallel fields only a train job's layout reads: a commcheck's ranks are pp * dp * tp
  // peers of one world group, with no experts, micro-batches or rank order (nor shrink ep/esp).
  if (spec.kind() == "commcheck") {
    std::vector<std::string> train_fields = {"parallel.ep", "parallel.esp", "parallel.micro_batch",
                                             "parallel.micro_batches", "parallel.order"};
    for (int i = 0; i < spec.recovery().shrink_size(); ++i) {
      for (const char* size : {"ep", "esp"}) {
        train_fields.push_back(absl::StrCat("recovery.shrink[", i, "].", size));
      }
    }
    for (const std::string& field : train_fields) {
      if (!diag->Present(field)) continue;
      c.Fail({field, "kind"},
             Problem{"applies to train jobs only (a commcheck's ranks are pp * dp * tp peers of "
                     "one world group: no experts, micro-batches or rank order)",
                     "", "omit it, or kind: train"});
    }
  }
  if (spec.kind() == "train" && diag->Present("commcheck")) {
    c.Fail({"commcheck", "kind"},
           Problem{"applies to commcheck jobs only (a train job runs no commcheck)",
                   "a 'commcheck' section", "no 'commcheck' section, or kind: commcheck"});
  }

  // Model shape and the layout that splits it (runtime/topology checks these again in every rank,
  // too late for a clear message). Only a training job builds the model and its expert groups; a
  // commcheck ignores both, so a commcheck on e.g. pp=4 need not also raise model.layers.
  c.Divides("model.heads", m.heads(), "model.d_model", m.d_model());
  if (spec.kind() == "train") {
    // Expert groups tile the dp x tp ranks of one pipeline stage.
    const uint64_t ep_esp = uint64_t{p.ep()} * p.esp();
    const uint64_t dp_tp = uint64_t{p.dp()} * p.tp();
    if (dp_tp % ep_esp != 0) {
      c.Fail({c.FirstPresent({"parallel.ep", "parallel.esp"}), "parallel.ep", "parallel.esp",
              "parallel.dp", "parallel.tp"},
             Problem{"inconsistent sizes: ep * esp must divide dp * tp",
                     absl::StrCat("ep * esp = ", p.ep(), " * ", p.esp(), " = ", ep_esp,
                                  ", dp * tp = ", p.dp(), " * ", p.tp(), " = ", dp_tp),
                     absl::StrCat("ep * esp in {", Divisors(dp_tp), "}")});
    }
    c.Divides("parallel.tp", p.tp(), "model.heads", m.heads());
    c.Divides("parallel.tp", p.tp(), "model.d_model", m.d_model());
    // Stages may hold different numbers of layers (the first layers % pp take one more), but each
    // holds at least one.
    if (p.pp() > m.layers()) {
      c.Fail({"parallel.pp", "model.layers"},
             Problem{absl::StrCat("inconsistent sizes: must be <= model.layers (= ", m.layers(),
                                  "): every pipeline stage holds at least one layer (an uneven "
                                  "split is fine, the first stages take one more)"),
                     absl::StrCat(p.pp()), absl::StrCat("1..", m.layers())});
    }
    // Layer l is MoE when l % moe_every == moe_every - 1: with moe_every > layers none is, and
    // the moe section would be accepted and never act.
    if (m.moe_every() > m.layers()) {
      c.Fail({"model.moe_every", "model.layers"},
             Problem{absl::StrCat("must be <= model.layers (= ", m.layers(),
                                  "): layer l is MoE when (l + 1) is a multiple of moe_every, so "
                                  "no layer would be"),
                     absl::StrCat(m.moe_every()), absl::StrCat("1..", m.layers())});
    } else if (m.moe_every() == 1) {
      c.RefuseIfPresent(
          "model.dense_ffn", "model.moe_every",
          Problem{"only used by dense layers, and with model.moe_every 1 every layer is MoE",
                  absl::StrCat(m.dense_ffn()),
                  "omit it, or model.moe_every >= 2 (then every moe_every-th layer is MoE)"});
    }
    // Products the runtime holds in 32-bit ints (runtime/model/module.h: Dims::N, the routed
    // rows N * k; the trainer's first micro-batch of a data-parallel rank, dp * micro_batches).
    const uint64_t routed = uint64_t{p.micro_batch()} * m.seq_len() * moe.top_k();
    if (routed > INT32_MAX) {
      c.Fail({c.FirstPresent({"parallel.micro_batch", "model.seq_len", "moe.top_k"}),
              "parallel.micro_batch", "model.seq_len", "moe.top_k"},
             Problem{"inconsistent sizes: a micro-batch's routed token copies (micro_batch * "
                     "seq_len * top_k) are too many",
                     absl::StrCat(p.micro_batch(), " * ", m.seq_len(), " * ", moe.top_k(), " = ",
                                  routed),
                     absl::StrCat("micro_batch * seq_len * top_k <= ", INT32_MAX)});
    }
    const uint64_t sequences = uint64_t{p.dp()} * p.micro_batches() * p.micro_batch();
    if (sequences > INT32_MAX) {
      c.Fail({c.FirstPresent({"parallel.micro_batches", "parallel.micro_batch", "parallel.dp"}),
              "parallel.micro_batches", "parallel.micro_batch", "parallel.dp"},
             Problem{"inconsistent sizes: a step's sequences (dp * micro_batches * micro_batch) "
                     "are too many",
                     absl::StrCat(p.dp(), " * ", p.micro_batches(), " * ", p.micro_batch(), " = ",
                                  sequences),
                     absl::StrCat("dp * micro_batches * micro_batch <= ", INT32_MAX)});
    }
    c.Divides("parallel.ep", p.ep(), "moe.experts", moe.experts());
    c.Divides("parallel.esp", p.esp(), "model.expert_ffn", m.expert_ffn());
    // Layer l is MoE when l % moe_every == moe_every - 1, so moe_every > 1 leaves layer 0 (at
    // least) dense, with a tensor-parallel MLP of width dense_ffn (0: 4 * d_model).
    if (m.moe_every() > 1) {
      const uint64_t dense_ffn = m.dense_ffn() != 0 ? m.dense_ffn() : 4ull * m.d_model();
      c.Divides(
          "parallel.tp", p.tp(), "model.dense_ffn", dense_ffn,
          absl::StrCat("the width of the dense layers (model.moe_every = ", m.moe_every(), ")"));
    }
  }

  // s1 and s2 pause tensor parallelism inside the MoE layer: with tp 1 (in every layout the job
  // may run, its shrink layouts too) there is nothing to pause and they would run as deepspeed
  // under another name. (auto, which chooses, takes deepspeed there.)
  if (spec.kind() == "train" && (moe.schedule() == "s1" || moe.schedule() == "s2") && p.tp() == 1 &&
      std::all_of(spec.recovery().shrink().begin(), spec.recovery().shrink().end(),
                  [](const furnace::v1::LayoutSpec& l) { return l.tp() <= 1; })) {
    c.Fail({"moe.schedule", "parallel.tp"},
           Problem{absl::StrCat(moe.schedule(),
                                " pauses tensor parallelism around the MoE layer, and parallel.tp "
                                "is 1: there is nothing to pause, so it would run as deepspeed"),
                   absl::StrCat("'", moe.schedule(), "'"),
                   "deepspeed or auto with parallel.tp 1, or parallel.tp > 1"});
  }

  // s1 splits each micro-batch's tokens evenly over the tp peers before the gate
  // (runtime/moe/schedule.h); s2 and deepspeed keep every token on every peer, and auto picks s1
  // only where the split is even.
  if (spec.kind() == "train" && moe.schedule() == "s1" && p.tp() > 1) {
    const uint64_t tokens = uint64_t{p.micro_batch()} * m.seq_len();
    if (tokens % p.tp() != 0) {
      c.Fail({"moe.schedule", "parallel.tp", "parallel.micro_batch", "model.seq_len"},
             Problem{absl::StrCat("s1 splits a micro-batch's tokens over parallel.tp (= ", p.tp(),
                                  "), but parallel.micro_batch * model.seq_len = ", p.micro_batch(),
                                  " * ", m.seq_len(), " = ", tokens, " does not divide by it"),
                     "'s1'",
                     absl::StrCat("s2, auto or deepspeed, or a micro_batch * seq_len divisible "
                                  "by tp = ",
                                  p.tp())});
    }
  }

  // Accepted means implemented: these fields are part of the schema but not of this build's
  // runtime, so any value but the default is refused instead of being parsed and then ignored.
  // field_uses.h lists every field of the spec as used or refused; a test holds it.
  // resources.device: a train job's ranks train on it (worker/train_rank.cc), a commcheck's run
  // their collectives on its memory (NCCL between GPUs: worker/rank_main.cc); both are placed on
  // workers of that kind.
  // model.precision bf16 is the GEMMs of a discrete device's table (runtime/device/backend.h).
  if (spec.model().precision() == "bf16" && spec.resources().device() == "cpu") {
    c.Fail({"model.precision", "resources.device"},
           Problem{"bf16 runs on a discrete device (resources.device cuda or emulated); the CPU "
                   "trains in fp32",
                   "'bf16'", "fp32 with resources.device cpu, or bf16 with cuda or emulated"});
  }
  if (spec.kind() == "train") {
    const std::string& policy = spec.memory().policy();
    // The offload settings do something only where something offloads, the codec only under
    // adaptive; elsewhere they would be accepted and ignored (whatever the value written).
    if (policy != "offload") {
      c.RefuseIfPresent(
          "memory.offload_ratio", "memory.policy",
          Problem{absl::StrCat("applies only to memory.policy offload (this job's policy is ",
                               policy, ")"),
                  absl::StrCat(spec.memory().offload_ratio()),
                  "omit it, or memory.policy: offload"});
    }
    if (policy != "offload" && policy != "adaptive") {
      c.RefuseIfPresent("memory.host_link_gbps", "memory.policy",
                        Problem{absl::StrCat("applies only to memory.policy offload or adaptive "
                                             "(this job's policy is ",
                                             policy, ")"),
                                absl::StrCat(spec.memory().host_link_gbps()),
                                "omit it, or memory.policy: offload or adaptive"});
    }
    if (policy != "adaptive") {
      c.RefuseIfPresent(
          "memory.codec", "memory.policy",
          Problem{absl::StrCat("applies only to memory.policy adaptive (this job's policy is ",
                               policy, ")"),
                  absl::StrCat("'", spec.memory().codec(), "'"),
                  "omit it, or memory.policy: adaptive"});
    }
    // A link slower than 1 MB/s (a typo's 1e-6) would stall every step on its copies for longer
    // than a step watchdog allows, reported as an unexplained hang. The benchmarks' slowest, the
    // H200's compute-to-link ratio on a CPU, is a few MB/s.
    if (const double link = spec.memory().host_link_gbps(); link > 0 && link < kMinHostLinkGbps) {
      c.Fail(
          {"memory.host_link_gbps"},
          Problem{"a host link this slow would stall every step on its copies", absl::StrCat(link),
                  absl::StrCat("0 (unpaced), or at least ", kMinHostLinkGbps, " (1 MB/s)")});
    }
    // The planner acts when a micro-batch's projected peak would not fit the budget: without one
    // it never would (policy none under another name).
    if (policy == "adaptive" && spec.memory().device_budget() == 0) {
      c.Fail({"memory.device_budget", "memory.policy"},
             Problem{"memory.policy adaptive needs a budget: its planner acts only when a "
                     "micro-batch's activations would not fit memory.device_budget, so without "
                     "one it never would",
                     "0",
                     absl::StrCat("the bytes a rank's activations may use (", kSizeUnitsHelp,
                                  "), or memory.policy: none")});
    }
  }

  if (moe.top_k() > moe.experts()) {
    c.Fail({"moe.top_k", "moe.experts"},
           Problem{absl::StrCat("must be <= moe.experts (= ", moe.experts(), ")"),
                   absl::StrCat(moe.top_k()), absl::StrCat("1..", moe.experts())});
  }

  // Routing spikes (MODEL.md "Routing-spike injection"): at max_ratio = E / k every token of a
  // spiking layer is forced onto one expert, which is as far as a spike can go.
  const auto& sp = moe.spikes();
  if (sp.probability() == 0) {
    for (const char* field : {"moe.spikes.max_ratio", "moe.spikes.seed"}) {
      if (!diag->Present(field)) continue;
      c.Fail({field, "moe.spikes.probability"},
             Problem{"only used when moe.spikes.probability > 0 (no spike is injected at 0)", "",
                     "omit it, or set moe.spikes.probability in (0, 1]"});
    }
  }
  if (moe.top_k() >= 1 && moe.top_k() <= moe.experts() &&
      sp.max_ratio() * moe.top_k() > moe.experts()) {
    const double bound = static_cast<double>(moe.experts()) / moe.top_k();
    c.Fail({"moe.spikes.max_ratio", "moe.experts", "moe.top_k"},
           Problem{absl::StrCat("must be <= moe.experts / moe.top_k (= ", moe.experts(), " / ",
                                moe.top_k(), " = ", bound,
                                "): at that ratio every token goes to the spiking expert"),
                   absl::StrCat(sp.max_ratio()), absl::StrCat("[1, ", bound, "]")});
  }

  const auto& t = spec.train();
  if (t.min_lr() > t.lr()) {
    c.Fail({"train.min_lr", "train.lr"},
           Problem{absl::StrCat("must be <= train.lr (= ", t.lr(), ")"), absl::StrCat(t.min_lr()),
                   absl::StrCat("[0, ", t.lr(), "]")});
  }
  if (t.warmup() > t.steps()) {
    c.Fail({"train.warmup", "train.steps"},
           Problem{absl::StrCat("must be <= train.steps (= ", t.steps(), ")"),
                   absl::StrCat(t.warmup()), absl::StrCat("0..", t.steps())});
  }

  CheckData(spec.data(), diag, c);
  // Markov data is a dense vocab x vocab chain in every rank (runtime/data/markov.h: transition
  // probabilities and their CDF, 16 bytes an entry, built in O(vocab^2) per power-iteration pass;
  // the held-out sampler shares it): a real vocab's 50,304 would take 38 GiB a rank.
  constexpr uint64_t kMaxMarkovVocab = 4096;
  if (spec.kind() == "train" && spec.data().source() == "markov" && m.vocab() > kMaxMarkovVocab) {
    const double gib = 16.0 * m.vocab() * m.vocab() / (1ull << 30);
    c.Fail({"model.vocab", "data.source"},
           Problem{absl::StrCat("too large for data.source markov (a dense vocab x vocab chain "
                                "in every rank; at most ",
                                kMaxMarkovVocab, ")"),
                   absl::StrFormat("%d (%.1f GiB a rank)", m.vocab(), gib),
                   absl::StrCat("model.vocab <= ", kMaxMarkovVocab,
                                ", or data.source: tokens (furnace data prepare) or indexed")});
  }

  // An interval past the last step would be accepted and never reached: only the final
  // checkpoint (or evaluation) would happen, which is what 0 says.
  if (spec.kind() == "train") {
    struct Interval {
      const char* field;
      uint64_t every;
      std::string otherwise;  // the allowed values besides 1..steps
    };
    for (const Interval& i :
         {Interval{"checkpoint.every", spec.checkpoint().every(),
                   ", or 0 (only the final checkpoint), or auto"},
          Interval{"eval.every", spec.eval().every(),
                   absl::StrCat(" (", t.steps(), ": once, after the last step), or 0 (off)")}}) {
      if (i.every <= t.steps()) continue;
      c.Fail({i.field, "train.steps"},
             Problem{absl::StrCat("must be <= train.steps (= ", t.steps(),
                                  "): the interval would never be reached"),
                     absl::StrCat(i.every), absl::StrCat("1..", t.steps(), i.otherwise)});
    }
  }
  const auto& ev = spec.eval();
  if (ev.every() > 0 && ev.batches() == 0) {
    c.Fail({"eval.batches", "eval.every"},
           Problem{"must be >= 1 when eval.every is set", "0",
                   "1 or more held-out micro-batches of parallel.micro_batch sequences"});
  } else if (ev.every() == 0 && diag->Present("eval.batches")) {
    c.Fail({"eval.batches", "eval.every"},
           Problem{"only used when eval.every > 0",
                   absl::StrCat(ev.batches(), " with eval.every 0"), "omit it, or set eval.every"});
  }
  const auto& d = spec.data();
  const bool held_out_split = d.validation().fraction() > 0 || !d.validation().path().empty();
  if (ev.every() > 0 && d.source() != "markov" && !held_out_split) {
    // Markov data has an independent held-out stream; token and indexed data need a held-out
    // split (data.validation).
    c.Fail({"eval.every", "data.validation"},
           Problem{absl::StrCat("needs held-out data: data.source ", d.source(),
                                " needs data.validation (a fraction of the data or its own files)"),
                   absl::StrCat(ev.every()),
                   "0 (off), or set data.validation: {fraction: F} or {path: FILE}"});
  }
  if (ev.every() == 0 && held_out_split) {
    // The split is taken out of training for eval.every alone (worker/train_rank.cc): without it
    // the data would be held out and never read.
    const bool fraction = d.validation().fraction() > 0;
    c.Fail({fraction ? "data.validation.fraction" : "data.validation.path", "eval.every"},
           Problem{fraction ? "holds data out of training for held-out evaluation, but eval.every "
                              "is 0, so nothing would ever read it"
                            : "is held-out data for evaluation, but eval.every is 0, so nothing "
                              "would ever read it",
                   fraction ? absl::StrCat(d.validation().fraction()) : d.validation().path(),
                   "omit data.validation, or set eval: {every: N, batches: B}"});
  }
  // data.tokenizer: what can be checked without the file, which may exist only on the workers.
  if (diag->Present("data.tokenizer")) {
    if (d.source() != "tokens") {
      // Markov data has no tokenizer; an indexed dataset does not record the one that made it,
      // so there is nothing to check it against.
      c.Fail({"data.tokenizer", "data.source"},
             Problem{"only used with token data: the synthetic Markov chain has no tokenizer and "
                     "an indexed dataset does not record one",
                     absl::StrCat("'", d.tokenizer(), "' with source ", d.source()),
                     "omit it, or set data.source: tokens"});
    } else if (d.tokenizer().empty()) {
      c.Fail({"data.tokenizer"},
             Problem{"empty", "''",
                     "byte, or the path of a SentencePiece .model file (furnace "
                     "data tokenizer train)"});
    } else if (d.tokenizer() == "byte" && spec.model().vocab() < 256) {
      c.Fail({"model.vocab", "data.tokenizer"},
             Problem{"the byte tokenizer's ids go up to 255 (256 with the end-of-document id)",
                     absl::StrCat(spec.model().vocab()),
                     ">= 256 with data.tokenizer: byte (>= 257 when the file was prepared with "
                     "--eod)"});
    }
  }

  const auto& b = spec.recovery().backoff();
  if (b.max_s() < b.initial_s()) {
    c.Fail({"recovery.backoff.max_s", "recovery.backoff.initial_s"},
           Problem{absl::StrCat("must be >= recovery.backoff.initial_s (= ", b.initial_s(), ")"),
                   absl::StrCat(b.max_s()), absl::StrCat(">= ", b.initial_s())});
  }

  const auto& r = spec.recovery();
  // Floors below which a limit can only fail a healthy job, and then under another name (a 1 ms
  // start_timeout_s failed the rendezvous and excluded a worker for the health check's lateness).
  // The ranks' watchdogs and heartbeats tick about once a second, and a rank's start (a process,
  // its rendezvous, its groups) or a health-check collective takes a sizeable part of a second.
  const struct {
    const char* field;
    double value, floor;
    const char* why;
  } floors[] = {
      {"recovery.hang_timeout_s", r.hang_timeout_s(), kMinHangTimeoutS,
       "the ranks' watchdogs and heartbeats tick about once a second, so a shorter limit calls "
       "healthy ranks hung"},
      {"recovery.start_timeout_s", r.start_timeout_s(), kMinStartTimeoutS,
       "a rank's start (its process, the rendezvous, its groups' connections) cannot finish "
       "sooner"},
  };
  for (const auto& f : floors) {
    if (f.value < f.floor) {
      c.Fail({f.field}, Problem{absl::StrCat("must be at least ", f.floor, " s: ", f.why),
                                absl::StrCat(f.value), absl::StrCat(">= ", f.floor)});
    }
  }
  // (Its default, half a refused hang_timeout_s, is the user's to fix through hang_timeout_s.)
  if (diag->Present("recovery.health_check_s") && r.health_check_s() > 0 &&
      r.health_check_s() < kMinHealthCheckS) {
    c.Fail({"recovery.health_check_s"},
           Problem{absl::StrCat("must be 0 (off) or at least ", kMinHealthCheckS,
                                " s: the check's collectives cannot finish sooner"),
                   absl::StrCat(r.health_check_s()), absl::StrCat("0, or >= ", kMinHealthCheckS)});
  }
  if (r.health_check_s() >= r.hang_timeout_s()) {
    c.Fail(
        {"recovery.health_check_s", "recovery.hang_timeout_s"},
        Problem{absl::StrCat("must be < recovery.hang_timeout_s (= ", r.hang_timeout_s(),
                             "): a rank stuck in the health check would be killed as hung "
                             "before the check could name it"),
                absl::StrCat(r.health_check_s()), absl::StrCat("[0, ", r.hang_timeout_s(), ")")});
  }

  const auto& cc = spec.commcheck();
  if (cc.min_bytes() > cc.max_bytes()) {
    c.Fail(
        {"commcheck.min_bytes", "commcheck.max_bytes"},
        Problem{absl::StrCat("must be <= commcheck.max_bytes (= ", FormatSize(cc.max_bytes()), ")"),
                FormatSize(cc.min_bytes()), absl::StrCat("4..", FormatSize(cc.max_bytes()))});
  }

  CheckShrinkLayouts(spec, diag);

  const auto& f = spec.fault();
  if (static_cast<uint64_t>(f.rank()) >= world) {
    c.Fail({"fault.rank"},
           Problem{absl::StrCat("must be < the world size pp * dp * tp (= ", world, ")"),
                   absl::StrCat(f.rank()), absl::StrCat("0..", world - 1)});
  }
  if (f.mean_steps() > 0 && f.at_step() > 0) {
    c.Fail({"fault.mean_steps", "fault.at_step"},
           Problem{absl::StrCat("fails at random steps; fault.at_step (= ", f.at_step(),
                                ") fails at one: set one of them"),
                   absl::StrCat(f.mean_steps()), "0 (the default), or fault.at_step: 0"});
  }
  // (fault.mean_steps without fault.mode: the fields-without-a-mode rule above.)
  // A fault at a step or round the job never reaches would be accepted and never injected.
  const uint64_t last = spec.kind() == "train" ? spec.train().steps() : spec.commcheck().rounds();
  if (!f.mode().empty() && f.mode() != "health_check" && f.at_step() > last) {
    c.Fail({"fault.at_step", spec.kind() == "train" ? "train.steps" : "commcheck.rounds"},
           Problem{absl::StrCat("must be <= the job's last ",
                                spec.kind() == "train" ? "step (train.steps = "
                                                       : "round (commcheck.rounds = ",
                                last, "): the fault would never be injected"),
                   absl::StrCat(f.at_step()), absl::StrCat("0..", last)});
  }
  if (f.mean_steps() > 0 && spec.kind() != "train") {
    c.Fail({"fault.mean_steps", "kind"},
           Problem{absl::StrCat("counts training steps; this job's kind is ", spec.kind()),
                   absl::StrCat(f.mean_steps()), "0 (the default), or kind: train"});
  }
}

}  // namespace furnace::spec
