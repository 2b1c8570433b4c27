#include "liveness.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <sstream>

#include "config.h"

namespace rmscore {
namespace {

// Python's "{:g}" for the threshold and the fault's seconds, so the two servers' lines read alike.
std::string G(double x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", x);
  return buf;
}

std::string Fixed(double x, int digits) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "%.*f", digits, x);
  return buf;
}

}  // namespace

int64_t StallClock::NowUs() {
  return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

void StallClock::QueueChanged(int64_t now_us, int64_t queued) {
  std::lock_guard<std::mutex> lk(mu_);
  queued_ = queued;
  MarkLocked(now_us);
}

void StallClock::BatchStarted(int64_t now_us, int64_t queued) {
  std::lock_guard<std::mutex> lk(mu_);
  running_.insert(now_us);
  queued_ = queued;
  MarkLocked(now_us);
}

void StallClock::BatchEnded(int64_t started_us, int64_t now_us, int64_t queued) {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = running_.find(started_us);
  if (it != running_.end()) running_.erase(it);  // one of equal start times
  queued_ = queued;
  since_us_ = now_us;
  MarkLocked(now_us);
}

// Precondition: mu_ held. Work waiting after an idle spell is counted from now; none: no mark.
void StallClock::MarkLocked(int64_t now_us) {
  if (queued_ == 0 && running_.empty()) {
    since_us_.reset();
  } else if (!since_us_) {
    since_us_ = now_us;
  }
}

Stall StallClock::Read(int64_t now_us) const {
  std::lock_guard<std::mutex> lk(mu_);
  Stall s{0, queued_, int64_t(running_.size())};
  if (!since_us_) return s;
  const int64_t start = running_.empty() ? *since_us_ : std::min(*since_us_, *running_.begin());
  s.stalled_us = std::max<int64_t>(0, now_us - start);
  return s;
}

void PrintLivenessLine(const std::string& line, bool warning) {
  (warning ? std::cerr : std::cout) << line << std::endl;
}

Liveness::Liveness(std::shared_ptr<const StallClock> clock, double threshold_s, LivenessLog log)
    : clock_(std::move(clock)), threshold_s_(threshold_s), log_(std::move(log)) {}

bool Liveness::Check(int64_t now_us, Stall* out) {
  const Stall stall = clock_->Read(now_us);
  const bool alive = threshold_s_ == 0 || double(stall.stalled_us) <= threshold_s_ * 1e6;
  bool was = true;
  {
    std::lock_guard<std::mutex> lk(mu_);
    was = alive_;
    alive_ = alive;
  }
  if (was && !alive) {
    log_("rmscore WARNING liveness: the batcher made no progress for " + Fixed(double(stall.stalled_us) / 1e6, 1) +
             " s with " + std::to_string(stall.queued) + " sequences queued and " + std::to_string(stall.running) +
             " batches running (--liveness-stall-seconds " + G(threshold_s_) +
             "): liveness fails until a batch completes",
         true);
  } else if (alive && !was) {
    log_("rmscore liveness: the batcher makes progress again; liveness passes", false);
  }
  if (out != nullptr) *out = stall;
  return alive;
}

LivenessWatch::LivenessWatch(Liveness* liveness, std::function<void(bool)> on_change, std::chrono::milliseconds period)
    : liveness_(liveness), on_change_(std::move(on_change)), period_(period), thread_([this] { Run(); }) {}

LivenessWatch::~LivenessWatch() { Stop(); }

void LivenessWatch::Stop() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void LivenessWatch::Run() {
  bool alive = true;
  std::unique_lock<std::mutex> lk(mu_);
  while (!cv_.wait_for(lk, period_, [this] { return stopping_; })) {
    lk.unlock();  // the check and the report run without mu_: Stop never waits behind them for long
    const bool now_alive = liveness_->Check(StallClock::NowUs());
    if (now_alive != alive && on_change_) on_change_(now_alive);
    alive = now_alive;
    lk.lock();
  }
}

LongestBatch LongestBatchOf(const CostTable& table, int64_t max_batch_size, int64_t max_batch_tokens,
                            int64_t max_length) {
  LongestBatch best{0, 1, max_length};
  for (int64_t b = 1; b <= max_batch_size; ++b) {
    const int64_t n = b == 1 ? max_length : std::min(max_length, max_batch_tokens / b);
    if (n < 1) break;
    const int64_t us = table.BatchUs(b, n);
    // Python's max over (us, b, n) tuples: on equal cost, the larger shape.
    if (std::tie(us, b, n) > std::tie(best.us, best.count, best.length)) best = {us, b, n};
  }
  return best;
}

std::pair<std::string, bool> ThresholdNote(double threshold_s, const std::optional<LongestBatch>& longest) {
  if (threshold_s == 0) return {"rmscore liveness: --liveness-stall-seconds 0: liveness never fails", false};
  std::string line = "rmscore liveness: fails after " + G(threshold_s) + " s with work waiting and no batch completing";
  if (!longest) return {line, false};
  const std::string shape = std::to_string(longest->count) + " x " + std::to_string(longest->length) + " tokens";
  const std::string predicted = Fixed(double(longest->us) / 1e6, 2);
  if (threshold_s * 1e6 < 3.0 * double(longest->us)) {
    return {"rmscore WARNING liveness: --liveness-stall-seconds " + G(threshold_s) +
                " is under 3 x the longest batch the limits allow (" + shape + ", predicted " + predicted +
                " s here): a slow batch may be taken for a hang",
            true};
  }
  return {line + "; the longest batch the limits allow (" + shape + ") is predicted at " + predicted + " s here", false};
}

HangFault ParseHangFault(const std::string& value) {
  const auto fail = [&]() -> HangFault {
    throw ConfigError(std::string(kHangBatchEnv) +
                      ": must be K:SECONDS (the K-th batch, K >= 1, hangs 0 < SECONDS <= 86400), got '" + value + "'");
  };
  const size_t colon = value.find(':');
  if (colon == std::string::npos || colon == 0) return fail();
  const std::string k = value.substr(0, colon), s = value.substr(colon + 1);
  if (!std::all_of(k.begin(), k.end(), [](unsigned char c) { return std::isdigit(c); })) return fail();
  HangFault f;
  try {
    size_t used = 0;
    f.batch = std::stoll(k);
    f.seconds = std::stod(s, &used);
    if (used != s.size()) return fail();
  } catch (const std::exception&) {
    return fail();
  }
  if (f.batch < 1 || !(f.seconds > 0 && f.seconds <= 86400)) return fail();
  return f;
}

HangFault HangFaultFromEnv() {
  const char* v = std::getenv(kHangBatchEnv);
  return v == nullptr || *v == '\0' ? HangFault{} : ParseHangFault(v);
}

HangHook::HangHook(HangFault fault, Sleep sleep, LivenessLog log)
    : fault_(fault),
      sleep_(sleep ? std::move(sleep)
                   : Sleep([](double s) { std::this_thread::sleep_for(std::chrono::duration<double>(s)); })),
      log_(std::move(log)) {
  if (fault_.batch) {
    log_("rmscore FAULT INJECTION (" + std::string(kHangBatchEnv) + "): batch " + std::to_string(fault_.batch) +
             " will hang " + G(fault_.seconds) + " s; for tests only",
         true);
  }
}

void HangHook::BeforeBatch() {
  if (!fault_.batch) return;
  bool hang = false;
  {
    std::lock_guard<std::mutex> lk(mu_);
    hang = ++batches_ == fault_.batch;
  }
  if (!hang) return;
  log_("rmscore FAULT INJECTION: batch " + std::to_string(fault_.batch) + " hangs " + G(fault_.seconds) + " s", true);
  sleep_(fault_.seconds);
}

}  // namespace rmscore
