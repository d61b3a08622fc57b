#include "train/pipeline_split.h"

#include "core/error.h"
#include "core/log.h"
#include "planner/pipeline_plan.h"
#include "planner/stage_partition.h"
#include "schedule/pipeline.h"

#include <fmt/format.h>

#include <string>
#include <vector>

namespace oases::train {

plan::RunConfig split_pipeline_automatically(const plan::RunConfig& config, const ProfileOptions& options,
                                       const std::function<comm::Mesh(int tp)>& make_mesh,
                                       int chunks) {
  const plan::RunPlan run = plan::make_run_plan(config);
  OASES_ASSERT(run.settings.pipeline_layers == plan::PipelineLayersSource::automatic,
               "split_pipeline_automatically for parallel.pipeline_layers = \"{}\"",
               config.parallel.pipeline_layers);
  const auto P = static_cast<int>(config.parallel.pp);
  OASES_ASSERT(P >= 1 && chunks % P == 0, "{} chunks over {} stages", chunks, P);
  plan::RunConfig split = config;
  if (chunks == 1) {
    split.parallel.pipeline_layers = "uniform";  // one chunk holds every layer
    return split;
  }
  // The profile measures one tensor-parallel group of the run's within-stage settings.
  plan::RunConfig measured = config;
  measured.parallel.dp = 1;
  measured.parallel.pp = 1;
  measured.parallel.pipeline_layers = "uniform";
  if (options.progress)
    log_info("parallel.pipeline_layers = \"auto\": profiling the layers at tensor-parallel "
             "degree {}",
             config.parallel.tp);
  const planner::Profile profile =
      run_profile(measured, options, [&](int tp, int) { return make_mesh(tp); });
  const schedule::ScheduleSpec& within_stage = run.schedule;
  schedule::PipelineSpec pipeline;
  pipeline.kind = run.pipeline.kind;
  pipeline.stages = P;
  pipeline.virtual_stages = chunks / P;
  pipeline.micro_batches = within_stage.micro_batches;
  comm::Mesh mesh = make_mesh(static_cast<int>(config.parallel.tp));
  comm::Communicator& world = mesh.world();
  // Rank 0 splits from its profile; the ranks' profiles differ by noise, and every rank must
  // build the same stages.
  std::vector<std::int32_t> counts(static_cast<std::size_t>(chunks), 0);
  std::string error;
  if (world.rank() == 0) {
    try {
      const std::vector<int> split_counts = planner::auto_pipeline_layers(
          profile, within_stage, pipeline, config.train.micro_batch, config.parallel.memory_limit);
      std::copy(split_counts.begin(), split_counts.end(), counts.begin());
      if (options.progress) {
        const planner::StageCosts costs = planner::pipeline_stage_costs(
            profile, within_stage, config.train.micro_batch, 1, 0);
        std::string chunk_costs;
        int begin = 0;
        for (int c = 0; c < chunks; ++c) {
          const int end = begin + split_counts[static_cast<std::size_t>(c)];
          chunk_costs += fmt::format("{}{:.2f}", c ? " " : "",
                                     1e3 * planner::chunk_seconds(costs, c, chunks, begin, end));
          begin = end;
        }
        log_info("parallel.pipeline_layers = \"auto\": layers per chunk {} (predicted ms per "
                 "micro-batch of each chunk: {})",
                 planner::format_pipeline_layers(split_counts), chunk_costs);
      }
    } catch (const UserError& e) {
      error = e.what();
    }
  }
  world.broadcast(Tensor::of(counts.data(), {static_cast<std::int64_t>(counts.size())}), 0);
  OASES_CHECK(counts.front() > 0, "parallel.pipeline_layers = \"auto\": {}",
              world.rank() == 0 ? error : std::string("no split fits (see rank 0)"));
  split.parallel.pipeline_layers =
      planner::format_pipeline_layers(std::vector<int>(counts.begin(), counts.end()));
  return split;
}

}  // namespace oases::train
