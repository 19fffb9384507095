// The controller's Prometheus metrics: one MetricsSnapshot rendered as a text exposition.
//
// Naming follows https://prometheus.io/docs/practices/naming: one `furnace_` prefix, base units
// spelled out as the suffix (`_seconds`, `_bytes`, `_ratio` for 0..1 fractions), accumulating
// counts as counters ending in `_total`, and `furnace_build_info{version}` = 1 for metadata. Two
// names bend the rules on purpose: `furnace_job_tokens_per_second` is a rate the trainer measures
// per step (not derivable with rate() from a 5 s scrape of a faster step), and
// `furnace_moe_routing_imbalance_ratio` is max/mean tokens per expert, so 1 is perfect balance
// and it is bounded by the expert count, not by 1.
//
// Labels are bounded enums or small indexes: job (the job id), layer, expert, action, op, cause,
// state. No rank, worker or host label: per-rank detail stays in logs. `job` is the *furnace*
// job; a Prometheus scrape config must set `honor_labels: true` so it is not renamed to
// `exported_job` (deploy/prometheus/prometheus.yml does). furnace_moe_expert_tokens has
// layers x experts series per job: fine for the models here, worth dropping at hundreds of
// experts.
//
// Which jobs get what: every job gets furnace_job_state (one-hot over the 8 states) and
// furnace_job_restarts_total (the common causes start at 0, so increase() sees the first one);
// only jobs with an aggregated training step get the step, throughput, loss, MoE and memory
// series, and the goodput series (ratio, productive and lost seconds by cause, redone steps,
// MTBF; the auto checkpoint interval where checkpoint.every is auto);
// furnace_memory_budget_bytes only where a budget is set; checkpoint and recovery durations once
// there has been one.
//
// The families are prometheus-cpp values (prometheus::MetricFamily) built from the snapshot at
// each scrape, and prometheus-cpp's TextSerializer writes the text format (version 0.0.4), so the
// escaping and number formatting are the library's. No prometheus::Registry: its families order
// a sample's labels by name and the samples by label value (layer "10" before "2") and its
// counters only count up, while the snapshot already holds every value; families built per scrape
// need no locking (both functions are pure and safe to call from any thread).
#pragma once

#include <string>
#include <vector>

#include "controller/service/metrics_snapshot.h"
#include "prometheus/metric_family.h"

namespace furnace::controller::metrics {

extern const char kFurnaceVersion[];

// Pure: the same snapshot always gives the same families. Families in a fixed order, jobs in the
// snapshot's order, map-keyed labels in key order. A family with no sample is left out (as a
// prometheus-cpp Registry leaves it out), so a metric that does not apply (no job is training) is
// absent rather than an empty header.
std::vector<prometheus::MetricFamily> CollectMetrics(const MetricsSnapshot& snapshot);

// CollectMetrics serialized by prometheus::TextSerializer.
std::string RenderMetrics(const MetricsSnapshot& snapshot);

}  // namespace furnace::controller::metrics
