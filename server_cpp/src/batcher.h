// Dynamic batching, Triton-style: the sequences of accepted requests wait in
// one queue; a batcher thread asks the planner (planner.h) what to run or
// how long to wait, then runs that batch on the model itself, and each
// request is answered once all of its sequences are scored, or at once when
// it fails. With several model workers (--model-workers) there is one batcher
// thread per worker, all running the same loop: whichever is idle plans the
// next batch. With a `lone` model (--model-workers elastic, the default) a
// batch that starts while no other runs and none waits runs on it instead: a
// session with every intra-op thread, so a batch alone gets them all and
// batches at once get one each (main.cc, ElasticSessions). server_py/rmscore/core/batcher.py
// is this file in Python, with the same names and the same steps
// (docs/batching.md, "Structure").
//
// Fair order (issue 29, defect 4): the queue is ordered by callers' turns, not
// by arrival. Each sequence's turn starts where its caller's previous one ended
// (the caller's own work so far, in real tokens), or at the head when that is
// later, and ends its length later. The sequence ranks by where its turn ends
// (its virtual finish, as in weighted fair queueing; ties by arrival): a caller
// whose work has all been taken starts at the head, and its sequence runs before
// every sequence that ends later. The head is the queue's virtual time, which
// follows fair queueing's (GPS): at least the start of the running batch's
// first turn, and moved on, when a batch ends, by its real tokens over the
// callers sharing then (those whose turns end past the head: GPS's backlogged
// ones; at least one token, at most to the end of that first turn). So serving
// turns moves the head, and new callers pass a long sequence for a bounded time
// (until the afternoon of 2026-12-06 it held the head at its start and they
// passed it for as long as they came: batcher.py says more). Ranking by the start
// (start-time fair queueing, until 2026-12-06) put a 16-token probe behind every
// 512-token first item tied with it at the head (batcher.py says more). The
// planner builds every batch around the lowest rank
// (planner.h QueueIndex), so callers with work queued take turns, a token of work
// each, and a new caller's first sequence runs in the next batch or two whatever
// the others hold: a request larger than the work bound is fed to the model in
// its caller's turns, behind other callers' sequences. With one caller the order
// is arrival order. Admission computes the same turns (admission.h
// QueueIndex::TokensThrough). A caller is a connection (the call's peer).
//
// Locking: everything shared lives under `mu_`. It is held to admit, plan,
// take and pack a batch, and to mark requests finished; never across the
// model run or an answer's callback. Any thread holding it may remove
// sequences from the queue (Cancel on a gRPC thread, Stop on the main one).
#pragma once

#include <grpcpp/support/status.h>

#include <chrono>
#include <condition_variable>
#include <ctime>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <thread>
#include <vector>

#include "admission.h"
#include "cost.h"
#include "liveness.h"
#include "metrics.h"
#include "planner.h"
#include "validation.h"

namespace rmscore {

using Clock = std::chrono::steady_clock;

// The CPU time the calling thread has used, in seconds (CLOCK_THREAD_CPUTIME_ID): what a run working on
// its caller's thread alone cost, whatever other processes took of the core meanwhile (Python's
// time.thread_time).
inline double ThreadCpuSeconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + double(ts.tv_nsec) / 1e9;
}

// A request's answer: its scores, or the status it failed with.
struct Result {
  grpc::Status status;
  std::vector<float> scores;  // one per sequence, in request order, when status is OK
  double total_ms = 0;
  double inference_ms = 0;
};

// One accepted unit of work: a Score call or one ScoreStream item. The views
// point into a request message that `keepalive` (or the caller) keeps alive
// until `done` has run; the batcher reads them only under mu_, while packing.
class Job {
 public:
  using Done = std::function<void(Result&&)>;
  // `caller`: whose turns its sequences take (the call's connection, ctx->peer()).
  Job(std::vector<SeqView> seqs, std::optional<Clock::time_point> deadline, std::shared_ptr<const void> keepalive,
      Done done, std::string caller = "");

 private:
  friend class Batcher;
  const std::vector<SeqView> seqs_;
  const std::optional<Clock::time_point> deadline_;
  const std::shared_ptr<const void> keepalive_;
  const Done done_;  // runs exactly once, never under mu_; must not block
  const std::string caller_;
  // Guarded by Batcher::mu_; set by Submit.
  bool accepted_ = false;
  Clock::time_point accepted_at_;
  std::optional<int64_t> deadline_us_;  // on the batcher's clock (Batcher::NowUs)
  uint64_t first_seq_id_ = 0;           // its sequences have ids first_seq_id_ .. + seqs_.size() - 1
  // Guarded by Batcher::mu_ until finished_; final (read without the lock) after.
  std::vector<float> scores_;
  size_t remaining_ = 0;  // sequences not scored yet
  grpc::Status error_;    // why it failed, when it did
  bool finished_ = false;  // answered, refused, or cancelled before Submit
  double inference_ms_ = 0;
};

// Scores one packed batch (batch.batch floats) or throws; its worker's batcher
// thread calls it. The server passes one ModelRunner::Run per worker.
using BatchModel = std::function<std::vector<float>(const PackedBatch&)>;

class Batcher {
 public:
  struct Options {
    PlannerConfig planner;
    int64_t max_queue_sequences = 4096;
    int64_t pad_token_id = 0;
    // What batches cost here: cost_aware plans with its table, and every successful run refines it.
    // Shared with whoever made it (a test reads it after Stop); guarded by mu_ while the batcher runs.
    std::shared_ptr<CostModel> cost;
    // Admission by work (admission.h): refuse when the queued work exceeds this (0: no bound) or the
    // caller's deadline; the rate starts at the seed (model us per real token, 0: unknown).
    int64_t max_queue_wait_us = 0;
    double seed_us_per_token = 0;
    // Told when work waits and when batches start and end (liveness.h): liveness reads it without mu_,
    // so it answers while a batcher thread is stuck. Shared with the gauge and the liveness watch,
    // which may outlive the batcher. nullptr: not tracked.
    std::shared_ptr<StallClock> progress;
    // After a batch that showed more than one caller's work (another batch running or started beside
    // it, work waiting when it ended, or several requests in it), batches run on the workers' sessions
    // until one ends showing none, or for this long (docs/batching.md, "Threads"). Python's
    // Options.lone_hold_us.
    int64_t lone_hold_us = 1'000'000;
    // Called (without mu_, on a batcher thread) once the batcher has been idle, nothing queued or
    // running, for idle_release_us since a batch ended: the runtime may give back memory grown for
    // large batches (model_runner.h ReleaseMemory). Not at once: a closed-loop client's next request
    // often comes within milliseconds, and its batch would grow the memory again (~4% a batch). What it
    // throws is ignored: serving goes on with the memory kept. Python's Options.on_idle.
    std::function<void()> on_idle;
    int64_t idle_release_us = 1'000'000;
    // Called (without mu_, on a batcher thread) at the same moment as on_idle, and once more by Stop
    // (on its caller's thread), when batches refined the cost table since the last call: the table and
    // how many batches refined it since. The server keeps it for its next start (cost_profile.h, the
    // cache). What it throws is ignored. Python's Options.on_refined.
    std::function<void(const CostTable&, int64_t)> on_refined;
    // Refine the cost table with the CPU time the run took on its batcher thread, not the wall clock:
    // right where a run works on its caller's thread alone (a 1-thread session on a CPU, the workers of
    // --model-workers elastic), where the wall clock counts the time other processes took the core, and
    // those inflated cells, never chosen again, were never corrected (docs/batching.md, "Timed by the
    // run's thread, not the wall clock"). Admission's rate keeps the wall clock: waits are wall time.
    // Python's Options.refine_on_thread_cpu.
    bool refine_on_thread_cpu = false;
  };
  // `models`: one per worker, each run by its own batcher thread. `abort` (optional) makes the model
  // runs in progress fail; Stop uses it. `lone` (optional): the model for a batch that starts while no
  // other batch runs and no sequence is left waiting.
  Batcher(const Options& opts, std::vector<BatchModel> models, Metrics* metrics,
          std::function<void()> abort = nullptr, BatchModel lone = nullptr);
  Batcher(const Options& opts, BatchModel model, Metrics* metrics, std::function<void()> abort = nullptr)
      : Batcher(opts, std::vector<BatchModel>{std::move(model)}, metrics, std::move(abort)) {}
  ~Batcher();

  // Accepts the job (then its done callback runs exactly once, later) or
  // refuses it at once: RESOURCE_EXHAUSTED when the queue is full,
  // UNAVAILABLE while draining (done never runs then).
  grpc::Status Submit(const std::shared_ptr<Job>& job);
  // Why any job with this deadline would be refused by the work ahead now (OK when it would not):
  // the check a call makes before validating, so a refusal under a work flood costs no checking of
  // ids. Submit checks again, with the job's size. Python's Batcher.work_refusal.
  // `caller`: the call's connection; the work ahead is its share (admission.h).
  grpc::Status WorkRefusal(std::optional<Clock::time_point> deadline, const std::string& caller = "");
  // The caller gave up (client cancelled): the job is answered CANCELLED now,
  // on the calling thread, and its queued sequences are dropped.
  void Cancel(const std::shared_ptr<Job>& job);
  // The job is answered `why` now, on the calling thread, unless it is answered already; its queued
  // sequences are dropped (counted under `drop_reason`), and those in a running batch are ignored.
  void Fail(const std::shared_ptr<Job>& job, const grpc::Status& why, const char* drop_reason);
  // Refuses new jobs from now on; waits until every accepted job is answered
  // or `deadline` passes. True when drained.
  bool Drain(Clock::time_point deadline);
  // Refuses new jobs, fails the queued ones UNAVAILABLE "not ready: draining",
  // aborts the model runs in progress (their jobs fail the same way), ends
  // the batcher threads and hands on_refined what it was not told yet.
  void Stop();

 private:
  struct Queued {
    std::shared_ptr<Job> job;
    size_t index;  // position in the job's sequences
    int64_t arrival_us;
  };
  struct Batch {
    std::vector<Queued> seqs;
    PackedBatch packed;
    int64_t started_us = 0;  // when it was counted running (StallClock::NowUs)
    int64_t first_end = 0;   // where its first sequence's turn ends: the head moves no further when it ends
  };
  using Answers = std::vector<std::shared_ptr<Job>>;  // finished jobs whose callback is due

  void Loop(const BatchModel& model);
  // Precondition for the *Locked steps: mu_ held (NextBatchLocked through `lk`, which it releases while
  // on_idle runs).
  grpc::Status RefusalLocked(int64_t n) const;
  // Precondition: mu_ held. The head of the turns: the virtual time, or the lowest rank queued when that
  // is lower (a sequence that came while a batch ran, at the head then, can rank before where that
  // batch's first turn ended, to which the virtual time moves when it ends).
  int64_t HeadLocked() const;
  // Precondition: mu_ held. The batch `b` ended: the virtual time moves on by its real tokens over the
  // callers sharing now, at most to the end of its first turn (batcher.py's _advance_locked says why).
  void AdvanceLocked(const Batch& b);
  // Precondition: mu_ held. Where `caller`'s next turn starts: where its previous one ended, or at
  // `head` when that is later.
  int64_t TurnStartLocked(const std::string& caller, int64_t head) const;
  // Precondition: mu_ held. Why a request of `caller` whose longest sequence is `longest`, first `first`
  // and last `last` long, `total` tokens in all (0: not read yet), is refused by the work ahead of it,
  // or OK: the running batches and every queued sequence ranked at or before where its first would
  // rank (admission.h; unread, the first counts as one token), and its own batch: its longest sequence
  // alone, or with partners padded to the longest of it and the queue, at most max_batch_tokens. Its
  // deadline is held to its last sequence: the queued work ranked at or before where that one's turn
  // ends, and its own sequences before it.
  grpc::Status WorkRefusalLocked(int64_t now_us, std::optional<int64_t> deadline_us, const std::string& caller,
                                 int64_t longest = 0, int64_t first = 0, int64_t total = 0, int64_t last = 0) const;
  std::optional<Batch> NextBatchLocked(std::unique_lock<std::mutex>& lk, Answers* answers);
  // Precondition: mu_ held. What on_refined has not been told yet (the table, the batches since).
  std::optional<std::pair<CostTable, int64_t>> RefinedLocked();
  // Without mu_: on_refined with what RefinedLocked returned, if anything; what it throws is ignored.
  void TellRefined(const std::optional<std::pair<CostTable, int64_t>>& refined);
  Batch TakeBatchLocked(const std::vector<uint64_t>& ids, int64_t now_us);
  // Removes a sequence from the queue (false when it is not there).
  bool RemoveLocked(uint64_t id);
  void QueueChangedLocked();
  // The stall clock follows the queue (where a batch is taken, Loop tells it instead, with the batch).
  void ProgressLocked();
  void FailLocked(std::shared_ptr<Job> job, const grpc::Status& why, const char* drop_reason, Answers* answers);
  void ScoredLocked(const Batch& b, const std::vector<float>& scores, double ms, Answers* answers);
  // Without mu_.
  void Run(const Batch& b, const BatchModel& model, bool lone);
  void LoneHoldLocked(const Batch& b, bool lone);
  void Answer(Answers& answers);
  int64_t NowUs() const;

  const Options opts_;
  const std::vector<BatchModel> models_;
  const BatchModel lone_;
  const std::function<void()> abort_;
  Metrics* const metrics_;
  const Clock::time_point epoch_ = Clock::now();

  std::mutex mu_;
  std::condition_variable work_cv_;  // for the batcher threads: a job arrived or was cancelled, work is left, stop
  std::condition_variable idle_cv_;  // for Drain: in_flight_ reached 0
  std::map<uint64_t, Queued> queue_;  // by sequence id, which is arrival order
  // The planner's view of queue_, kept beside it (planner.h): a decision reads O(max_batch_size) of it
  // instead of rebuilding and sorting every waiting sequence.
  QueueIndex index_;
  ArrivalRate arrivals_;  // the planner waits for partners only when some are expected
  QueueWork work_;                    // the queue's tokens and their model time
  uint64_t next_seq_id_ = 1;
  // Fair order: where each caller's last turn ended (its next one starts there, or at the head when
  // that is later), and the queue's virtual time (the head of an empty queue).
  std::unordered_map<std::string, int64_t> turn_end_;
  size_t sweep_at_ = 64;  // turn_end_'s size past which it is swept
  int64_t virtual_ = 0;
  size_t in_flight_ = 0;  // accepted, callback not yet run
  int running_ = 0;       // batches taken and not yet recorded: a lone one is chosen when this is 0
  // The lone batch running, if one is, and whether another batch started beside it; no lone batch
  // starts before lone_hold_until_us_ (StallClock::NowUs's clock).
  bool lone_running_ = false, lone_overlapped_ = false;
  int64_t lone_hold_until_us_ = 0;
  bool accepting_ = true, stopping_ = false;
  std::optional<int64_t> idle_due_us_;  // when on_idle runs if nothing starts before (NowUs)
  int64_t refined_seen_ = 0;            // batches on_refined was told of (the cost model's count)

  // The batcher threads, one per model worker: each plans, then runs, one batch at a time. Started by
  // the constructor; joined and cleared by the first Stop (only the owner's thread calls Stop).
  std::vector<std::thread> threads_;
};

}  // namespace rmscore
