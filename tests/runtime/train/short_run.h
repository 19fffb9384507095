// Test helper: a short training run of a small MoE (MODEL.md, every layer MoE, top-2, a capacity,
// routing spikes) on a given device at a given precision, through GptMoe and the Trainer on that
// device, returning each step's loss and aux loss. The tolerance tests compare such runs with the
// fp32 CPU oracle.
#pragma once

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/blas.h"
#include "runtime/base/status.h"
#include "runtime/data/markov.h"
#include "runtime/data/sampler.h"
#include "runtime/device/backend.h"
#include "runtime/device/current_stream.h"
#include "runtime/model/gpt_moe.h"
#include "runtime/tensor/arena.h"
#include "runtime/train/trainer.h"

namespace furnace::train::testing {

struct ShortRun {
  std::vector<double> loss, aux;
  std::vector<float> params;  // after the last step
  std::string backend;        // the model's table ("emulated/bf16", ...)
};

inline model::ModelConfig ShortRunModel() {
  model::ModelConfig c;
  c.vocab = 64;
  c.seq_len = 16;
  c.d_model = 32;
  c.heads = 4;
  c.layers = 2;
  c.moe_every = 1;
  c.experts = 4;
  c.top_k = 2;
  c.expert_ffn = 64;
  c.capacity_factor = 1.25;
  c.spikes = {.probability = 0.3, .max_ratio = 2.0, .seed = 2};
  return c;
}

// `steps` steps of 2 micro-batches of 4 sequences on a Markov chain, lr 3e-3 with 2 warmup steps.
// weight_mirror false: the model's bf16 weight mirror is switched off (GEMMs round per call).
// recompute_probs: model.attention_probs recomputed (the RowStats attention pair).
inline absl::StatusOr<ShortRun> RunShort(device::Device& device, device::Precision precision,
                                         int steps, bool weight_mirror = true,
                                         bool recompute_probs = false) {
  kernels::cpu::SetBlasThreads(1);
  ASSIGN_OR_RETURN(std::unique_ptr<device::Stream> stream, device.CreateStream());
  device::StreamScope scope(*stream);
  tensor::DeviceArena arena(device, 0);
  model::ModelConfig config = ShortRunModel();
  config.recompute_attention_probs = recompute_probs;
  ASSIGN_OR_RETURN(std::unique_ptr<model::GptMoe> model,
                   model::GptMoe::Create(config, 7, device, arena, {}, {}, precision));
  if (!weight_mirror) model->DisableWeightMirrorForTest();
  data::MarkovConfig mc;
  mc.vocab = 64;
  mc.seed = 4;
  ASSIGN_OR_RETURN(data::MarkovChain chain, data::MarkovChain::Create(mc));
  data::SamplerConfig sc;
  sc.batch = 4;
  sc.seq_len = 16;
  sc.seed = 9;
  ASSIGN_OR_RETURN(std::unique_ptr<data::Sampler> sampler, data::MakeMarkovSampler(chain, sc));
  TrainConfig tc;
  tc.steps = steps;
  tc.micro_batches = 2;
  tc.seed = 9;
  tc.schedule.lr = 3e-3;
  tc.schedule.warmup_steps = 2;
  tc.schedule.max_steps = steps;
  ASSIGN_OR_RETURN(std::unique_ptr<Trainer> trainer,
                   Trainer::Create(model.get(), sampler.get(), tc));
  ShortRun run;
  run.backend = model->backend().name;
  for (int s = 0; s < steps; ++s) {
    ASSIGN_OR_RETURN(const StepStats stats, trainer->Step());
    run.loss.push_back(stats.loss);
    run.aux.push_back(stats.aux_loss);
  }
  run.params.resize(static_cast<size_t>(model->num_params()));
  RETURN_IF_ERROR(device.Copy(run.params.data(), model->param_data(), run.params.size() * 4,
                              device::HostAddressable(device) ? device::CopyKind::kHostToHost
                                                              : device::CopyKind::kDeviceToHost,
                              *stream));
  RETURN_IF_ERROR(device.SynchronizeStream(*stream));
  return run;
}

}  // namespace furnace::train::testing
