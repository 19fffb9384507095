// Checks that relate two or more fields of an otherwise resolved spec: parallel sizes against each
// other and against the model, bounds that depend on another field (top_k <= experts, warmup <=
// steps), and fields required only in some configurations. A check is skipped when one of its
// fields already failed on its own, so one mistake yields one message. Each problem is reported at
// the first of its fields that is present in the file.
#pragma once

#include "controller/spec/diagnostics.h"
#include "furnace/v1/job.pb.h"

namespace furnace::spec {

void CheckCrossFields(const furnace::v1::JobSpec& spec, Diagnostics* diag);

// recovery.shrink (shrink_checks.cc): each layout smaller than the one before it, valid for the
// model, and keeping the global batch with a whole number of micro-batches. Run by
// CheckCrossFields.
void CheckShrinkLayouts(const furnace::v1::JobSpec& spec, Diagnostics* diag);

}  // namespace furnace::spec
