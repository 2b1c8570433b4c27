// Admission by expected work: how long the queue will keep the model busy, and
// who to refuse for it. server_py/rmscore/core/admission.py is this file in
// Python, with the same rule and messages (it says why); the shared vectors'
// "admission" cases hold both to it.
//
// The expected wait of a new request is the real tokens ahead of it (queued,
// and in the batches running now, counted whole until they end) times the model
// microseconds per token this server measures (seeded at warm-up, then an
// exponential average over every batch run), shared among the model workers.
// Refused at once: RESOURCE_EXHAUSTED past max_wait_us (0: no bound),
// DEADLINE_EXCEEDED when it and the request's own batch (OwnBatchUs) pass the time
// its deadline leaves; for a request of several sequences, the work before its last
// sequence's turn ends, its own earlier sequences included. For the work bound only
// the work ahead counts: an idle server accepts any valid request that its deadline
// leaves time for.
//
// Callers are served in turn (issue 29, defect 4): a caller is a connection (the
// call's peer), every call and stream on it included, and the batcher orders the
// queue by each caller's own work (batcher.h, "fair order"). So the work ahead of
// a new request is what ranks before it: the batches running, and the queued
// sequences whose turn ends at or before its first's would (its caller's own
// queued work, and each other caller's up to there). The batcher reads that from
// its index (QueueIndex::TokensThrough) and hands it to Refusal. A new caller
// waits for the running batches and the sequences that end before its own turn
// does (80 callers each holding a 512-token sequence at the head are not ahead of
// a 16-token probe); a caller that floods is refused for its own work, alone; a request larger
// than the bound is fed to the model in its caller's turns.
#pragma once

#include <grpcpp/support/status.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>

namespace rmscore {

// Not thread-safe: the batcher holds its mutex around every call.
class QueueWork {
 public:
  static constexpr double kAlpha = 0.2;  // weight of one observed batch: about the last 5 count

  // `max_batch_us` (0: none) bounds a request's own batch, which a deadline must also leave time for
  // (admission.py says why).
  QueueWork(int64_t workers, int64_t max_wait_us, double seed_us_per_token = 0, int64_t max_batch_us = 0)
      : workers_(workers < 1 ? 1 : workers),
        max_wait_us_(max_wait_us),
        max_batch_us_(max_batch_us),
        us_per_token_(seed_us_per_token) {}

  void Add(int64_t tokens, const std::string& caller = "");
  void Remove(int64_t tokens, const std::string& caller = "");
  // Callers with tokens queued.
  size_t callers() const { return by_caller_.size(); }
  // A batch of `tokens` real tokens left the queue (Removed already) for a worker; it ended.
  void BatchStarted(int64_t tokens) { running_ += tokens; }
  void BatchEnded(int64_t tokens) { running_ -= tokens; }
  // A batch holding `tokens` real tokens ran in `batch_us` (the first observation sets the rate).
  void Observe(double batch_us, int64_t tokens);
  // Expected model time, per worker, of the running batches and `queued_ahead` real tokens of the queue
  // (a request's share: the batcher's QueueIndex::TokensThrough); nullopt: everything queued (the gauge).
  int64_t WaitUs(std::optional<int64_t> queued_ahead = std::nullopt) const;
  // The time of a request's own batch of `padded_tokens` at the rate, at most the batch time bound.
  int64_t OwnBatchUs(int64_t padded_tokens) const;
  // Why a request arriving at `now_us` (deadline on the same clock) behind the running batches and
  // `queued_ahead` queued real tokens (nullopt: all of them), to run in a batch of at most
  // `own_batch_tokens` padded tokens, is refused, or OK. `queued_before_last`, for a request of several
  // sequences: the real tokens queued that rank at or before its last sequence, plus its own sequences
  // before that one (nullopt: `queued_ahead`, a request of one sequence). The work bound reads what is
  // ahead of its first sequence; its deadline, what must run before its last one ends.
  grpc::Status Refusal(int64_t now_us, std::optional<int64_t> deadline_us,
                       std::optional<int64_t> queued_ahead = std::nullopt, int64_t own_batch_tokens = 0,
                       std::optional<int64_t> queued_before_last = std::nullopt) const;

  int64_t tokens() const { return tokens_; }
  double us_per_token() const { return us_per_token_; }

 private:
  const int64_t workers_;
  const int64_t max_wait_us_;
  const int64_t max_batch_us_;
  int64_t tokens_ = 0;         // real tokens of the sequences in the queue
  int64_t running_ = 0;        // real tokens of the batches the workers are running
  double us_per_token_ = 0;    // 0 until seeded or observed: nothing is refused by work before
  std::unordered_map<std::string, int64_t> by_caller_;  // real tokens queued, per caller that has any
};

// What an accepted request is counted as holding (--max-queued-request-bytes): 8 bytes per token id
// as sent, before truncation (the proto's int64, as RepeatedField<int64> keeps them here), and 1 per
// text character (Python kinds only). server_py/rmscore/core/admission.py request_bytes is the same.
inline constexpr int64_t kBytesPerId = 8;
inline int64_t RequestBytes(int64_t ids, int64_t chars = 0) { return kBytesPerId * ids + chars; }

// The bytes of accepted requests held until answered, bounded by --max-queued-request-bytes (issue 29,
// defect 1: a request is kept whole until answered while admission by work counts only the tokens that
// run). A request that would take the total past the bound is refused RESOURCE_EXHAUSTED before it is
// queued; when nothing is held any one request is accepted, as an idle queue accepts any request's
// work. Thread-safe. server_py/rmscore/core/admission.py HeldBytes: same rule and message.
class HeldBytes {
 public:
  explicit HeldBytes(int64_t max_bytes) : max_bytes_(max_bytes) {}

  // Gives back its bytes when destroyed (when the request is answered and its memory freed).
  class Lease {
   public:
    Lease(HeldBytes* owner, int64_t bytes) : owner_(owner), bytes_(bytes) {}
    ~Lease() { owner_->Release(bytes_); }
    Lease(const Lease&) = delete;
    Lease& operator=(const Lease&) = delete;

   private:
    HeldBytes* const owner_;
    const int64_t bytes_;
  };

  // Counts `bytes` as held and returns OK, or returns the refusal and counts nothing.
  grpc::Status Hold(int64_t bytes);
  void Release(int64_t bytes);
  // Hold, and on OK *lease gives the bytes back when the last copy of it goes.
  grpc::Status Acquire(int64_t bytes, std::shared_ptr<Lease>* lease);
  int64_t held() const;
  // `f(held)` after every change, under the lock (so in order); must not block. Set before serving.
  void OnChange(std::function<void(int64_t)> f) { on_change_ = std::move(f); }

 private:
  const int64_t max_bytes_;
  mutable std::mutex mu_;
  int64_t held_ = 0;
  std::function<void(int64_t)> on_change_;
};

}  // namespace rmscore
