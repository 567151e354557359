// bench/pipeline_step: the measured pipeline bubble against the textbook
// (p - 1) / (m + p - 1), and the step time against no pipeline.
//
// The model is a stack of identical Linear(W, W) + ReLU blocks cut into p
// equal stages on repeated CPU devices, one compute thread per stage (so p
// stages need p cores); with --schedule interleaved into p * V equal pieces,
// V per stage (--virtual-stages, default 2). Each micro-batch has --rows rows, so a batch of m
// micro-batches has m * rows rows and every action takes the same time
// whatever m is, and the input requires grad, so the first stage's backward
// does what every other stage's does (the gradient of its input): the
// conditions under which the textbook bubble holds. Per
// m, the program times --steps steps (after --warmup) of the pipeline, then
// as many of the unsplit model on the same batch in one thread, and
// prints one JSON line: the median over steps of the mean idle share of the
// stages (1 - busy / step time), the textbook share, their ratio, the least
// and the most idle stage's own share against the textbook, the step
// times, the speed-up against the ideal p (1 - textbook share), and over_replay:
// how much longer the step took than the schedule replayed with its own
// measured action times and instant hand-offs (replayed_seconds), and
// over_textbook: how much longer it took than the textbook step time for
// its stages' mean busy time, busy / (1 - textbook share); and per stage
// its median forward and backward action (stage_forward_ms,
// stage_backward_ms) beside one piece's forward + backward of a micro-batch
// alone (alone_forward_backward_ms), to tell unequal or slowed stages (the
// machine) from the schedule. The textbook
// share is the schedule's simulate() with a backward twice as long as a
// forward (as in these blocks): (p - 1) / (m + p - 1) for GPipe and 1F1B,
// (p - 1) / (V m + p - 1) for interleaved 1F1B when p divides m, and
// between the two otherwise. (The idle share is a small difference of
// large times: at m = 8 a step 5% over the textbook time has an idle
// share 1.4 times the textbook's.)
//
// With --hold-us US each block also holds its thread for US microseconds
// per --rows rows in forward and twice that in backward, and the Linear
// layers are meant to be tiny (--width 16): stages of equal cost that do not
// slow each other down, as compute on cores that share a machine does (Note
// [held stages]). What is left above the textbook is then the schedule, the
// executor (hand-offs, thread wake-ups) and the last stage's loss; p may
// exceed the cores. --spin-us sets PipelineOptions::spin.
//
//   pipeline_step --stages 2 --micro-batches 1,2,4,8 --schedule 1f1b
//   pipeline_step --stages 4 --hold-us 1000 --width 16 --schedule gpipe
#include <algorithm>
#include <cstdio>
#include <map>
#include <tuple>
#include <vector>

#include <sys/prctl.h>

#include <chrono>
#include <thread>

#include <ATen/Parallel.h>
#include <torch/torch.h>

#include "bench_main.h"
#include "tandem/util/cuda_module.h"
#include "tandem/cli/flags.h"
#include "tandem/parallel/pipeline.h"
#include "tandem/util/allocator.h"
#include "tandem/util/check.h"
#include "tandem/util/parse.h"
#include "tandem/util/stats.h"
#include "tandem/util/stopwatch.h"
#include "tandem/util/table.h"

using namespace tandem;

namespace {

// Note [held stages]: on a machine whose cores share resources (this
// project's 2-core VM: two single-thread 64 x 512 x 512 products at once
// each run 10 to 30% slower than one alone, and a core that has idled runs
// slower for a while), stages that compute at once slow each other by
// different amounts, and the faster stage idles waiting for the slower one
// on top of the textbook bubble. A held stage waits a fixed time instead,
// so its actions last the same whatever runs beside it, and the executor is
// measured alone. It sleeps to just before its end and polls the clock
// after, so that a late wake-up does not lengthen it.
void hold(int64_t us) {
  thread_local bool precise = prctl(PR_SET_TIMERSLACK, 1UL, 0, 0, 0) == 0;
  (void)precise;
  using Clock = std::chrono::steady_clock;
  const auto until = Clock::now() + std::chrono::microseconds(us);
  // Asleep to within kWake of the end, a wake-up's usual lateness on a VM,
  // then yielding polls: the lateness would otherwise vary the stages.
  constexpr auto kWake = std::chrono::microseconds(300);
  if (until - Clock::now() > kWake) std::this_thread::sleep_until(until - kWake);
  while (Clock::now() < until) std::this_thread::yield();
}

// Holds for `us` per `rows` rows of its input in forward, twice that in
// backward, so that a batch costs what its micro-batches cost together.
struct HoldFunction : torch::autograd::Function<HoldFunction> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, torch::Tensor x, int64_t us,
                               int64_t rows) {
    const int64_t held = us * x.size(0) / rows;
    ctx->saved_data["held"] = held;
    hold(held);
    return x.clone();
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    hold(2 * ctx->saved_data["held"].toInt());
    return {grads[0], torch::Tensor(), torch::Tensor()};
  }
};

class HoldImpl : public torch::nn::Cloneable<HoldImpl> {
 public:
  HoldImpl(int64_t us, int64_t rows) : us_(us), rows_(rows) {}
  void reset() override {}
  torch::Tensor forward(const torch::Tensor& x) { return HoldFunction::apply(x, us_, rows_); }

 private:
  int64_t us_, rows_;
};
TORCH_MODULE(Hold);

// The makespan the schedule would have with the step's measured action
// durations and instant hand-offs: each action starts when its stage is
// free and its input is there (F(i) after F(i) on the piece before, B(i)
// after B(i) on the piece after; chunk c of stage s is piece c * p + s).
// Measured / replayed - 1 is what the executor and the machine add (thread
// wake-ups, copies, other load).
double replayed_seconds(const parallel::PipelineStep& step, int64_t chunks) {
  const auto stages = static_cast<int64_t>(step.stages.size());
  const int64_t pieces = stages * chunks;
  std::vector<size_t> next(stages, 0);
  std::vector<double> free_at(stages, 0.0);
  std::map<std::tuple<int64_t, int, int64_t>, double> done;  // (piece, 0 F / 1 B, micro-batch)
  bool progress = true;
  while (progress) {
    progress = false;
    for (int64_t s = 0; s < stages; ++s) {
      const auto& t = step.stages[s];
      while (next[s] < t.actions.size()) {
        const auto& a = t.actions[next[s]];
        const int64_t piece = a.chunk * stages + s;
        double ready = free_at[s];
        bool forward = a.op == parallel::PipelineOp::kForward;
        if (forward && piece > 0) {
          auto it = done.find({piece - 1, 0, a.micro_batch});
          if (it == done.end()) break;
          ready = std::max(ready, it->second);
        } else if (!forward && piece + 1 < pieces) {
          auto it = done.find({piece + 1, 1, a.micro_batch});
          if (it == done.end()) break;
          ready = std::max(ready, it->second);
        }
        free_at[s] = ready + (t.end[next[s]] - t.start[next[s]]);
        done[{piece, forward ? 0 : 1, a.micro_batch}] = free_at[s];
        ++next[s];
        progress = true;
      }
    }
  }
  return *std::max_element(free_at.begin(), free_at.end());
}

}  // namespace

int main(int argc, char** argv) {
  tune_malloc_for_training();  // as the tandem binary does
  tandem::cuda::load_when_present();  // Note [CUDA as a module]
  std::string schedule = "1f1b", counts = "1,2,4,8";
  bool trace = false;
  int64_t stages = 2, blocks = 8, width = 512, rows = 64, steps = 15, warmup = 3, hold_us = 0,
          spin_us = parallel::PipelineOptions{}.spin.count(), virtual_stages = 0;
  cli::FlagSet flags("pipeline_step", "Measured pipeline bubble against (p-1)/(m+p-1).");
  flags.add_choice("schedule", &schedule, {"gpipe", "1f1b", "interleaved"}, "pipeline schedule");
  flags.add_int("stages", "P", &stages, "stages (one compute thread each)", 1);
  flags.add_int("virtual-stages", "V", &virtual_stages,
                "--schedule interleaved: chunks per stage (default 2)", 1);
  flags.add_string("micro-batches", "LIST", &counts, "micro-batch counts m to measure");
  flags.add_int("blocks", "N", &blocks, "Linear + ReLU blocks (a multiple of --stages x chunks)", 1);
  flags.add_int("width", "W", &width, "features of each Linear", 1);
  flags.add_int("rows", "N", &rows, "rows per micro-batch", 1);
  flags.add_int("steps", "N", &steps, "timed steps per m", 1);
  flags.add_int("warmup", "N", &warmup, "untimed steps first", 0);
  flags.add_int("hold-us", "US", &hold_us,
                "each block also holds US us per --rows rows in forward, twice in backward (0: no)", 0);
  flags.add_int("spin-us", "US", &spin_us, "how long a waiting stage polls before it sleeps", 0);
  flags.add_switch("trace", &trace, "print every stage's actions (start-end ms) of the last step");
  return bench::run("pipeline_step", flags, argc, argv, [&] {
    const int64_t chunks = virtual_stages > 0 ? virtual_stages : schedule == "interleaved" ? 2 : 1;
    const int64_t pieces = stages * chunks;
    TANDEM_CHECK(blocks % pieces == 0, "--blocks ", blocks, " is not a multiple of --stages ", stages,
                 " x ", chunks, " chunk(s)");
    at::set_num_threads(1);  // each stage computes on its own thread alone
    torch::manual_seed(0);
    models::Sequence model;
    for (int64_t b = 0; b < blocks; ++b) {
      model->push_back("fc" + std::to_string(b), torch::nn::Linear(width, width));
      model->push_back("relu" + std::to_string(b), torch::nn::ReLU());
      if (hold_us > 0) model->push_back("hold" + std::to_string(b), Hold(hold_us, rows));
    }
    std::vector<int64_t> sizes(pieces, (hold_us > 0 ? 3 : 2) * blocks / pieces);
    auto loss = [](const torch::Tensor& out, const torch::Tensor& target) {
      return torch::nn::functional::cross_entropy(out, target);
    };
    for (const auto& text : split(counts, ',')) {
      auto m = parse_int(text);
      TANDEM_CHECK(m && *m >= 1, "--micro-batches: expected positive integers, got '", counts, "'");
      parallel::PipelineOptions options{*m, schedule};
      options.spin = std::chrono::microseconds(spin_us);
      options.virtual_stages = chunks;
      // The textbook idle share: the schedule simulated with backwards twice
      // as long as forwards (the mean over stages).
      const double textbook =
          parallel::simulate(parallel::make_pipeline_schedule(schedule, stages, *m, chunks), 1.0, 2.0)
              .mean_idle_share();
      parallel::Pipeline pipe(model, sizes, std::vector<torch::Device>(stages, torch::kCPU), options);
      // The input requires grad so that stage 0's backward, like every other
      // stage's, also computes the gradient of its input: equal stages.
      auto x = torch::randn({*m * rows, width}).requires_grad_(true);
      auto y = torch::randint(width, {*m * rows}, torch::kInt64);
      std::vector<double> idle, pipe_ms, plain_ms, added, over_textbook;
      std::vector<std::vector<double>> stage_idle(stages), stage_forward(stages), stage_backward(stages);
      for (int64_t i = 0; i < warmup + steps; ++i) {
        model->zero_grad();
        auto step = pipe.train_step(x, y, loss);
        if (trace && i + 1 == warmup + steps) {
          for (size_t s = 0; s < step.stages.size(); ++s) {
            const auto& t = step.stages[s];
            std::printf("m=%lld stage %zu:", static_cast<long long>(*m), s);
            for (size_t k = 0; k < t.actions.size(); ++k) {
              std::printf(" %s %.2f-%.2f", parallel::describe({t.actions[k]}).c_str(), 1e3 * t.start[k],
                          1e3 * t.end[k]);
            }
            std::printf("  (step %.1f ms)\n", 1e3 * step.seconds);
          }
        }
        if (i < warmup) continue;
        double sum = 0;
        auto shares = step.idle_share();
        for (size_t k = 0; k < shares.size(); ++k) {
          sum += shares[k];
          stage_idle[k].push_back(shares[k]);
        }
        idle.push_back(sum / static_cast<double>(stages));
        // Each stage's mean forward and backward action, in ms.
        for (size_t k = 0; k < step.stages.size(); ++k) {
          const auto& t = step.stages[k];
          double f = 0, b = 0;
          int64_t nf = 0, nb = 0;
          for (size_t a = 0; a < t.actions.size(); ++a) {
            const bool forward = t.actions[a].op == parallel::PipelineOp::kForward;
            (forward ? f : b) += 1e3 * (t.end[a] - t.start[a]);
            ++(forward ? nf : nb);
          }
          stage_forward[k].push_back(nf > 0 ? f / static_cast<double>(nf) : 0.0);
          stage_backward[k].push_back(nb > 0 ? b / static_cast<double>(nb) : 0.0);
        }
        pipe_ms.push_back(1e3 * step.seconds);
        added.push_back(step.seconds / replayed_seconds(step, chunks) - 1);
        // The step time the textbook predicts from this step's mean busy time
        // per stage: busy / (1 - textbook share).
        double busy = 0;
        for (const auto& t : step.stages) busy += t.busy();
        busy /= static_cast<double>(stages);
        over_textbook.push_back(step.seconds / (busy / (1 - textbook)) - 1);
      }
      // The unsplit model after the pipeline's steps, not between them: a
      // step of it leaves the stage threads' cores idle for as long as a
      // step, and on the project's VM a core that has idled runs its next
      // work slower (Note [held stages]).
      for (int64_t i = 0; i < warmup + steps; ++i) {
        model->zero_grad();
        x.mutable_grad() = torch::Tensor();
        Stopwatch clock;
        loss(model->forward(x), y).backward();
        if (i >= warmup) plain_ms.push_back(1e3 * clock.seconds());
      }
      // One micro-batch through the unsplit model, alone on the machine: what
      // a piece's forward + backward costs with nothing beside it.
      std::vector<double> alone_ms;
      auto x1 = x.narrow(0, 0, rows).detach().requires_grad_(true);
      auto y1 = y.narrow(0, 0, rows);
      for (int64_t i = 0; i < warmup + steps; ++i) {
        model->zero_grad();
        Stopwatch clock;
        loss(model->forward(x1), y1).backward();
        if (i >= warmup) alone_ms.push_back(1e3 * clock.seconds() / static_cast<double>(pieces));
      }
      double p = static_cast<double>(stages), mm = static_cast<double>(*m);
      double measured = median(idle);
      double speedup = median(plain_ms) / median(pipe_ms);
      // Each stage's own idle share (median over steps) against the
      // textbook: the least idle stage is the one that sets the pace.
      double least = 1, most = 0;
      for (auto& shares : stage_idle) {
        least = std::min(least, median(shares));
        most = std::max(most, median(shares));
      }
      // Per stage, the median over steps of its mean forward and backward
      // action (ms), and what one piece's forward + backward of one
      // micro-batch costs alone (above): where the stages' actions run longer
      // than that, or unequally, the machine slowed them, not the schedule.
      auto per_stage = [](std::vector<std::vector<double>>& values) {
        std::string list;
        for (auto& v : values) list += (list.empty() ? "" : ", ") + format("%.3f", median(v));
        return "[" + list + "]";
      };
      std::printf("{\"schedule\": \"%s\", \"stages\": %lld, \"chunks\": %lld, \"m\": %lld, \"idle_share\": %.4f, "
                  "\"textbook\": %.4f, \"ratio\": %.3f, \"least_idle_ratio\": %.3f, "
                  "\"most_idle_ratio\": %.3f, \"step_ms\": %.2f, \"no_pipeline_ms\": %.2f, "
                  "\"speedup\": %.3f, \"ideal_speedup\": %.3f, \"over_replay\": %.3f, \"over_textbook\": %.3f, "
                  "\"stage_forward_ms\": %s, \"stage_backward_ms\": %s, \"alone_forward_backward_ms\": %.3f}\n",
                  schedule.c_str(), static_cast<long long>(stages), static_cast<long long>(chunks),
                  static_cast<long long>(*m),
                  measured, textbook, textbook > 0 ? measured / textbook : 0.0,
                  textbook > 0 ? least / textbook : 0.0, textbook > 0 ? most / textbook : 0.0,
                  median(pipe_ms), median(plain_ms), speedup, p * (1 - textbook), median(added),
                  median(over_textbook), per_stage(stage_forward).c_str(), per_stage(stage_backward).c_str(),
                  median(alone_ms));
      std::fflush(stdout);
    }
  });
}
