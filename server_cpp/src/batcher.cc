#include "batcher.h"

#include <algorithm>
#include <stdexcept>
#include <unordered_set>

namespace rmscore {
namespace {

double Ms(Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

}  // namespace

Job::Job(std::vector<SeqView> seqs, std::optional<Clock::time_point> deadline, std::shared_ptr<const void> keepalive,
         Done done)
    : seqs_(std::move(seqs)), deadline_(deadline), keepalive_(std::move(keepalive)), done_(std::move(done)) {}

Batcher::Batcher(const Options& opts, BatchModel model, Metrics* metrics, std::function<void()> abort)
    : opts_(opts), model_(std::move(model)), abort_(std::move(abort)), metrics_(metrics) {
  batcher_thread_ = std::thread([this] { BatcherLoop(); });
  worker_thread_ = std::thread([this] { WorkerLoop(); });
}

Batcher::~Batcher() { Stop(); }

int64_t Batcher::NowUs() const {
  return std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - epoch_).count();
}

grpc::Status Batcher::Submit(const std::shared_ptr<Job>& job) {
  const int64_t n = int64_t(job->seqs_.size());
  job->accepted_ = Clock::now();
  job->scores_.assign(job->seqs_.size(), 0.0f);
  job->remaining_ = job->seqs_.size();
  const int64_t arrival = NowUs();
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (!accepting_) return {grpc::StatusCode::UNAVAILABLE, "not ready: draining"};
    const int64_t waiting = int64_t(queue_.size());
    if (waiting + n > opts_.max_queue_sequences) {
      return {grpc::StatusCode::RESOURCE_EXHAUSTED,
              "queue full: " + std::to_string(waiting) + " sequences waiting + " + std::to_string(n) +
                  " requested exceed max_queue_sequences " + std::to_string(opts_.max_queue_sequences)};
    }
    for (size_t i = 0; i < job->seqs_.size(); ++i) queue_.push_back(Queued{next_seq_id_++, job, i, arrival});
    ++active_jobs_;
    metrics_->SetQueueDepth(int64_t(queue_.size()));
    metrics_->InFlight(+1);
  }
  batcher_cv_.notify_one();
  return grpc::Status::OK;
}

void Batcher::Cancel(const std::shared_ptr<Job>& job) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    job->cancelled_ = true;
    abandoned_ = true;
  }
  batcher_cv_.notify_one();
}

bool Batcher::Drain(Clock::time_point deadline) {
  std::unique_lock<std::mutex> lk(mu_);
  accepting_ = false;
  return idle_cv_.wait_until(lk, deadline, [this] { return active_jobs_ == 0; });
}

void Batcher::Stop() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (stopping_ && !batcher_thread_.joinable()) return;
    accepting_ = false;
    stopping_ = true;
  }
  batcher_cv_.notify_all();
  worker_cv_.notify_all();
  if (abort_) abort_();
  if (batcher_thread_.joinable()) batcher_thread_.join();
  if (worker_thread_.joinable()) worker_thread_.join();
  // Both threads are gone: whatever is still queued or built fails, once.
  Finished finished;
  {
    std::lock_guard<std::mutex> lk(mu_);
    const grpc::Status why(grpc::StatusCode::UNAVAILABLE, "not ready: draining");
    if (ready_) {
      for (Queued& q : ready_->seqs) queue_.push_back(std::move(q));
      ready_.reset();
    }
    for (Queued& q : queue_) {
      if (q.job->error_.ok()) q.job->error_ = why;
      SequenceDoneLocked(q, &finished);
    }
    queue_.clear();
  }
  Finish(finished);
}

// Precondition: mu_ held. Counts one of q.job's sequences as done (scored,
// dropped or failed); the job joins *finished when it was its last.
void Batcher::SequenceDoneLocked(Queued& q, Finished* finished) {
  if (--q.job->remaining_ == 0) finished->push_back(q.job);
}

// Precondition: mu_ held. Removes `ids` from the queue and fails their jobs with `why`.
void Batcher::DropLocked(const std::vector<uint64_t>& ids, const grpc::Status& why, const char* reason,
                         Finished* finished) {
  std::vector<Queued> gone = TakeLocked(ids);
  for (Queued& q : gone) {
    if (q.job->error_.ok()) q.job->error_ = why;
    SequenceDoneLocked(q, finished);
  }
  if (!gone.empty()) metrics_->SequencesDropped(reason, int64_t(gone.size()));
}

// Precondition: mu_ held. Drops queued sequences whose job was cancelled, or
// already failed elsewhere (a sibling's batch failed): the model need not see them.
void Batcher::DropAbandonedLocked(Finished* finished) {
  if (!abandoned_) return;
  abandoned_ = false;
  std::vector<uint64_t> cancelled, failed;
  for (const Queued& q : queue_) {
    if (q.job->cancelled_) {
      cancelled.push_back(q.id);
    } else if (!q.job->error_.ok()) {
      failed.push_back(q.id);
    }
  }
  DropLocked(cancelled, grpc::Status(grpc::StatusCode::CANCELLED, "cancelled by the client"), "cancelled", finished);
  for (Queued& q : TakeLocked(failed)) SequenceDoneLocked(q, finished);
}

// Precondition: mu_ held. Removes `ids` from the queue, keeping the rest in
// order; returns the removed entries in queue order.
std::vector<Batcher::Queued> Batcher::TakeLocked(const std::vector<uint64_t>& ids) {
  std::vector<Queued> taken;
  if (ids.empty()) return taken;
  const std::unordered_set<uint64_t> wanted(ids.begin(), ids.end());
  std::deque<Queued> kept;
  for (Queued& q : queue_) {
    if (wanted.count(q.id)) {
      taken.push_back(std::move(q));
    } else {
      kept.push_back(std::move(q));
    }
  }
  queue_.swap(kept);
  metrics_->SetQueueDepth(int64_t(queue_.size()));
  return taken;
}

void Batcher::BatcherLoop() {
  std::unique_lock<std::mutex> lk(mu_);
  std::vector<Waiting> snapshot;
  while (!stopping_) {
    Finished finished;
    DropAbandonedLocked(&finished);
    if (!finished.empty()) {
      lk.unlock();
      Finish(finished);
      lk.lock();
      continue;
    }
    // One batch ahead at most: wait while the built batch is not taken yet.
    if (ready_ || queue_.empty()) {
      batcher_cv_.wait(lk);
      continue;
    }
    snapshot.clear();
    for (const Queued& q : queue_) {
      std::optional<int64_t> deadline;
      if (q.job->deadline_) {
        deadline = std::chrono::duration_cast<std::chrono::microseconds>(*q.job->deadline_ - epoch_).count();
      }
      snapshot.push_back(Waiting{q.id, q.arrival_us, q.job->seqs_[q.index].length, deadline});
    }
    const int64_t now = NowUs();
    // While the worker runs, only a full batch is built ahead (an effectively
    // infinite delay makes the planner dispatch only full ones), so sequences
    // arriving meanwhile can still join: the same policy as the Python batcher.
    PlannerConfig cfg = opts_.planner;
    const bool busy = worker_busy_;
    if (busy) cfg.max_queue_delay_us = int64_t(1) << 62;
    lk.unlock();
    const Decision d = Plan(snapshot, now, cfg);
    lk.lock();
    DropLocked(d.expired, grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, "deadline exceeded before scoring"),
               "deadline", &finished);
    std::optional<Batch> batch;
    if (!d.batch.empty()) batch = Batch{next_batch_++, TakeLocked(d.batch), {}};
    lk.unlock();
    Finish(finished);
    if (batch) {
      std::vector<SeqView> views;
      views.reserve(batch->seqs.size());
      for (const Queued& q : batch->seqs) views.push_back(q.job->seqs_[q.index]);
      batch->packed = Pack(views, opts_.pad_token_id);
    }
    lk.lock();
    if (batch) {
      ready_ = std::move(batch);
      worker_cv_.notify_one();
    } else if (busy && worker_busy_ && !stopping_) {
      // The worker's completion (or an arrival) wakes us to plan again.
      batcher_cv_.wait(lk);
    } else if (d.wait_us && !stopping_ && !busy) {
      // Woken early by an arrival or a cancellation: plan again.
      batcher_cv_.wait_for(lk, std::chrono::microseconds(*d.wait_us));
    }
  }
}

void Batcher::WorkerLoop() {
  std::unique_lock<std::mutex> lk(mu_);
  while (true) {
    worker_cv_.wait(lk, [this] { return ready_.has_value() || stopping_; });
    if (stopping_) return;  // Stop fails what is built
    Batch b = std::move(*ready_);
    ready_.reset();
    batcher_cv_.notify_one();  // the batcher may build the next batch now
    worker_busy_ = true;
    lk.unlock();
    RunBatch(b);
    lk.lock();
    worker_busy_ = false;
    batcher_cv_.notify_one();  // the batcher may now form a batch that is not full
  }
}

// Runs one batch on the model (without mu_), then records its scores.
void Batcher::RunBatch(Batch& b) {
  const Clock::time_point start = Clock::now();
  const int64_t start_us = NowUs();
  for (const Queued& q : b.seqs) metrics_->QueueWait(double(start_us - q.arrival_us) / 1e6);
  std::vector<float> scores;
  grpc::Status error;
  try {
    scores = model_(b.packed);
    if (scores.size() != b.seqs.size()) {
      throw std::runtime_error("model returned " + std::to_string(scores.size()) + " scores for " +
                               std::to_string(b.seqs.size()) + " sequences");
    }
  } catch (const std::exception& e) {
    error = grpc::Status(grpc::StatusCode::INTERNAL, std::string("batch failed: ") + e.what());
  }
  const double ms = Ms(Clock::now() - start);
  metrics_->BatchRan(ms / 1e3, b.packed.batch, b.packed.padding_ratio());
  if (error.ok()) metrics_->SequencesScored(int64_t(scores.size()));

  Finished finished;
  {
    std::lock_guard<std::mutex> lk(mu_);
    for (size_t i = 0; i < b.seqs.size(); ++i) {
      Job& job = *b.seqs[i].job;
      if (job.last_batch_ != b.number) {
        job.last_batch_ = b.number;
        job.inference_ms_ += ms;
      }
      if (error.ok()) {
        job.scores_[b.seqs[i].index] = scores[i];
      } else if (job.error_.ok()) {
        job.error_ = error;
        abandoned_ = true;  // its other queued sequences need not run
      }
      SequenceDoneLocked(b.seqs[i], &finished);
    }
  }
  if (!error.ok()) batcher_cv_.notify_one();
  Finish(finished);
}

void Batcher::Finish(Finished& finished) {
  if (finished.empty()) return;
  for (const auto& job : finished) {
    // The job's result fields are final (no sequence of it is queued or in a
    // batch any more, and only those paths write them), so no lock is needed.
    JobResult r;
    r.status = job->error_;
    if (r.status.ok()) r.scores = std::move(job->scores_);
    r.total_ms = Ms(Clock::now() - job->accepted_);
    r.inference_ms = job->inference_ms_;
    job->done_(std::move(r));
  }
  metrics_->InFlight(-int(finished.size()));
  std::lock_guard<std::mutex> lk(mu_);
  active_jobs_ -= finished.size();
  if (active_jobs_ == 0) idle_cv_.notify_all();
  finished.clear();
}

}  // namespace rmscore
