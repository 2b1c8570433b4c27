// Dynamic batching, Triton-style: requests' sequences wait in one queue; one
// batcher thread asks the planner (planner.h) what to run or how long to
// wait, builds the next batch's tensors while the model runs the current one
// on a worker thread (one batch ahead), and answers each request once all of
// its sequences are scored.
//
// Threads and locking: everything shared lives under `mu_`, held only for
// queue/slot bookkeeping, never across planning's sort, packing, the model
// run or a completion callback. Only the batcher thread removes sequences
// from the queue, so ids taken from a snapshot stay valid after relocking.
#pragma once

#include <grpcpp/support/status.h>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "metrics.h"
#include "planner.h"
#include "validation.h"

namespace rmscore {

using Clock = std::chrono::steady_clock;

struct JobResult {
  grpc::Status status;
  std::vector<float> scores;  // one per sequence, in request order, when status is OK
  double total_ms = 0;
  double inference_ms = 0;
};

// One accepted unit of work: a Score call or one ScoreStream item. The views
// point into a request message that `keepalive` (or the caller) keeps alive
// until `done` has run.
class Job {
 public:
  using Done = std::function<void(JobResult&&)>;
  Job(std::vector<SeqView> seqs, std::optional<Clock::time_point> deadline, std::shared_ptr<const void> keepalive,
      Done done);

 private:
  friend class Batcher;
  const std::vector<SeqView> seqs_;
  const std::optional<Clock::time_point> deadline_;
  const std::shared_ptr<const void> keepalive_;
  const Done done_;  // runs exactly once, on a batcher thread; must not block
  Clock::time_point accepted_;
  // Guarded by Batcher::mu_.
  std::vector<float> scores_;
  size_t remaining_ = 0;        // sequences not yet scored or dropped
  grpc::Status error_;          // first failure; the job fails once remaining_ hits 0
  bool cancelled_ = false;
  uint64_t last_batch_ = 0;     // so a batch's time counts once per job
  double inference_ms_ = 0;
};

// Scores one packed batch (batch.batch floats) or throws; the batcher calls
// it from its worker thread only. The server passes ModelRunner::Run.
using BatchModel = std::function<std::vector<float>(const PackedBatch&)>;

class Batcher {
 public:
  struct Options {
    PlannerConfig planner;
    int64_t max_queue_sequences = 4096;
    int64_t pad_token_id = 0;
  };
  // `abort` (optional) makes a model run in progress fail; Stop uses it.
  Batcher(const Options& opts, BatchModel model, Metrics* metrics, std::function<void()> abort = nullptr);
  ~Batcher();

  // Accepts the job (then its done callback runs exactly once, later) or
  // refuses it at once: RESOURCE_EXHAUSTED when the queue is full,
  // UNAVAILABLE while draining (done never runs then).
  grpc::Status Submit(const std::shared_ptr<Job>& job);
  // The caller gave up (client cancelled): its queued sequences are dropped.
  void Cancel(const std::shared_ptr<Job>& job);
  // Refuses new jobs from now on; waits until every accepted job is finished
  // or `deadline` passes. True when drained.
  bool Drain(Clock::time_point deadline);
  // Stops both threads: aborts the model run in progress (its requests fail
  // INTERNAL); jobs still queued or built fail with UNAVAILABLE.
  void Stop();

 private:
  struct Queued {
    uint64_t id;
    std::shared_ptr<Job> job;
    size_t index;  // position in the job's sequences
    int64_t arrival_us;
  };
  struct Batch {
    uint64_t number = 0;
    std::vector<Queued> seqs;
    PackedBatch packed;
  };
  using Finished = std::vector<std::shared_ptr<Job>>;

  void BatcherLoop();
  void WorkerLoop();
  // Precondition for the *Locked helpers: mu_ held.
  void DropLocked(const std::vector<uint64_t>& ids, const grpc::Status& why, const char* reason, Finished* finished);
  void DropAbandonedLocked(Finished* finished);
  std::vector<Queued> TakeLocked(const std::vector<uint64_t>& ids);
  void SequenceDoneLocked(Queued& q, Finished* finished);
  void RunBatch(Batch& b);
  // Without mu_: runs callbacks, then counts the jobs as finished.
  void Finish(Finished& finished);
  int64_t NowUs() const;

  const Options opts_;
  const BatchModel model_;
  const std::function<void()> abort_;
  Metrics* const metrics_;
  const Clock::time_point epoch_ = Clock::now();

  std::mutex mu_;
  std::condition_variable batcher_cv_;  // queue grew, slot emptied, a job was abandoned, stop
  std::condition_variable worker_cv_;   // slot filled, stop
  std::condition_variable idle_cv_;     // active_jobs_ reached 0
  std::deque<Queued> queue_;            // arrival order
  std::optional<Batch> ready_;          // built ahead, waiting for the worker
  bool worker_busy_ = false;            // the worker is running a batch
  uint64_t next_seq_id_ = 1, next_batch_ = 1;
  size_t active_jobs_ = 0;              // accepted, done not yet run
  bool abandoned_ = false;              // some queued job was cancelled or failed
  bool accepting_ = true, stopping_ = false;

  std::thread batcher_thread_, worker_thread_;
};

}  // namespace rmscore
