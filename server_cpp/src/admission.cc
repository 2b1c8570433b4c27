#include "admission.h"

#include <algorithm>
#include <string>

namespace rmscore {

void QueueWork::Observe(double batch_us, int64_t tokens) {
  if (tokens <= 0 || batch_us <= 0) return;
  const double rate = batch_us / double(tokens);
  us_per_token_ = us_per_token_ == 0 ? rate : us_per_token_ + kAlpha * (rate - us_per_token_);
}

void QueueWork::Add(int64_t tokens, const std::string& caller) {
  tokens_ += tokens;
  by_caller_[caller] += tokens;
}

void QueueWork::Remove(int64_t tokens, const std::string& caller) {
  tokens_ -= tokens;
  auto it = by_caller_.find(caller);
  if (it == by_caller_.end()) return;
  it->second -= tokens;
  if (it->second <= 0) by_caller_.erase(it);
}

int64_t QueueWork::WaitUs(std::optional<int64_t> queued_ahead) const {
  return int64_t(double(running_ + queued_ahead.value_or(tokens_)) * us_per_token_ / double(workers_));
}

int64_t QueueWork::OwnBatchUs(int64_t padded_tokens) const {
  const int64_t own = int64_t(double(padded_tokens) * us_per_token_);
  return max_batch_us_ > 0 ? std::min(own, max_batch_us_) : own;
}

grpc::Status QueueWork::Refusal(int64_t now_us, std::optional<int64_t> deadline_us,
                                std::optional<int64_t> queued_ahead, int64_t own_batch_tokens,
                                std::optional<int64_t> queued_before_last) const {
  const int64_t wait = WaitUs(queued_ahead);
  const int64_t to_last = queued_before_last ? WaitUs(queued_before_last) : wait;
  if (to_last <= 0) return grpc::Status::OK;
  if (max_wait_us_ > 0 && wait > max_wait_us_) {
    return {grpc::StatusCode::RESOURCE_EXHAUSTED, "queue full: about " + std::to_string(wait / 1000) +
                                                      " ms of model work waiting exceeds max_queue_wait_seconds (" +
                                                      std::to_string(max_wait_us_ / 1000) + " ms)"};
  }
  const int64_t own = OwnBatchUs(own_batch_tokens);
  if (deadline_us && to_last + own > *deadline_us - now_us) {
    const int64_t left = *deadline_us - now_us;
    const bool one = !queued_before_last;
    const std::string waiting =
        one ? "model work waiting" : "model work before its last sequence (its own earlier sequences included)";
    const std::string batch = one ? "its own batch" : "that sequence's batch";
    return {grpc::StatusCode::DEADLINE_EXCEEDED,
            "deadline exceeded before scoring: about " + std::to_string(to_last / 1000) + " ms of " + waiting +
                " and up to " + std::to_string(own / 1000) + " ms for " + batch + ", " +
                std::to_string((left > 0 ? left : 0) / 1000) + " ms left before the deadline"};
  }
  return grpc::Status::OK;
}

grpc::Status HeldBytes::Hold(int64_t bytes) {
  std::lock_guard<std::mutex> lk(mu_);
  if (held_ > 0 && held_ + bytes > max_bytes_) {
    return {grpc::StatusCode::RESOURCE_EXHAUSTED,
            "queue full: " + std::to_string(held_) + " bytes of accepted requests held, plus this request's " +
                std::to_string(bytes) + ", exceeds max_queued_request_bytes " + std::to_string(max_bytes_)};
  }
  held_ += bytes;
  if (on_change_) on_change_(held_);
  return grpc::Status::OK;
}

void HeldBytes::Release(int64_t bytes) {
  std::lock_guard<std::mutex> lk(mu_);
  held_ -= bytes;
  if (on_change_) on_change_(held_);
}

grpc::Status HeldBytes::Acquire(int64_t bytes, std::shared_ptr<Lease>* lease) {
  grpc::Status s = Hold(bytes);
  if (s.ok()) *lease = std::make_shared<Lease>(this, bytes);
  return s;
}

int64_t HeldBytes::held() const {
  std::lock_guard<std::mutex> lk(mu_);
  return held_;
}

}  // namespace rmscore
