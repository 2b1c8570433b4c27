// Admission by expected work: how long the queue will keep the model busy, and
// who to refuse for it. server_py/rmscore/core/admission.py is this file in
// Python, with the same rule and messages (it says why); the shared vectors'
// "admission" cases hold both to it.
//
// The expected wait of a new request is the real tokens ahead of it (queued,
// and in the batches running now, counted whole until they end) times the model
// microseconds per token this server measures (seeded at warm-up, then an
// exponential average over every batch run), shared among the model workers. Refused at once: RESOURCE_EXHAUSTED past max_wait_us (0: no
// bound), DEADLINE_EXCEEDED past the time its deadline leaves. An idle server
// accepts any valid request: only the work ahead counts.
#pragma once

#include <grpcpp/support/status.h>

#include <cstdint>
#include <optional>

namespace rmscore {

// Not thread-safe: the batcher holds its mutex around every call.
class QueueWork {
 public:
  static constexpr double kAlpha = 0.2;  // weight of one observed batch: about the last 5 count

  QueueWork(int64_t workers, int64_t max_wait_us, double seed_us_per_token = 0)
      : workers_(workers < 1 ? 1 : workers), max_wait_us_(max_wait_us), us_per_token_(seed_us_per_token) {}

  void Add(int64_t tokens) { tokens_ += tokens; }
  void Remove(int64_t tokens) { tokens_ -= tokens; }
  // A batch of `tokens` real tokens left the queue (Removed already) for a worker; it ended.
  void BatchStarted(int64_t tokens) { running_ += tokens; }
  void BatchEnded(int64_t tokens) { running_ -= tokens; }
  // A batch holding `tokens` real tokens ran in `batch_us` (the first observation sets the rate).
  void Observe(double batch_us, int64_t tokens);
  // Expected model time, per worker, of what is queued or running: what a request arriving now waits.
  int64_t WaitUs() const;
  // Why a request arriving at `now_us` (deadline on the same clock) is refused, or OK.
  grpc::Status Refusal(int64_t now_us, std::optional<int64_t> deadline_us) const;

  int64_t tokens() const { return tokens_; }
  double us_per_token() const { return us_per_token_; }

 private:
  const int64_t workers_;
  const int64_t max_wait_us_;
  int64_t tokens_ = 0;         // real tokens of the sequences in the queue
  int64_t running_ = 0;        // real tokens of the batches the workers are running
  double us_per_token_ = 0;    // 0 until seeded or observed: nothing is refused by work before
};

}  // namespace rmscore
