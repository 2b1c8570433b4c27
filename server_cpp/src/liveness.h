// Liveness: is the batcher making progress while work waits? (docs/contract.md, "Liveness")
//
// A hung server used to stay live: the probes asked the metrics endpoint, which its own threads
// serve whatever the batcher does, so a deadlocked batcher or a model run that never returns (a stuck
// device) kept answering and a restart never came. Here the batcher tells a StallClock when work
// starts waiting and when batches start and end; the clock says for how long the batcher has made no
// progress; Liveness holds that against --liveness-stall-seconds; the gauge
// rmscore_batcher_stalled_seconds and gRPC health "liveness" (through LivenessWatch) report it.
//
// Progress is a batch *completing* (scored or failed: either way its requests are answered), not a
// batch starting: a run that never returns has started, and the batcher thread that started it plans
// nothing more, so completions are what a hung model stops. The stall is counted from the later of
// the last completion and the moment work started waiting after an idle spell, or from the start of
// the oldest batch still running when that is earlier (with several model workers one stuck run must
// show while the others keep completing), and is 0 while nothing is queued and no batch runs.
//
// server_py/rmscore/core/liveness.py is this file in Python, with the same names and rules.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <tuple>

#include "cost.h"

namespace rmscore {

// The grpc.health.v1 service name that answers liveness (Kubernetes' `grpc: {service: liveness}`); ""
// stays readiness.
inline constexpr const char* kLivenessService = "liveness";

struct Stall {
  int64_t stalled_us = 0;  // no progress for this long while work waits; 0 when idle or progressing
  int64_t queued = 0;      // sequences waiting for a batch
  int64_t running = 0;     // batches in a model run
  bool operator==(const Stall& o) const {
    return std::tie(stalled_us, queued, running) == std::tie(o.stalled_us, o.queued, o.running);
  }
};

// How long the batcher has made no progress while work waits. Writers: the batcher, holding its own
// lock, so its calls come one at a time and in order. Readers: any thread, any time. The clock's own
// mutex is held only inside these methods, which call nothing: a reader is never blocked by a batcher
// stuck while holding the batcher's lock. Every time is passed in (NowUs() in the server), so the tests
// need no sleeping.
class StallClock {
 public:
  // The clock every caller passes: steady_clock, in microseconds.
  static int64_t NowUs();

  // `queued` sequences wait for a batch from now on.
  void QueueChanged(int64_t now_us, int64_t queued);
  // A batch went into a model run; `queued` sequences are left waiting.
  void BatchStarted(int64_t now_us, int64_t queued);
  // The batch announced by BatchStarted(started_us, ...) completed (scored or failed), which is
  // progress; `queued` sequences wait.
  void BatchEnded(int64_t started_us, int64_t now_us, int64_t queued);

  Stall Read(int64_t now_us) const;
  int64_t StalledUs(int64_t now_us) const { return Read(now_us).stalled_us; }

 private:
  void MarkLocked(int64_t now_us);  // precondition: mu_ held

  mutable std::mutex mu_;
  int64_t queued_ = 0;
  std::multiset<int64_t> running_;  // start times of the batches running
  std::optional<int64_t> since_us_;  // the progress mark; empty exactly while no work waits
};

// (message, warning): where a line goes. The server's prints warnings to stderr, the rest to stdout.
using LivenessLog = std::function<void(const std::string& line, bool warning)>;
void PrintLivenessLine(const std::string& line, bool warning);

// The verdict: alive unless the stall passed `threshold_s` (0: always alive). Says one line when it
// changes: a warning, with the seconds and the queue, when a stall starts being reported, and a line
// when progress resumes.
class Liveness {
 public:
  Liveness(std::shared_ptr<const StallClock> clock, double threshold_s, LivenessLog log = PrintLivenessLine);
  // Alive at `now_us` (StallClock::NowUs's clock); *stall (optional) gets what it was judged on.
  bool Check(int64_t now_us, Stall* stall = nullptr);
  double threshold_s() const { return threshold_s_; }

 private:
  const std::shared_ptr<const StallClock> clock_;
  const double threshold_s_;
  const LivenessLog log_;
  std::mutex mu_;  // orders the verdicts of concurrent checks
  bool alive_ = true;
};

// A thread that checks `liveness` every `period` and calls on_change(alive) when the verdict changes
// (the server: the health service's "liveness" status, which Check and Watch then answer). It reads only
// the StallClock, so it keeps answering while the batcher is stuck. The verdict starts alive, as the
// server announces it at start. Stopped and joined by Stop or the destructor.
class LivenessWatch {
 public:
  // A probe sees a stall at most this long after the threshold passes.
  static constexpr std::chrono::milliseconds kPeriod{250};

  LivenessWatch(Liveness* liveness, std::function<void(bool alive)> on_change,
                std::chrono::milliseconds period = kPeriod);
  ~LivenessWatch();
  void Stop();

 private:
  void Run();

  Liveness* const liveness_;
  const std::function<void(bool)> on_change_;
  const std::chrono::milliseconds period_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;  // guarded by mu_
  std::thread thread_;
};

struct LongestBatch {
  int64_t us = 0, count = 1, length = 1;
};
// The costliest batch the limits allow: B sequences padded to min(max_length, max_batch_tokens / B)
// tokens, or one sequence of max_length (a sequence longer than the token bound still runs, alone).
// What the threshold must stay above.
LongestBatch LongestBatchOf(const CostTable& table, int64_t max_batch_size, int64_t max_batch_tokens,
                            int64_t max_length);
// The start-up line about liveness, and whether it is a warning: a threshold under three times the
// longest batch could take a slow batch for a hang. `longest`: none without a cost table.
std::pair<std::string, bool> ThresholdNote(double threshold_s, const std::optional<LongestBatch>& longest);

// ---- fault injection, for tests only ------------------------------------------------------------------

// "K:S": the K-th batch the batcher runs (counted from 1 over every model worker; warm-up, cost
// measurement and self-check runs are not batches) blocks S seconds before its model run, as a stuck
// device would. Read once, at start; a value that does not parse refuses the start (ConfigError: exit
// 2). Not interrupted by a drain. For tests of liveness (tests/conformance/test_liveness.py) against a
// real server: never set it in production.
inline constexpr const char* kHangBatchEnv = "RMSCORE_FAULT_HANG_BATCH";

struct HangFault {
  int64_t batch = 0;  // 0: no fault
  double seconds = 0;
};
// Throws ConfigError quoting the value when it does not parse; the same rule and message as Python's.
HangFault ParseHangFault(const std::string& value);
HangFault HangFaultFromEnv();  // unset or empty: no fault

// Runs before every batch's model run (any worker); blocks the batch `fault` names.
class HangHook {
 public:
  using Sleep = std::function<void(double seconds)>;
  explicit HangHook(HangFault fault, Sleep sleep = nullptr, LivenessLog log = PrintLivenessLine);
  void BeforeBatch();

 private:
  const HangFault fault_;
  const Sleep sleep_;
  const LivenessLog log_;
  std::mutex mu_;  // model workers count batches together
  int64_t batches_ = 0;
};

}  // namespace rmscore
