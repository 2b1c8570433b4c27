#include "batcher.h"

#include <algorithm>
#include <limits>
#include <stdexcept>
#include <unordered_set>

namespace rmscore {
namespace {

double Ms(Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

const grpc::Status& Draining() {
  static const grpc::Status s(grpc::StatusCode::UNAVAILABLE, "not ready: draining");
  return s;
}

}  // namespace

Job::Job(std::vector<SeqView> seqs, std::optional<Clock::time_point> deadline, std::shared_ptr<const void> keepalive,
         Done done, std::string caller)
    : seqs_(std::move(seqs)),
      deadline_(deadline),
      keepalive_(std::move(keepalive)),
      done_(std::move(done)),
      caller_(std::move(caller)) {}

Batcher::Batcher(const Options& opts, std::vector<BatchModel> models, Metrics* metrics, std::function<void()> abort,
                 BatchModel lone)
    : opts_(opts),
      models_(std::move(models)),
      lone_(std::move(lone)),
      abort_(std::move(abort)),
      metrics_(metrics),
      work_(int64_t(models_.size()), opts.max_queue_wait_us, opts.seed_us_per_token, opts.planner.max_batch_us) {
  // Batches observed before this batcher (none today) are not its to report: Python starts alike.
  if (opts_.cost) refined_seen_ = opts_.cost->observed();
  for (const BatchModel& model : models_) threads_.emplace_back([this, &model] { Loop(model); });
}

Batcher::~Batcher() { Stop(); }

int64_t Batcher::NowUs() const {
  return std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - epoch_).count();
}

// ---- callers' API ----------------------------------------------------------------------------------

grpc::Status Batcher::Submit(const std::shared_ptr<Job>& job) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (job->finished_) return job->error_;  // cancelled before it was submitted
    const int64_t arrival = NowUs();
    if (job->deadline_) {
      job->deadline_us_ = std::chrono::duration_cast<std::chrono::microseconds>(*job->deadline_ - epoch_).count();
    }
    grpc::Status refused = RefusalLocked(int64_t(job->seqs_.size()));
    if (refused.ok()) {
      int64_t longest = 0, total = 0;
      for (const auto& s : job->seqs_) longest = std::max(longest, s.length), total += s.length;
      refused = WorkRefusalLocked(arrival, job->deadline_us_, job->caller_, longest,
                                  job->seqs_.empty() ? 0 : job->seqs_.front().length, total,
                                  job->seqs_.empty() ? 0 : job->seqs_.back().length);
    }
    if (!refused.ok()) {
      job->finished_ = true;  // never answered: a later Cancel does nothing
      job->error_ = refused;
      return refused;
    }
    job->accepted_ = true;
    job->accepted_at_ = Clock::now();
    job->scores_.assign(job->seqs_.size(), 0.0f);
    job->remaining_ = job->seqs_.size();
    job->first_seq_id_ = next_seq_id_;
    arrivals_.Add(int64_t(job->seqs_.size()), arrival);
    const int64_t head = HeadLocked();
    int64_t start = TurnStartLocked(job->caller_, head);
    for (size_t i = 0; i < job->seqs_.size(); ++i) {
      // Ranked by where its turn ends.
      const int64_t length = job->seqs_[i].length;
      index_.Add(Waiting{next_seq_id_, arrival, length, job->deadline_us_}, start + length);
      queue_.emplace(next_seq_id_++, Queued{job, i, arrival});
      work_.Add(length, job->caller_);
      start += length;
    }
    turn_end_[job->caller_] = start;
    if (turn_end_.size() > sweep_at_) {
      // Callers whose turns end at or before the head start there anyway: forget them. Swept again only
      // once the table has doubled: where many turns end past the head (a client opening a connection
      // per request is a new caller every time, each a turn past it), most entries survive, and sweeping
      // at each submit walked the whole table under the lock.
      for (auto it = turn_end_.begin(); it != turn_end_.end();) it = it->second <= head ? turn_end_.erase(it) : ++it;
      sweep_at_ = 64 + 2 * turn_end_.size();
    }
    ++in_flight_;
    QueueChangedLocked();
    ProgressLocked();
    metrics_->InFlight(+1);
  }
  work_cv_.notify_one();
  return grpc::Status::OK;
}

grpc::Status Batcher::WorkRefusal(std::optional<Clock::time_point> deadline, const std::string& caller) {
  std::lock_guard<std::mutex> lk(mu_);
  if (!accepting_) return Draining();
  std::optional<int64_t> deadline_us;
  if (deadline) deadline_us = std::chrono::duration_cast<std::chrono::microseconds>(*deadline - epoch_).count();
  return WorkRefusalLocked(NowUs(), deadline_us, caller);
}

int64_t Batcher::HeadLocked() const {
  return index_.size() ? std::min(index_.FirstRank(), virtual_) : virtual_;
}

void Batcher::AdvanceLocked(const Batch& b) {
  int64_t sharing = 0;  // GPS's backlogged callers: whose turns end past the head
  for (const auto& [caller, end] : turn_end_) sharing += end > virtual_;
  sharing = std::max<int64_t>(1, sharing);
  virtual_ = std::max(virtual_, std::min(b.first_end, virtual_ + (b.packed.real_tokens + sharing - 1) / sharing));
}

int64_t Batcher::TurnStartLocked(const std::string& caller, int64_t head) const {
  auto turn = turn_end_.find(caller);
  return turn == turn_end_.end() ? head : std::max(head, turn->second);
}

grpc::Status Batcher::WorkRefusalLocked(int64_t now_us, std::optional<int64_t> deadline_us, const std::string& caller,
                                        int64_t longest, int64_t first, int64_t total, int64_t last) const {
  const int64_t start = TurnStartLocked(caller, HeadLocked());
  const int64_t ahead = index_.TokensThrough(start + std::max<int64_t>(first, 1));
  std::optional<int64_t> before_last;  // several sequences: the deadline is held to the last
  if (total > first) before_last = index_.TokensThrough(start + total) + total - last;
  const PlannerConfig& cfg = opts_.planner;
  int64_t own = longest;
  if (cfg.max_batch_size > 1) {
    const int64_t padded = std::max(longest, index_.by_length().empty() ? int64_t(0) : index_.by_length().back().length);
    own = std::max(longest, std::min(cfg.max_batch_tokens, cfg.max_batch_size * padded));
  }
  return work_.Refusal(now_us, deadline_us, ahead, own, before_last);
}

// Precondition: mu_ held. Why a job of `n` sequences cannot be accepted now (OK when it can): overload
// and draining are refused at once, never queued.
grpc::Status Batcher::RefusalLocked(int64_t n) const {
  if (!accepting_) return Draining();
  const int64_t waiting = int64_t(queue_.size());
  if (waiting + n <= opts_.max_queue_sequences) return grpc::Status::OK;
  return {grpc::StatusCode::RESOURCE_EXHAUSTED,
          "queue full: " + std::to_string(waiting) + " sequences waiting + " + std::to_string(n) +
              " requested exceed max_queue_sequences " + std::to_string(opts_.max_queue_sequences)};
}

void Batcher::Cancel(const std::shared_ptr<Job>& job) {
  Fail(job, grpc::Status(grpc::StatusCode::CANCELLED, "cancelled by the client"), "cancelled");
}

void Batcher::Fail(const std::shared_ptr<Job>& job, const grpc::Status& why, const char* drop_reason) {
  Answers answers;
  {
    std::lock_guard<std::mutex> lk(mu_);
    FailLocked(job, why, drop_reason, &answers);
  }
  work_cv_.notify_one();  // the oldest sequence may have left: the wait changes
  Answer(answers);
}

bool Batcher::Drain(Clock::time_point deadline) {
  std::unique_lock<std::mutex> lk(mu_);
  accepting_ = false;
  return idle_cv_.wait_until(lk, deadline, [this] { return in_flight_ == 0; });
}

void Batcher::Stop() {
  Answers answers;
  {
    std::lock_guard<std::mutex> lk(mu_);
    accepting_ = false;
    stopping_ = true;
    while (!queue_.empty()) FailLocked(queue_.begin()->second.job, Draining(), nullptr, &answers);
  }
  work_cv_.notify_all();  // every batcher thread must see stopping_
  Answer(answers);
  if (!threads_.empty()) {  // else stopped before
    if (abort_) abort_();
    for (std::thread& t : threads_) t.join();
    threads_.clear();
  }
  // A server under load to the end is never idle for on_refined's second: keep the table the batches
  // refined since the last idle spell now, or a restart would plan without it.
  std::optional<std::pair<CostTable, int64_t>> refined;
  {
    std::lock_guard<std::mutex> lk(mu_);
    refined = RefinedLocked();
  }
  TellRefined(refined);
}

// Precondition: mu_ held. The cost table and the batches that refined it since on_refined was last
// told, or nothing when none did (or nobody listens). Python's _refined_locked.
std::optional<std::pair<CostTable, int64_t>> Batcher::RefinedLocked() {
  if (!opts_.on_refined || !opts_.cost || opts_.cost->observed() == refined_seen_) return std::nullopt;
  std::pair<CostTable, int64_t> out{opts_.cost->table(), opts_.cost->observed() - refined_seen_};
  refined_seen_ = opts_.cost->observed();
  return out;
}

void Batcher::TellRefined(const std::optional<std::pair<CostTable, int64_t>>& refined) {
  try {
    if (refined) opts_.on_refined(refined->first, refined->second);
  } catch (const std::exception&) {  // a table not kept is not a failed request
  }
}

// ---- the batcher threads -----------------------------------------------------------------------------

// One worker's loop: `model` is its own session, run without mu_ while the other workers plan.
void Batcher::Loop(const BatchModel& model) {
  std::unique_lock<std::mutex> lk(mu_);
  while (!stopping_) {
    Answers answers;
    std::optional<Batch> batch = NextBatchLocked(lk, &answers);
    const bool work_left = batch && !queue_.empty();
    const int64_t now_us = StallClock::NowUs();
    // Alone, and nothing waits to join it: every thread. A batch taken while it runs goes to its own
    // worker's session and shares the cores until this one ends. Lone batches pause while batches
    // show more than one caller's work (LoneHoldLocked).
    const bool lone = batch && !work_left && running_ == 0 && lone_ && now_us >= lone_hold_until_us_;
    if (batch) {
      if (lone) {
        lone_running_ = true;
        lone_overlapped_ = false;
      } else if (lone_running_) {
        lone_overlapped_ = true;
      }
      ++running_;
      idle_due_us_.reset();
      // Here, not when the batch left the queue: taking it and counting it running are one step under
      // mu_, so the clock never sees the work gone between the two.
      batch->started_us = now_us;
      if (opts_.progress) opts_.progress->BatchStarted(batch->started_us, int64_t(queue_.size()));
    }
    lk.unlock();
    if (work_left) work_cv_.notify_one();  // an idle worker may take the next batch
    Answer(answers);
    if (batch) Run(*batch, lone ? lone_ : model, lone);
    lk.lock();
  }
}

// Precondition: mu_ held through `lk`. Waits until there is something to do: returns the next batch,
// taken off the queue and packed, or nullopt with the jobs that expired meanwhile in *answers, or
// nullopt when stopping.
std::optional<Batcher::Batch> Batcher::NextBatchLocked(std::unique_lock<std::mutex>& lk, Answers* answers) {
  while (!stopping_) {
    if (queue_.empty()) {
      const std::optional<int64_t> due = running_ == 0 ? idle_due_us_ : std::nullopt;
      if (!due) {
        work_cv_.wait(lk);
      } else if (*due > NowUs()) {
        work_cv_.wait_for(lk, std::chrono::microseconds(*due - NowUs()));
      } else {
        idle_due_us_.reset();
        const std::optional<std::pair<CostTable, int64_t>> refined = RefinedLocked();
        lk.unlock();  // never across a model run: on_idle may run one
        try {
          if (opts_.on_idle) opts_.on_idle();
        } catch (const std::exception&) {  // memory kept is not a failed request
        }
        TellRefined(refined);
        lk.lock();
      }
      continue;
    }
    const int64_t now = NowUs();
    const grpc::Status expired(grpc::StatusCode::DEADLINE_EXCEEDED, "deadline exceeded before scoring");
    for (uint64_t id : index_.Expired(now)) {
      // All of a job's sequences share its deadline: the first one fails (and removes) them all.
      auto it = queue_.find(id);
      if (it != queue_.end()) FailLocked(it->second.job, expired, "deadline", answers);
    }
    const Decision d = PlanLive(index_, now, opts_.planner, opts_.cost ? &opts_.cost->table() : nullptr,
                                work_.us_per_token(), arrivals_.PerS(now));
    if (!d.batch.empty()) return TakeBatchLocked(d.batch, now);
    if (!answers->empty()) return std::nullopt;
    if (d.wait_us) {
      work_cv_.wait_for(lk, std::chrono::microseconds(*d.wait_us));  // an arrival or cancel wakes it early
    } else {
      work_cv_.wait(lk);
    }
  }
  return std::nullopt;
}

// Precondition: mu_ held. Removes `ids` from the queue and packs them: the views are read here, under
// mu_, so a job answered afterwards (cancelled, failed) may free its request while the batch runs.
// Their queue wait ends now.
Batcher::Batch Batcher::TakeBatchLocked(const std::vector<uint64_t>& ids, int64_t now_us) {
  Batch b;
  std::vector<SeqView> views;
  // The virtual time moves to the start of the first one's turn now, and on when the batch ends
  // (AdvanceLocked).
  std::pair<int64_t, uint64_t> first{std::numeric_limits<int64_t>::max(), 0};
  for (uint64_t id : ids) first = std::min(first, std::make_pair(index_.Rank(id), id));
  if (!ids.empty()) {
    virtual_ = std::max(virtual_, first.first - index_.Get(first.second).length);
    b.first_end = first.first;
  }
  for (uint64_t id : ids) {
    auto it = queue_.find(id);
    views.push_back(it->second.job->seqs_[it->second.index]);
    metrics_->QueueWait(double(now_us - it->second.arrival_us) / 1e6);
    work_.Remove(views.back().length, it->second.job->caller_);
    b.seqs.push_back(std::move(it->second));
    queue_.erase(it);
    index_.Remove(id);
  }
  b.packed = Pack(views, opts_.pad_token_id);
  work_.BatchStarted(b.packed.real_tokens);  // work ahead of new arrivals until it ends (admission.h)
  QueueChangedLocked();
  return b;
}

// Runs one batch on `model` (without mu_), then records its scores or its failure.
void Batcher::Run(const Batch& b, const BatchModel& model, bool lone) {
  const Clock::time_point start = Clock::now();
  const double cpu_start = ThreadCpuSeconds();
  std::vector<float> scores;
  grpc::Status error;
  try {
    scores = model(b.packed);
    if (scores.size() != b.seqs.size()) {
      throw std::runtime_error("model returned " + std::to_string(scores.size()) + " scores for " +
                               std::to_string(b.seqs.size()) + " sequences");
    }
  } catch (const std::exception& e) {
    error = grpc::Status(grpc::StatusCode::INTERNAL, std::string("batch failed: ") + e.what());
    scores.clear();
  }
  const double ms = Ms(Clock::now() - start);
  const double cost_s = opts_.refine_on_thread_cpu ? ThreadCpuSeconds() - cpu_start : ms / 1e3;
  // A failed run still took the model's time: the batch histograms count every run.
  metrics_->BatchRan(ms / 1e3, b.packed.batch, b.packed.padding_ratio());
  if (error.ok()) metrics_->SequencesScored(int64_t(scores.size()));
  Answers answers;
  {
    std::lock_guard<std::mutex> lk(mu_);
    // A run aborted by Stop (ONNX Runtime's terminate flag, at the end of the drain grace) is the
    // drain refusing the work, as for the jobs still queued, not a model fault: UNAVAILABLE, which
    // a client may retry on another replica (docs/contract.md allows only OK or UNAVAILABLE then).
    if (!error.ok() && stopping_) error = Draining();
    --running_;
    LoneHoldLocked(b, lone);
    // The cost table describes the workers' sessions, where batches run under load, which is where the
    // planner's choices matter: a lone run, on every thread, would skew it.
    if (opts_.cost && error.ok() && !lone) opts_.cost->Observe(int64_t(b.seqs.size()), b.packed.longest, cost_s);
    work_.BatchEnded(b.packed.real_tokens);
    AdvanceLocked(b);
    if (error.ok()) work_.Observe(ms * 1e3, b.packed.real_tokens);
    QueueChangedLocked();
    if ((opts_.on_idle || opts_.on_refined) && queue_.empty() && running_ == 0) {
      idle_due_us_ = NowUs() + opts_.idle_release_us;
      work_cv_.notify_one();  // a waiting batcher thread keeps the time
    }
    // A failed run counts too: its requests are answered, the batcher is not stuck.
    if (opts_.progress) opts_.progress->BatchEnded(b.started_us, StallClock::NowUs(), int64_t(queue_.size()));
    ScoredLocked(b, scores, ms, &answers);
    if (!error.ok()) {
      // Each job of the batch fails once; its sequences still queued never reach the model.
      for (const Queued& q : b.seqs) FailLocked(q.job, error, nullptr, &answers);
    }
  }
  Answer(answers);
}

// Precondition: mu_ held, `b` counted out of running_. A batch that ended showing more than one
// caller's work (another batch running or started beside it, work waiting, or several requests in it)
// means batches at once, where a thread per batch beats every thread per batch with the cores
// oversubscribed (docs/batching.md, "Threads"): no lone batch starts for opts_.lone_hold_us. One that
// ended showing none means a lone caller: the next batch alone may take every thread at once.
void Batcher::LoneHoldLocked(const Batch& b, bool lone) {
  bool several = false;
  for (const Queued& q : b.seqs) several = several || q.job != b.seqs.front().job;
  const bool concurrent = several || !queue_.empty() || running_ > 0 || (lone && lone_overlapped_);
  if (lone) lone_running_ = false;
  lone_hold_until_us_ = concurrent ? StallClock::NowUs() + opts_.lone_hold_us : 0;
}

// ---- shared steps ---------------------------------------------------------------------------------------

// Precondition: mu_ held. Adds the batch's time to each unfinished job in it (once per job) and, when
// `scores` is there, records them; a job whose last sequence that was joins *answers.
void Batcher::ScoredLocked(const Batch& b, const std::vector<float>& scores, double ms, Answers* answers) {
  std::unordered_set<const Job*> seen;
  for (size_t i = 0; i < b.seqs.size(); ++i) {
    Job& job = *b.seqs[i].job;
    if (job.finished_) continue;  // cancelled or failed while it ran: answered already
    if (seen.insert(&job).second) job.inference_ms_ += ms;
    if (scores.empty()) continue;
    job.scores_[b.seqs[i].index] = scores[i];
    if (--job.remaining_ == 0) {
      job.finished_ = true;
      answers->push_back(b.seqs[i].job);
    }
  }
}

// Precondition: mu_ held. Fails `job` with `why` unless it is finished already: it joins *answers and
// its queued sequences leave the queue (counted as dropped when `drop_reason` is set). Its sequences in
// a running batch stay there; their scores are ignored. `job` is taken by value: callers pass a queue
// entry's pointer, and the entry is erased here.
void Batcher::FailLocked(std::shared_ptr<Job> job, const grpc::Status& why, const char* drop_reason,
                         Answers* answers) {
  if (job->finished_) return;
  job->finished_ = true;
  job->error_ = why;
  if (!job->accepted_) return;  // cancelled before Submit, which refuses it with `why`
  answers->push_back(job);
  int64_t dropped = 0;
  for (size_t i = 0; i < job->seqs_.size(); ++i) dropped += RemoveLocked(job->first_seq_id_ + i);
  QueueChangedLocked();
  ProgressLocked();
  if (drop_reason && dropped) metrics_->SequencesDropped(drop_reason, dropped);
}

// Precondition: mu_ held.
bool Batcher::RemoveLocked(uint64_t id) {
  auto it = queue_.find(id);
  if (it == queue_.end()) return false;
  work_.Remove(it->second.job->seqs_[it->second.index].length, it->second.job->caller_);
  queue_.erase(it);
  index_.Remove(id);
  return true;
}

// Precondition: mu_ held. The queue's gauges follow it.
void Batcher::QueueChangedLocked() {
  metrics_->SetQueueDepth(int64_t(queue_.size()));
  metrics_->SetQueueExpectedWait(double(work_.WaitUs()) / 1e6);
}

// Precondition: mu_ held.
void Batcher::ProgressLocked() {
  if (opts_.progress) opts_.progress->QueueChanged(StallClock::NowUs(), int64_t(queue_.size()));
}

// Without mu_: runs each finished job's callback, then counts it answered (so Drain returns only once
// every answer was handed over).
void Batcher::Answer(Answers& answers) {
  if (answers.empty()) return;
  for (const auto& job : answers) {
    Result r;
    r.status = job->error_;
    if (r.status.ok()) r.scores = std::move(job->scores_);
    r.total_ms = Ms(Clock::now() - job->accepted_at_);
    r.inference_ms = job->inference_ms_;
    job->done_(std::move(r));
  }
  metrics_->InFlight(-int(answers.size()));
  std::lock_guard<std::mutex> lk(mu_);
  in_flight_ -= answers.size();
  if (in_flight_ == 0) idle_cv_.notify_all();
}

}  // namespace rmscore
