// recovery.shrink: every allowed smaller layout is checked at submit like the job's own layout, so
// a restart never discovers in its ranks that the layout it shrank to cannot run the model.
//
// The global batch is kept across a shrink: global batch = micro_batch * micro_batches * dp, so an
// attempt under dp' runs micro_batches * dp / dp' micro-batches per step; a layout for which that
// is not a whole number is refused here (controller/store/placement.h computes it for the attempt).
#include <cstdint>
#include <string>

#include "absl/strings/str_cat.h"
#include "controller/spec/cross_checks.h"

namespace furnace::spec {
namespace {

std::string Sizes(const furnace::v1::LayoutSpec& l) {
  return absl::StrCat("pp ", l.pp(), " dp ", l.dp(), " tp ", l.tp(), " ep ", l.ep(), " esp ",
                      l.esp());
}

}  // namespace

void CheckShrinkLayouts(const furnace::v1::JobSpec& spec, Diagnostics* diag) {
  const auto& p = spec.parallel();
  const auto& m = spec.model();
  uint64_t previous = uint64_t{p.pp()} * p.dp() * p.tp();
  std::string previous_name = absl::StrCat("the job's layout (", previous, " ranks)");
  for (int i = 0; i < spec.recovery().shrink_size(); ++i) {
    const furnace::v1::LayoutSpec& l = spec.recovery().shrink(i);
    const std::string base = absl::StrCat("recovery.shrink[", i, "]");
    // Reported on the size the user wrote when the problem is about one size, else on the entry.
    auto fail = [&](const char* size, std::string what, std::string got, std::string allowed) {
      std::string path = size != nullptr ? absl::StrCat(base, ".", size) : base;
      if (diag->Failed(path)) return;
      if (size != nullptr && !diag->Present(path)) {
        absl::StrAppend(&got, " (the job's parallel.", size, ")");
      }
      diag->Add(diag->Where(path), path,
                Problem{std::move(what), std::move(got), std::move(allowed)});
    };
    if (l.pp() == 0 || l.dp() == 0 || l.tp() == 0 || l.ep() == 0 || l.esp() == 0) continue;
    // An entry with a problem of its own (a misspelt size, a bad value) is not judged on the sizes
    // it fell back to: its first error would be about a layout the user did not write.
    if (diag->FailedAtOrBelow(base)) continue;
    const uint64_t world = uint64_t{l.pp()} * l.dp() * l.tp();
    if (world >= previous) {
      fail(nullptr,
           absl::StrCat("a shrink layout must have fewer ranks than ", previous_name,
                        "; list them largest first"),
           absl::StrCat(Sizes(l), " = ", world, " ranks"),
           absl::StrCat("pp * dp * tp < ", previous));
      continue;
    }
    previous = world;
    previous_name = absl::StrCat("recovery.shrink[", i, "] (", world, " ranks)");
    if (spec.kind() != "train") continue;
    const uint64_t dp_tp = uint64_t{l.dp()} * l.tp();
    const uint64_t ep_esp = uint64_t{l.ep()} * l.esp();
    if (dp_tp % ep_esp != 0) {
      fail("ep", "inconsistent sizes: ep * esp must divide dp * tp",
           absl::StrCat("ep * esp = ", ep_esp, ", dp * tp = ", dp_tp),
           absl::StrCat("ep * esp dividing ", dp_tp));
    }
    if (spec.moe().experts() % l.ep() != 0) {
      fail("ep", absl::StrCat("must divide moe.experts (= ", spec.moe().experts(), ")"),
           absl::StrCat(l.ep()), absl::StrCat("divisors of ", spec.moe().experts()));
    }
    if (m.expert_ffn() % l.esp() != 0) {
      fail("esp", absl::StrCat("must divide model.expert_ffn (= ", m.expert_ffn(), ")"),
           absl::StrCat(l.esp()), absl::StrCat("divisors of ", m.expert_ffn()));
    }
    if (m.heads() % l.tp() != 0 || m.d_model() % l.tp() != 0) {
      fail("tp",
           absl::StrCat("must divide model.heads (= ", m.heads(),
                        ") and model.d_model (= ", m.d_model(), ")"),
           absl::StrCat(l.tp()), "common divisors of heads and d_model");
    }
    const uint64_t dense_ffn = m.dense_ffn() != 0 ? m.dense_ffn() : 4ull * m.d_model();
    if (m.moe_every() > 1 && dense_ffn % l.tp() != 0) {
      fail("tp", absl::StrCat("must divide model.dense_ffn (= ", dense_ffn, ")"),
           absl::StrCat(l.tp()), absl::StrCat("divisors of ", dense_ffn));
    }
    // s1's token split, as cross_checks.cc checks the job's own tp (micro_batch is kept).
    const uint64_t tokens = uint64_t{p.micro_batch()} * m.seq_len();
    if (spec.moe().schedule() == "s1" && l.tp() > 1 && tokens % l.tp() != 0) {
      fail("tp",
           absl::StrCat("moe.schedule s1 splits a micro-batch's tokens over tp, but "
                        "parallel.micro_batch * model.seq_len = ",
                        p.micro_batch(), " * ", m.seq_len(), " = ", tokens,
                        " does not divide by it"),
           absl::StrCat(l.tp()), absl::StrCat("divisors of ", tokens));
    }
    if (l.pp() > m.layers()) {
      fail("pp", absl::StrCat("must be <= model.layers (= ", m.layers(), ")"), absl::StrCat(l.pp()),
           absl::StrCat("1..", m.layers()));
    }
    const uint64_t kept = uint64_t{p.micro_batches()} * p.dp();
    if (kept % l.dp() != 0) {
      fail("dp",
           absl::StrCat(
               "keeping the global batch (micro_batch * micro_batches * dp = ", p.micro_batch(),
               " * ", p.micro_batches(), " * ", p.dp(),
               ") needs parallel.micro_batches * parallel.dp (= ", kept, ") to divide by this dp"),
           absl::StrCat(l.dp()), absl::StrCat("divisors of ", kept));
    }
  }
}

}  // namespace furnace::spec
