// Liveness (liveness.h): the stall clock with times passed in, the verdict and its log lines, the
// scrape-time gauge, the flag, the fault-injection hook, and the batcher telling the clock. No sleeping:
// times are injected and model runs are held by a promise. Each case has a namesake in
// tests/unit/test_stall_clock.py (the Python twin), and the other way round.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <future>
#include <mutex>
#include <stdexcept>
#include <thread>

#include "batcher.h"
#include "config.h"
#include "liveness.h"
#include "metrics.h"

namespace rmscore {
namespace {

using namespace std::chrono_literals;
constexpr int64_t S = 1'000'000;  // microseconds

// ---- the stall clock --------------------------------------------------------------------------------

TEST(StallClock, IdleIsNeverStalledHoweverLongSinceTheLastBatch) {
  StallClock c;
  EXPECT_EQ(c.StalledUs(10 * S), 0);
  c.QueueChanged(0, 1);
  c.BatchStarted(1, 0);
  c.BatchEnded(1, 2 * S, 0);
  EXPECT_EQ(c.StalledUs(3600 * S), 0);  // an hour idle after the last batch
  // Work arriving after the idle spell is counted from its arrival, not from the last batch.
  c.QueueChanged(3600 * S, 2);
  EXPECT_EQ(c.StalledUs(3601 * S), S);
}

TEST(StallClock, CountsFromArrivalWhileTheBatchRunsAndResetsOnCompletion) {
  StallClock c;
  c.QueueChanged(100, 1);
  c.BatchStarted(120, 0);  // the batch took it: nothing queued, one running
  EXPECT_EQ(c.Read(5 * S), (Stall{5 * S - 100, 0, 1}));
  c.QueueChanged(S, 3);  // arrivals while it runs do not restart the count
  EXPECT_EQ(c.StalledUs(5 * S), 5 * S - 100);
  c.BatchEnded(120, 6 * S, 3);  // completion is progress: counted from it while work still waits
  EXPECT_EQ(c.StalledUs(7 * S), S);
  c.QueueChanged(7 * S, 0);
  EXPECT_EQ(c.StalledUs(8 * S), 0);
}

TEST(StallClock, AFailedBatchIsProgressToo) {
  // The batcher reports every run's end, scored or failed (its requests are answered either way).
  StallClock c;
  c.QueueChanged(0, 2);
  c.BatchStarted(0, 1);
  c.BatchEnded(0, 4 * S, 1);
  EXPECT_EQ(c.StalledUs(4 * S), 0);
}

TEST(StallClock, ABacklogOfLongBatchesStallsNoLongerThanOneBatch) {
  // One worker, a steady backlog, 5 s batches back to back: never more than one batch's time.
  StallClock c;
  c.QueueChanged(0, 100);
  int64_t t = 0, worst = 0;
  for (int i = 0; i < 10; ++i) {
    c.BatchStarted(t, 90);
    worst = std::max(worst, c.StalledUs(t + 5 * S));
    c.BatchEnded(t, t + 5 * S, 90);
    t += 5 * S;
  }
  EXPECT_EQ(worst, 5 * S);
}

TEST(StallClock, OneStuckWorkerShowsWhileAnotherKeepsCompleting) {
  StallClock c;
  c.QueueChanged(0, 10);
  c.BatchStarted(0, 9);  // worker A: never ends
  int64_t t = 0;
  for (int i = 0; i < 30; ++i) {  // worker B: a batch a second
    c.BatchStarted(t, 8);
    c.BatchEnded(t, t + S, 8);
    t += S;
  }
  EXPECT_EQ(c.StalledUs(t), t);  // since A's batch started, not since B's last completion
}

TEST(StallClock, TwoBatchesStartedAtTheSameMicrosecondEndOneAtATime) {
  StallClock c;
  c.QueueChanged(0, 2);
  c.BatchStarted(5, 1);
  c.BatchStarted(5, 0);
  c.BatchEnded(5, S, 0);
  EXPECT_EQ(c.Read(2 * S).running, 1);
  EXPECT_EQ(c.StalledUs(2 * S), 2 * S - 5);  // the other still runs
  c.BatchEnded(5, 3 * S, 0);
  EXPECT_EQ(c.StalledUs(4 * S), 0);
}

// ---- the verdict ------------------------------------------------------------------------------------

struct Log {
  std::mutex mu;
  std::vector<std::pair<std::string, bool>> lines;
  LivenessLog sink() {
    return [this](const std::string& line, bool warning) {
      std::lock_guard<std::mutex> lk(mu);
      lines.emplace_back(line, warning);
    };
  }
};

TEST(Liveness, FailsPastTheThresholdAndSaysSoOnceThenRecovers) {
  auto c = std::make_shared<StallClock>();
  Log log;
  Liveness live(c, 2.0, log.sink());
  c->QueueChanged(0, 3);
  c->BatchStarted(0, 2);
  EXPECT_TRUE(live.Check(2 * S));  // at the threshold: still alive
  Stall stall;
  EXPECT_FALSE(live.Check(2 * S + 1, &stall));
  EXPECT_EQ(stall.stalled_us, 2 * S + 1);
  EXPECT_FALSE(live.Check(9 * S));
  ASSERT_EQ(log.lines.size(), 1u);
  EXPECT_TRUE(log.lines[0].second);
  EXPECT_NE(log.lines[0].first.find("no progress for 2.0 s with 2 sequences queued and 1 batches running"),
            std::string::npos)
      << log.lines[0].first;
  EXPECT_NE(log.lines[0].first.find("--liveness-stall-seconds 2)"), std::string::npos) << log.lines[0].first;
  c->BatchEnded(0, 10 * S, 2);
  EXPECT_TRUE(live.Check(10 * S));
  ASSERT_EQ(log.lines.size(), 2u);
  EXPECT_FALSE(log.lines[1].second);
  EXPECT_NE(log.lines[1].first.find("progress again"), std::string::npos);
}

TEST(Liveness, ThresholdZeroNeverFails) {
  auto c = std::make_shared<StallClock>();
  Log log;
  Liveness live(c, 0, log.sink());
  c->QueueChanged(0, 1);
  Stall stall;
  EXPECT_TRUE(live.Check(10'000 * S, &stall));
  EXPECT_EQ(stall.stalled_us, 10'000 * S);
  EXPECT_TRUE(log.lines.empty());
}

TEST(Liveness, TheWatchReportsEachChangeOfVerdict) {
  auto c = std::make_shared<StallClock>();
  Log log;
  Liveness live(c, 1.0, log.sink());
  std::mutex mu;
  std::condition_variable cv;
  std::vector<bool> changes;
  LivenessWatch watch(&live, [&](bool alive) {
    std::lock_guard<std::mutex> lk(mu);
    changes.push_back(alive);
    cv.notify_all();
  }, 10ms);
  c->QueueChanged(StallClock::NowUs() - 60 * S, 1);  // work has waited a minute
  {
    std::unique_lock<std::mutex> lk(mu);
    ASSERT_TRUE(cv.wait_for(lk, 10s, [&] { return changes == std::vector<bool>{false}; }));
  }
  c->QueueChanged(StallClock::NowUs(), 0);
  {
    std::unique_lock<std::mutex> lk(mu);
    ASSERT_TRUE(cv.wait_for(lk, 10s, [&] { return changes == (std::vector<bool>{false, true}); }));
  }
  watch.Stop();
}

// ---- the threshold against the cost model ------------------------------------------------------------

CostTable Table() {
  return CostTable::Make({1, 2, 4, 8, 16, 32}, {16, 64, 256, 512},
                         {{10, 20, 40, 80}, {15, 30, 60, 160}, {20, 40, 120, 320}, {30, 60, 240, 640},
                          {40, 120, 480, 1280}, {60, 240, 960, 2560}});
}

TEST(Liveness, LongestBatchIsTheCostliestShapeTheLimitsAllow) {
  // 8192 tokens: 16 x 512 (1280 us) beats 32 x 256 (960) and 1 x 512 (80).
  const LongestBatch l = LongestBatchOf(Table(), 32, 8192, 512);
  EXPECT_EQ(std::tie(l.us, l.count, l.length), std::make_tuple(int64_t(1280), int64_t(16), int64_t(512)));
  // A tiny token bound still lets one sequence of the full length run alone.
  const LongestBatch one = LongestBatchOf(Table(), 32, 64, 512);
  EXPECT_EQ(std::tie(one.us, one.count, one.length), std::make_tuple(int64_t(80), int64_t(1), int64_t(512)));
}

TEST(Liveness, ThresholdNoteWarnsUnderThreeLongestBatches) {
  const LongestBatch l{5'400'000, 16, 512};
  auto [line, warning] = ThresholdNote(300, l);
  EXPECT_FALSE(warning);
  EXPECT_NE(line.find("5.40 s"), std::string::npos) << line;
  EXPECT_NE(line.find("16 x 512"), std::string::npos) << line;
  std::tie(line, warning) = ThresholdNote(10, l);
  EXPECT_TRUE(warning);
  EXPECT_NE(line.find("--liveness-stall-seconds 10 is under 3 x"), std::string::npos) << line;
  EXPECT_EQ(ThresholdNote(0, l),
            std::make_pair(std::string("rmscore liveness: --liveness-stall-seconds 0: liveness never fails"), false));
  EXPECT_FALSE(ThresholdNote(2, std::nullopt).second);  // no cost table (fifo, length_aware): nothing to compare
}

// ---- the flag -----------------------------------------------------------------------------------------

TEST(Liveness, LivenessStallSecondsDefaultsTo300And0Disables) {
  bool help = false;
  EXPECT_EQ(ParseConfig({}, &help).liveness_stall_seconds, 300);
  EXPECT_EQ(ParseConfig({"--liveness-stall-seconds", "0"}, &help).liveness_stall_seconds, 0);
  for (const std::string bad : {"-1", "2147484"}) {
    try {
      ParseConfig({"--liveness-stall-seconds", bad}, &help);
      ADD_FAILURE() << bad << " was accepted";
    } catch (const ConfigError& e) {
      EXPECT_EQ(std::string(e.what()), "--liveness-stall-seconds: must be >= 0 and <= 2147483, got " + bad);
    }
  }
  EXPECT_THROW(ParseConfig({"--liveness-stall-seconds", "nan"}, &help), ConfigError);
}

// ---- the gauge ----------------------------------------------------------------------------------------

double Stalled(Metrics& m) {
  for (const auto& family : m.Collect()) {
    if (family.name == "rmscore_batcher_stalled_seconds") return family.metric.at(0).gauge.value;
  }
  return -1;
}

TEST(Liveness, TheStalledGaugeIsComputedAtEachScrape) {
  Metrics m("test", "v0");
  EXPECT_EQ(Stalled(m), 0);
  double value = 1.5;
  m.SetStalledSource([&value] { return value; });
  EXPECT_EQ(Stalled(m), 1.5);
  value = 7.25;
  EXPECT_EQ(Stalled(m), 7.25);
}

// ---- the fault-injection hook ---------------------------------------------------------------------------

TEST(Liveness, HangFaultParsesKColonSecondsAndRefusesTheRestQuotingIt) {
  const HangFault f = ParseHangFault("3:2.5");
  EXPECT_EQ(f.batch, 3);
  EXPECT_EQ(f.seconds, 2.5);
  for (const std::string bad : {"4", "0:1", "-1:1", "x:1", "1:0", "1:-2", "1:nan", "1:inf", "1:x", ":1", "1:90000"}) {
    try {
      ParseHangFault(bad);
      ADD_FAILURE() << bad << " was accepted";
    } catch (const ConfigError& e) {
      EXPECT_EQ(std::string(e.what()), std::string(kHangBatchEnv) +
                                           ": must be K:SECONDS (the K-th batch, K >= 1, hangs 0 < SECONDS <= "
                                           "86400), got '" + bad + "'");
    }
  }
}

TEST(Liveness, HangHookBlocksOnlyTheKthBatch) {
  std::vector<double> slept;
  Log log;
  HangHook hook(HangFault{2, 4.0}, [&](double s) { slept.push_back(s); }, log.sink());
  for (int i = 0; i < 4; ++i) hook.BeforeBatch();
  EXPECT_EQ(slept, std::vector<double>{4.0});
  ASSERT_EQ(log.lines.size(), 2u);  // announced at start, and when it fires
  EXPECT_TRUE(log.lines[0].second && log.lines[1].second);
  HangHook quiet(HangFault{}, [&](double s) { slept.push_back(s); }, log.sink());
  quiet.BeforeBatch();
  EXPECT_EQ(slept.size(), 1u);
  EXPECT_EQ(log.lines.size(), 2u);
}

// ---- the batcher tells the clock --------------------------------------------------------------------------

// A one-worker FIFO batcher whose model waits at a promise; the stall clock beside it.
struct Held {
  std::shared_ptr<StallClock> clock = std::make_shared<StallClock>();
  Metrics metrics{"test", "v0"};
  std::promise<void> entered_p, release_p;
  std::shared_future<void> entered = entered_p.get_future().share(), release = release_p.get_future().share();
  std::atomic<bool> fail{false};
  std::atomic<int> runs{0};
  std::unique_ptr<Batcher> batcher;
  std::vector<std::vector<int64_t>> ids;  // owns what the jobs' views point at

  Held() {
    Batcher::Options o;
    o.planner = PlannerConfig{8, 1 << 20, 0, BatchingMode::kFifo};
    o.progress = clock;
    batcher = std::make_unique<Batcher>(o, [this](const PackedBatch& b) {
      if (runs++ == 0) entered_p.set_value();
      if (release.wait_for(10s) != std::future_status::ready) throw std::runtime_error("never released");
      if (fail) throw std::runtime_error("boom");
      return std::vector<float>(size_t(b.batch), 1.0f);
    }, &metrics);
    ids.reserve(16);
  }

  // Submits a job of `n` one-token sequences; the future is its answer.
  std::pair<std::shared_ptr<Job>, std::shared_future<Result>> Submit(int n) {
    auto p = std::make_shared<std::promise<Result>>();
    std::vector<SeqView> views;
    for (int i = 0; i < n; ++i) {
      ids.push_back({int64_t(i + 1)});
      views.push_back(SeqView{ids.back().data(), 1});
    }
    auto job = std::make_shared<Job>(std::move(views), std::nullopt, nullptr, [p](Result&& r) { p->set_value(std::move(r)); });
    EXPECT_TRUE(batcher->Submit(job).ok());
    return {job, p->get_future().share()};
  }
};

class BatcherTellsTheClock : public ::testing::TestWithParam<bool> {};

TEST_P(BatcherTellsTheClock, WhenWorkWaitsRunsAndCompletes) {
  Held h;
  h.fail = GetParam();
  const int64_t far = StallClock::NowUs() + 3600 * S;
  EXPECT_EQ(h.clock->StalledUs(far), 0);
  auto [job, answer] = h.Submit(2);
  ASSERT_EQ(h.entered.wait_for(10s), std::future_status::ready);
  const Stall st = h.clock->Read(far);
  EXPECT_EQ(st.queued, 0);
  EXPECT_EQ(st.running, 1);
  EXPECT_GT(st.stalled_us, 3599 * S);  // running since about now
  h.release_p.set_value();
  ASSERT_EQ(answer.wait_for(10s), std::future_status::ready);
  h.batcher->Stop();
  EXPECT_EQ(h.clock->Read(far), (Stall{0, 0, 0}));
}

INSTANTIATE_TEST_SUITE_P(ScoredOrFailed, BatcherTellsTheClock, ::testing::Values(false, true));

TEST(Liveness, ACancelledQueuedJobLeavesTheClockIdle) {
  Held h;
  auto [first, first_answer] = h.Submit(1);
  ASSERT_EQ(h.entered.wait_for(10s), std::future_status::ready);  // the worker is held: the next job stays queued
  auto [job, answer] = h.Submit(1);
  EXPECT_EQ(h.clock->Read(StallClock::NowUs()).queued, 1);
  h.batcher->Cancel(job);
  EXPECT_EQ(answer.wait_for(0s), std::future_status::ready);
  EXPECT_EQ(h.clock->Read(StallClock::NowUs()).queued, 0);
  h.release_p.set_value();
  ASSERT_EQ(first_answer.wait_for(10s), std::future_status::ready);
  h.batcher->Stop();
  EXPECT_EQ(h.clock->StalledUs(StallClock::NowUs() + 3600 * S), 0);
}

}  // namespace
}  // namespace rmscore
