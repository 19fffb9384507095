// The job schema, one function per top-level section: each reads its section through a MapReader,
// validates every single field, and writes the resolved section (every default filled) into the
// proto. Checks that involve more than one field live in cross_checks.h, which runs afterwards.
#pragma once

#include "controller/spec/yaml_reader.h"
#include "furnace/v1/job.pb.h"

namespace furnace::spec {

// sections_model.cc
void ReadModel(MapReader& section, furnace::v1::ModelSpec* out);
void ReadParallel(MapReader& section, furnace::v1::ParallelSpec* out);
void ReadMoe(MapReader& section, furnace::v1::MoeSpec* out);
void ReadMemory(MapReader& section, furnace::v1::MemorySpec* out);

// sections_run.cc
void ReadTrain(MapReader& section, furnace::v1::TrainSpec* out);
void ReadData(MapReader& section, furnace::v1::DataSpec* out);
void ReadCheckpoint(MapReader& section, furnace::v1::CheckpointSpec* out);
// `batches` is left 0 when absent (eval off); eval.every > 0 needs it (a cross-field check).
void ReadEval(MapReader& section, furnace::v1::EvalSpec* out);
void ReadRecovery(MapReader& section, furnace::v1::RecoverySpec* out);
// Fills the sizes each recovery.shrink layout left out with the job's own (parallel.*).
void ResolveShrink(const furnace::v1::ParallelSpec& parallel, furnace::v1::RecoverySpec* out);
// `workers` is left 0 when absent; the caller fills pp * dp * tp.
void ReadResources(MapReader& section, furnace::v1::ResourcesSpec* out);
void ReadCommcheck(MapReader& section, furnace::v1::CommcheckSpec* out);
void ReadFault(MapReader& section, furnace::v1::FaultSpec* out);

}  // namespace furnace::spec
