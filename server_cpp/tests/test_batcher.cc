// The batcher end to end with a deterministic stand-in model (score = first
// id * 1000 + real length, read back from the packed tensors), so the tests
// see exactly which sequences went into which batch. Events are ordered by a
// gate the model waits at, never by sleeping. Each case has a namesake in
// tests/unit/test_batcher.py (the Python batcher), and the other way round.
#include <algorithm>
#include <gtest/gtest.h>

#include <atomic>
#include <future>
#include <mutex>
#include <stdexcept>
#include <thread>

#include "batcher.h"

namespace rmscore {
namespace {

using namespace std::chrono_literals;

// Holds model runs: each run entering waits for one Release (or for Open). Counts the entries.
class Gate {
 public:
  void Enter() {
    std::unique_lock<std::mutex> lk(mu_);
    ++entered_;
    cv_.notify_all();
    cv_.wait(lk, [this] { return open_ || released_ > 0; });
    if (!open_) --released_;
  }
  bool WaitEntered(int n) {
    std::unique_lock<std::mutex> lk(mu_);
    return cv_.wait_for(lk, 10s, [&] { return entered_ >= n; });
  }
  void Release() {
    std::lock_guard<std::mutex> lk(mu_);
    ++released_;
    cv_.notify_all();
  }
  void Open() {
    std::lock_guard<std::mutex> lk(mu_);
    open_ = true;
    cv_.notify_all();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int entered_ = 0, released_ = 0;
  bool open_ = false;
};

// The stand-in model and a FIFO batcher around it.
struct Harness {
  Metrics metrics{"test", "v0"};
  Gate gate;
  bool gated = false;           // set before the first submit
  int64_t fail_on = -1;         // a batch holding a sequence with this first id fails "boom"
  std::chrono::milliseconds sleep{0};  // each run sleeps this long: wall time without CPU, as a preempted run
  std::atomic<bool> aborted{false};
  std::mutex mu;
  std::vector<std::vector<int64_t>> batches;  // the first id of each sequence of each batch the model saw
  std::vector<std::vector<int64_t>> lone_batches;  // those of them that ran on the lone model
  std::unique_ptr<Batcher> batcher;

  // FIFO batching, or cost_aware with `cost`; `workers` model workers, all this stand-in.
  explicit Harness(int64_t max_batch_size, int64_t delay_us = 0, int64_t max_queue = 4096,
                   std::shared_ptr<CostModel> cost = nullptr, int workers = 1, int64_t max_wait_us = 0,
                   double seed = 0, bool lone = false, int64_t lone_hold_us = 1'000'000,
                   std::function<void()> on_idle = nullptr, int64_t idle_release_us = 0,
                   std::function<void(const CostTable&, int64_t)> on_refined = nullptr,
                   bool refine_on_thread_cpu = false) {
    Batcher::Options o;
    o.planner = PlannerConfig{max_batch_size, 1 << 20, delay_us, cost ? BatchingMode::kCostAware : BatchingMode::kFifo};
    o.max_queue_sequences = max_queue;
    o.pad_token_id = 0;
    o.cost = std::move(cost);
    o.max_queue_wait_us = max_wait_us;
    o.seed_us_per_token = seed;
    o.lone_hold_us = lone_hold_us;
    o.on_idle = std::move(on_idle);
    o.idle_release_us = idle_release_us;
    o.on_refined = std::move(on_refined);
    o.refine_on_thread_cpu = refine_on_thread_cpu;
    const std::vector<BatchModel> models(size_t(workers), [this](const PackedBatch& b) { return Model(b); });
    BatchModel lone_model;
    if (lone) {
      lone_model = [this](const PackedBatch& b) {
        {
          std::lock_guard<std::mutex> lk(mu);
          std::vector<int64_t> firsts;
          for (int64_t r = 0; r < b.batch; ++r) firsts.push_back(b.input_ids[size_t(r * b.longest)]);
          lone_batches.push_back(firsts);
        }
        return Model(b);
      };
    }
    batcher = std::make_unique<Batcher>(
        o, models, &metrics,
        [this] {
          aborted = true;
          gate.Open();
        },
        lone_model);
  }

  std::vector<std::vector<int64_t>> LoneBatches() {
    std::lock_guard<std::mutex> lk(mu);
    return lone_batches;
  }

  std::vector<float> Model(const PackedBatch& b) {
    std::vector<int64_t> firsts;
    std::vector<float> scores;
    for (int64_t r = 0; r < b.batch; ++r) {
      int64_t len = 0;
      for (int64_t c = 0; c < b.longest; ++c) len += b.attention_mask[size_t(r * b.longest + c)];
      firsts.push_back(b.input_ids[size_t(r * b.longest)]);
      scores.push_back(float(firsts.back() * 1000 + len));
    }
    {
      std::lock_guard<std::mutex> lk(mu);
      batches.push_back(firsts);
    }
    if (gated) gate.Enter();
    if (aborted) throw std::runtime_error("terminated");
    for (int64_t f : firsts) {
      if (f == fail_on) throw std::runtime_error("boom");
    }
    std::this_thread::sleep_for(sleep);
    return scores;
  }

  std::vector<std::vector<int64_t>> Batches() {
    std::lock_guard<std::mutex> lk(mu);
    return batches;
  }

  // One series' value as a scrape would read it (a histogram: its count); `label` picks among labelled series.
  double Read(const std::string& name, const std::string& label = "") {
    for (const auto& family : metrics.registry().Collect()) {
      if (family.name != name) continue;
      for (const auto& m : family.metric) {
        bool match = label.empty();
        for (const auto& l : m.label) match = match || l.value == label;
        if (!match) continue;
        if (family.type == prometheus::MetricType::Gauge) return m.gauge.value;
        return family.type == prometheus::MetricType::Histogram ? double(m.histogram.sample_count) : m.counter.value;
      }
    }
    return -1;
  }
};

// A job, the future of its one answer, and how many answers it got.
struct Submitted {
  std::vector<std::vector<int64_t>> ids;  // owns the token ids the views point at
  std::shared_ptr<std::promise<Result>> promise = std::make_shared<std::promise<Result>>();
  std::shared_ptr<std::atomic<int>> calls = std::make_shared<std::atomic<int>>(0);
  std::future<Result> result = promise->get_future();
  std::shared_ptr<Job> job;
  grpc::Status admitted;
};

std::unique_ptr<Submitted> NewJob(std::vector<std::vector<int64_t>> ids,
                                  std::optional<Clock::time_point> deadline = std::nullopt,
                                  const std::string& caller = "") {
  auto s = std::make_unique<Submitted>();
  s->ids = std::move(ids);
  std::vector<SeqView> views;
  for (const auto& v : s->ids) views.push_back(SeqView{v.data(), int64_t(v.size())});
  auto promise = s->promise;
  auto calls = s->calls;
  s->job = std::make_shared<Job>(std::move(views), deadline, nullptr, [promise, calls](Result&& r) {
    if (calls->fetch_add(1) == 0) promise->set_value(std::move(r));
  }, caller);
  return s;
}

std::unique_ptr<Submitted> Submit(Batcher& b, std::vector<std::vector<int64_t>> ids,
                                  std::optional<Clock::time_point> deadline = std::nullopt,
                                  const std::string& caller = "") {
  auto s = NewJob(std::move(ids), deadline, caller);
  s->admitted = b.Submit(s->job);
  return s;
}

Result Get(Submitted& s) {
  EXPECT_EQ(s.result.wait_for(10s), std::future_status::ready);
  return s.result.get();
}

using Batches = std::vector<std::vector<int64_t>>;

// Mirrors test_an_idle_batcher_holds_nothing_of_the_jobs_it_answered: once answered (scored or
// failed), a job, and through its keepalive the request it views, is held by no batcher thread waiting
// for the next batch. (The Python batcher's thread kept its last batch while idle.)
TEST(Batcher, AnIdleBatcherHoldsNothingOfTheJobsItAnswered) {
  Harness h(/*max_batch_size=*/2);
  h.fail_on = 7;
  std::vector<std::weak_ptr<const void>> requests;
  std::vector<std::weak_ptr<Job>> jobs;
  for (auto ids : {std::vector<std::vector<int64_t>>{{1, 1}, {2}}, std::vector<std::vector<int64_t>>{{7}, {8, 8}, {9}}}) {
    auto s = std::make_unique<Submitted>();
    s->ids = std::move(ids);
    std::vector<SeqView> views;
    for (const auto& v : s->ids) views.push_back(SeqView{v.data(), int64_t(v.size())});
    auto request = std::make_shared<int>(0);
    requests.push_back(request);
    auto promise = s->promise;
    s->job = std::make_shared<Job>(std::move(views), std::nullopt, std::move(request),
                                   [promise](Result&& r) { promise->set_value(std::move(r)); });
    ASSERT_TRUE(h.batcher->Submit(s->job).ok());
    Get(*s);
    jobs.push_back(s->job);
  }
  const auto until = Clock::now() + 5s;
  auto all_gone = [&] {
    for (const auto& r : requests) if (!r.expired()) return false;
    for (const auto& j : jobs) if (!j.expired()) return false;
    return true;
  };
  while (!all_gone() && Clock::now() < until) std::this_thread::sleep_for(10ms);
  EXPECT_TRUE(all_gone()) << "an idle batcher still holds an answered job or its request";
}

TEST(Batcher, SplitsRequestsOverBatchesAndAnswersInRequestOrder) {
  Harness h(/*max_batch_size=*/2);
  auto a = Submit(*h.batcher, {{1, 1, 1}, {2}, {3, 3}, {4, 4, 4, 4}, {5}});
  auto b = Submit(*h.batcher, {{6, 6}});
  ASSERT_TRUE(a->admitted.ok());
  Result ra = Get(*a), rb = Get(*b);
  ASSERT_TRUE(ra.status.ok()) << ra.status.error_message();
  EXPECT_EQ(ra.scores, (std::vector<float>{1003, 2001, 3002, 4004, 5001}));
  EXPECT_EQ(rb.scores, (std::vector<float>{6002}));
  EXPECT_GT(ra.inference_ms, 0);
  EXPECT_GE(ra.total_ms, ra.inference_ms);
  size_t total = 0;
  for (const auto& batch : h.Batches()) {
    EXPECT_LE(batch.size(), 2u);
    total += batch.size();
  }
  EXPECT_EQ(total, 6u);
  h.batcher->Stop();
  EXPECT_EQ(*a->calls, 1);
  EXPECT_EQ(*b->calls, 1);
}

TEST(Batcher, JoinsSequencesOfSeveralRequestsIntoOneBatch) {
  // A one-minute delay: only a full batch runs. Four sequences of three requests fill it; a fifth
  // that does not fit is what makes it full, and waits.
  Harness h(/*max_batch_size=*/4, /*delay_us=*/60'000'000);
  auto a = Submit(*h.batcher, {{1}});
  auto b = Submit(*h.batcher, {{2}, {2, 2}});
  auto c = Submit(*h.batcher, {{3}});
  auto d = Submit(*h.batcher, {{4}});
  EXPECT_EQ(Get(*a).scores, std::vector<float>{1001});
  EXPECT_EQ(Get(*b).scores, (std::vector<float>{2001, 2002}));
  EXPECT_EQ(Get(*c).scores, std::vector<float>{3001});
  EXPECT_EQ(h.Batches(), (Batches{{1, 2, 2, 3}}));
  h.batcher->Stop();
  EXPECT_EQ(Get(*d).status.error_code(), grpc::StatusCode::UNAVAILABLE);
}

TEST(Batcher, ArrivalsDuringARunJoinTheNextBatch) {
  // Zero delay: an idle batcher runs whatever waits. While the model holds the first batch,
  // three requests arrive; they wait together and run as one batch after it.
  Harness h(/*max_batch_size=*/8);
  h.gated = true;
  auto first = Submit(*h.batcher, {{1}});
  ASSERT_TRUE(h.gate.WaitEntered(1));
  auto a = Submit(*h.batcher, {{2}});
  auto b = Submit(*h.batcher, {{3}, {3, 3}});
  auto c = Submit(*h.batcher, {{4}});
  h.gate.Open();
  EXPECT_EQ(Get(*first).scores, std::vector<float>{1001});
  EXPECT_EQ(Get(*a).scores, std::vector<float>{2001});
  EXPECT_EQ(Get(*b).scores, (std::vector<float>{3001, 3002}));
  EXPECT_EQ(Get(*c).scores, std::vector<float>{4001});
  EXPECT_EQ(h.Batches(), (Batches{{1}, {2, 3, 3, 4}}));
}

TEST(Batcher, AFailingBatchFailsItsRequestsAndServingGoesOn) {
  Harness h(/*max_batch_size=*/1);
  h.fail_on = 66;
  auto bad = Submit(*h.batcher, {{1}, {66}, {2}, {3}});
  Result r = Get(*bad);
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::INTERNAL);
  EXPECT_EQ(r.status.error_message(), "batch failed: boom");
  auto good = Submit(*h.batcher, {{7}});
  EXPECT_EQ(Get(*good).scores, std::vector<float>{7001});
  // The failed request's sequences still queued never reached the model.
  EXPECT_EQ(h.Batches(), (Batches{{1}, {66}, {7}}));
  h.batcher->Stop();
  EXPECT_EQ(*bad->calls, 1);
}

TEST(Batcher, AFailedBatchCountsInTheBatchMetricsNotInScored) {
  Harness h(/*max_batch_size=*/2);
  h.fail_on = 66;
  EXPECT_EQ(Get(*Submit(*h.batcher, {{66}})).status.error_code(), grpc::StatusCode::INTERNAL);
  EXPECT_TRUE(Get(*Submit(*h.batcher, {{1}, {2}})).status.ok());
  EXPECT_EQ(h.Read("rmscore_batch_size"), 2);
  EXPECT_EQ(h.Read("rmscore_batch_inference_seconds"), 2);
  EXPECT_EQ(h.Read("rmscore_batch_padding_ratio"), 2);
  EXPECT_EQ(h.Read("rmscore_sequences_scored_total"), 2);  // only the batch that succeeded
  EXPECT_EQ(h.Read("rmscore_queue_wait_seconds"), 3);      // every sequence taken into a batch
}

TEST(Batcher, QueueFullIsRefusedAtOnceWithTheContractMessage) {
  Harness h(/*max_batch_size=*/64, /*delay_us=*/60'000'000, /*max_queue=*/3);
  auto a = Submit(*h.batcher, {{1}, {2}});
  ASSERT_TRUE(a->admitted.ok());
  auto b = Submit(*h.batcher, {{3}, {4}});
  EXPECT_EQ(b->admitted.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(b->admitted.error_message(), "queue full: 2 sequences waiting + 2 requested exceed max_queue_sequences 3");
  h.batcher->Cancel(b->job);  // a refused job is never answered, even when its caller then cancels
  h.batcher->Stop();          // the waiting one fails once
  EXPECT_EQ(Get(*a).status.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(*b->calls, 0);
}

TEST(Batcher, QueuedWorkPastTheBoundOrTheDeadlineIsRefusedAtOnce) {
  // A seeded rate (100 us per token) and the model held at the gate: the work queued is known exactly.
  Harness h(/*max_batch_size=*/1, /*delay_us=*/0, /*max_queue=*/4096, nullptr, /*workers=*/1,
            /*max_wait_us=*/1'000'000, /*seed=*/100.0);
  h.gated = true;
  auto running = Submit(*h.batcher, {std::vector<int64_t>(10, 1)});
  ASSERT_TRUE(h.gate.WaitEntered(1));  // in the model: 1 ms of work until it ends
  auto queued = Submit(*h.batcher, {std::vector<int64_t>(5000, 2)});  // 0.501 s of work ahead of whoever comes next
  EXPECT_EQ(h.Read("rmscore_queue_expected_wait_seconds"), 0.501);
  auto late = Submit(*h.batcher, {{3}}, Clock::now() + 200ms);
  EXPECT_EQ(late->admitted.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  EXPECT_EQ(late->admitted.error_message().rfind(
                "deadline exceeded before scoring: about 501 ms of model work waiting and up to 0 ms for its own batch, ", 0), 0u)
      << late->admitted.error_message();
  // What a call asks before reading its request: the same refusals, without its size.
  EXPECT_TRUE(h.batcher->WorkRefusal(Clock::now() + 30s).ok());
  EXPECT_EQ(h.batcher->WorkRefusal(Clock::now() + 200ms).error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  auto fine = Submit(*h.batcher, {{4}}, Clock::now() + 30s);
  auto more = Submit(*h.batcher, {std::vector<int64_t>(6000, 5)});  // 0.5011 s ahead of it: within the bound
  EXPECT_TRUE(fine->admitted.ok());
  EXPECT_TRUE(more->admitted.ok());
  auto over = Submit(*h.batcher, {{6}});  // 1.1011 s ahead of it
  EXPECT_EQ(over->admitted.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(over->admitted.error_message(),
            "queue full: about 1101 ms of model work waiting exceeds max_queue_wait_seconds (1000 ms)");
  EXPECT_EQ(h.batcher->WorkRefusal(std::nullopt).error_message(), over->admitted.error_message());
  h.gate.Open();
  EXPECT_EQ(Get(*running).scores, std::vector<float>{1010});
  EXPECT_EQ(Get(*queued).scores, std::vector<float>{7000});
  EXPECT_EQ(Get(*fine).scores, std::vector<float>{4001});
  EXPECT_EQ(Get(*more).scores, std::vector<float>{11000});
  EXPECT_EQ(*late->calls, 0);
  EXPECT_EQ(*over->calls, 0);
  EXPECT_EQ(h.Read("rmscore_queue_expected_wait_seconds"), 0);  // the queue is empty again
}

TEST(Batcher, AShortDeadlineIsBatchedOnlyWithWhatEndsBeforeIt) {
  // Seeded at 1000 us per token: a 4-token request due in 2 s, then fifteen 512-token ones. Without the
  // cap it rode in one batch of 16 x 512 (8.2 s by the rate) and waited out its deadline inside it.
  Harness h(/*max_batch_size=*/16, /*delay_us=*/60'000'000, /*max_queue=*/4096, nullptr, /*workers=*/1,
            /*max_wait_us=*/0, /*seed=*/1000.0);
  auto probe = Submit(*h.batcher, {std::vector<int64_t>(4, 1)}, Clock::now() + 2s);
  auto flood = Submit(*h.batcher, std::vector<std::vector<int64_t>>(15, std::vector<int64_t>(512, 2)));
  ASSERT_TRUE(probe->admitted.ok());
  ASSERT_TRUE(flood->admitted.ok());
  EXPECT_EQ(Get(*probe).scores, std::vector<float>{1004});  // scored in time
  // 3 x 512 x 1 ms = 1.5 s fits before the deadline; a fourth would not.
  EXPECT_EQ(h.Batches().at(0), (std::vector<int64_t>{1, 2, 2}));
}

TEST(Batcher, ExpiredSequencesNeverReachTheModel) {
  Harness h(/*max_batch_size=*/8);
  auto late = Submit(*h.batcher, {{1}, {2}}, Clock::now() - 1ms);
  Result r = Get(*late);
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  EXPECT_EQ(r.status.error_message(), "deadline exceeded before scoring");
  EXPECT_TRUE(h.Batches().empty());
  EXPECT_EQ(h.Read("rmscore_sequences_dropped_total", "deadline"), 2);
}

TEST(Batcher, CancelledSequencesAreDroppedBeforeTheModel) {
  Harness h(/*max_batch_size=*/8, /*delay_us=*/60'000'000);
  auto s = Submit(*h.batcher, {{1}, {2}});
  h.batcher->Cancel(s->job);
  Result r = Get(*s);
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::CANCELLED);
  EXPECT_EQ(r.status.error_message(), "cancelled by the client");
  EXPECT_TRUE(h.Batches().empty());
  EXPECT_EQ(h.Read("rmscore_sequences_dropped_total", "cancelled"), 2);
}

TEST(Batcher, CancelWhileInTheModelAnswersAtOnceAndDropsTheRest) {
  Harness h(/*max_batch_size=*/1);
  h.gated = true;
  auto s = Submit(*h.batcher, {{1}, {2}, {3}});
  ASSERT_TRUE(h.gate.WaitEntered(1));
  h.batcher->Cancel(s->job);  // answered now, with its first sequence still in the model
  EXPECT_EQ(Get(*s).status.error_code(), grpc::StatusCode::CANCELLED);
  h.gate.Open();
  EXPECT_TRUE(Get(*Submit(*h.batcher, {{4}})).status.ok());
  EXPECT_EQ(h.Batches(), (Batches{{1}, {4}}));
  EXPECT_EQ(h.Read("rmscore_sequences_dropped_total", "cancelled"), 2);
  h.batcher->Stop();
  EXPECT_EQ(*s->calls, 1);
}

TEST(Batcher, CancelBeforeSubmitRefusesTheJob) {
  // A stream item can be cancelled between its reactor registering it and submitting it.
  Harness h(/*max_batch_size=*/8);
  auto s = NewJob({{1}});
  h.batcher->Cancel(s->job);
  const grpc::Status admitted = h.batcher->Submit(s->job);
  EXPECT_EQ(admitted.error_code(), grpc::StatusCode::CANCELLED);
  EXPECT_EQ(admitted.error_message(), "cancelled by the client");
  EXPECT_TRUE(h.batcher->Drain(Clock::now() + 10s));  // nothing was accepted
  EXPECT_EQ(*s->calls, 0);
}

TEST(Batcher, DrainFinishesAcceptedWorkThenRefuses) {
  Harness h(/*max_batch_size=*/2);
  h.gated = true;
  auto a = Submit(*h.batcher, {{1}, {2}, {3}});
  ASSERT_TRUE(h.gate.WaitEntered(1));
  EXPECT_FALSE(h.batcher->Drain(Clock::now() + 50ms));  // a batch is held in the model
  auto late = Submit(*h.batcher, {{4}});
  EXPECT_EQ(late->admitted.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(late->admitted.error_message(), "not ready: draining");
  h.gate.Open();
  EXPECT_TRUE(h.batcher->Drain(Clock::now() + 10s));
  ASSERT_EQ(a->result.wait_for(0s), std::future_status::ready);  // answered before Drain returned
  EXPECT_EQ(a->result.get().scores, (std::vector<float>{1001, 2001, 3001}));
  EXPECT_EQ(*late->calls, 0);
}

TEST(Batcher, StopAbortsTheRunningBatchAndFailsTheRestOnce) {
  Harness h(/*max_batch_size=*/1);
  h.gated = true;  // a model run that only ends when released or aborted
  auto running = Submit(*h.batcher, {{1}});
  ASSERT_TRUE(h.gate.WaitEntered(1));
  auto queued = Submit(*h.batcher, {{2}, {3}});
  h.batcher->Stop();
  // The aborted run is the drain's refusal, not a model fault: UNAVAILABLE, never INTERNAL.
  Result r = Get(*running);
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(r.status.error_message(), "not ready: draining");
  Result q = Get(*queued);
  EXPECT_EQ(q.status.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(q.status.error_message(), "not ready: draining");
  EXPECT_EQ(*running->calls, 1);
  EXPECT_EQ(*queued->calls, 1);
  EXPECT_EQ(h.Batches(), (Batches{{1}}));
}

TEST(Batcher, StopWithoutAbortLetsTheRunningBatchFinish) {
  // The Python servers' torch backend cannot abort a run: Stop fails the queue, then waits for it.
  Metrics metrics("test", "v0");
  Gate gate;
  Batcher::Options o;
  o.planner = PlannerConfig{1, 1 << 20, 0, BatchingMode::kFifo};
  Batcher batcher(o, [&](const PackedBatch& b) {
    gate.Enter();
    return std::vector<float>(size_t(b.batch), 0.5f);
  }, &metrics);
  auto running = Submit(batcher, {{1}});
  ASSERT_TRUE(gate.WaitEntered(1));
  auto queued = Submit(batcher, {{2}});
  std::thread stopper([&] { batcher.Stop(); });
  EXPECT_EQ(Get(*queued).status.error_code(), grpc::StatusCode::UNAVAILABLE);  // failed before the join
  gate.Release();
  stopper.join();
  Result r = Get(*running);
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_EQ(r.scores, std::vector<float>{0.5f});
}

class BatcherWorkers : public testing::TestWithParam<int> {};

TEST_P(BatcherWorkers, ManyConcurrentSubmittersEachAnsweredOnce) {
  Harness h(/*max_batch_size=*/5, /*delay_us=*/500, 4096, nullptr, /*workers=*/GetParam());
  std::vector<std::unique_ptr<Submitted>> all;
  std::mutex all_mu;
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 50; ++i) {
        auto s = Submit(*h.batcher, {{t + 1, i}, {i + 1}});
        std::lock_guard<std::mutex> lk(all_mu);
        all.push_back(std::move(s));
      }
    });
  }
  for (auto& th : threads) th.join();
  for (auto& s : all) {
    Result r = Get(*s);
    ASSERT_TRUE(r.status.ok());
    EXPECT_EQ(r.scores, (std::vector<float>{float(s->ids[0][0] * 1000 + 2), float(s->ids[1][0] * 1000 + 1)}));
  }
  h.batcher->Stop();
  for (auto& s : all) EXPECT_EQ(*s->calls, 1);
}

INSTANTIATE_TEST_SUITE_P(OneAndTwo, BatcherWorkers, testing::Values(1, 2));

// The CPU-like and GPU-like tables of contract/make_batching_vectors.py on a smaller grid (the Python
// tests' CPU_LIKE, GPU_LIKE), injected, in milliseconds where those say microseconds: every run refines
// the table with its measured time, and at microseconds one slow run (the gated one, or any run
// preempted on a busy machine) could tip the CPU-like decision to batches of 2. Seconds cannot.
std::shared_ptr<CostModel> Costs(int64_t (*fn)(int64_t b, int64_t n)) {
  const std::vector<int64_t> sizes = {1, 2, 4, 8}, lengths = {16, 128};
  std::vector<std::vector<int64_t>> rows;
  for (int64_t b : sizes) {
    rows.emplace_back();
    for (int64_t n : lengths) rows.back().push_back(fn(b, n));
  }
  return std::make_shared<CostModel>(CostTable::Make(sizes, lengths, rows));
}
int64_t CpuLike(int64_t b, int64_t n) { return 1000 * (300 + 12 * b * n * (4 + b) / 4); }
using Batches = std::vector<std::vector<int64_t>>;
int64_t GpuLike(int64_t b, int64_t n) { return 1000 * (5000 + 2 * b * n); }
std::vector<int64_t> Tokens(int64_t id, int64_t n) { return std::vector<int64_t>(size_t(n), id); }

TEST(Batcher, CostAwareWithACpuLikeTableRunsSequencesOneAtATime) {
  // While the model holds the first batch four requests arrive; where one sequence per run is
  // cheapest per sequence, they run one by one rather than as the one batch fifo would make.
  Harness h(/*max_batch_size=*/8, /*delay_us=*/0, 4096, Costs(CpuLike));
  h.gated = true;
  auto first = Submit(*h.batcher, {Tokens(1, 100)});
  ASSERT_TRUE(h.gate.WaitEntered(1));
  std::vector<std::unique_ptr<Submitted>> rest;
  for (int64_t k : {2, 3, 4, 5}) rest.push_back(Submit(*h.batcher, {Tokens(k, 100)}));
  h.gate.Open();
  EXPECT_EQ(Get(*first).scores, std::vector<float>{1100});
  for (int64_t k = 2; k <= 5; ++k) EXPECT_EQ(Get(*rest[size_t(k - 2)]).scores, std::vector<float>{float(k * 1000 + 100)});
  EXPECT_EQ(h.Batches(), (Batches{{1}, {2}, {3}, {4}, {5}}));
}

TEST(Batcher, CostAwareWithAGpuLikeTableWaitsToFillTheBatch) {
  // A one-minute delay: three sequences wait for a fourth, since four at once cost little more
  // than one; the fourth makes the best batch and it runs at once.
  Harness h(/*max_batch_size=*/4, /*delay_us=*/60'000'000, 4096, Costs(GpuLike));
  std::vector<std::unique_ptr<Submitted>> jobs;
  for (int64_t k : {1, 2, 3, 4}) jobs.push_back(Submit(*h.batcher, {Tokens(k, 100)}));
  for (int64_t k = 1; k <= 4; ++k) EXPECT_EQ(Get(*jobs[size_t(k - 1)]).scores, std::vector<float>{float(k * 1000 + 100)});
  EXPECT_EQ(h.Batches(), (Batches{{1, 2, 3, 4}}));
}

TEST(Batcher, CostAwareRefinesItsTableFromTheBatchesItRuns) {
  auto cost = Costs(CpuLike);
  Harness h(/*max_batch_size=*/8, /*delay_us=*/0, 4096, cost);
  h.fail_on = 66;
  const int64_t before = cost->table().BatchUs(1, 16);
  for (int64_t k = 1; k <= 5; ++k) EXPECT_EQ(Get(*Submit(*h.batcher, {Tokens(k, 16)})).scores, std::vector<float>{float(k * 1000 + 16)});
  EXPECT_EQ(Get(*Submit(*h.batcher, {{66}})).status.error_code(), grpc::StatusCode::INTERNAL);
  h.batcher->Stop();  // the batcher threads have ended: the model may be read without its lock
  // The stand-in model takes microseconds, the table said 300+ ms: each run pulled the cell down. The
  // failed run is no measurement.
  EXPECT_EQ(cost->observed(), 5);
  EXPECT_LT(cost->table().BatchUs(1, 16), before);
}

TEST(Batcher, TheTableIsRefinedByTheRunsThreadCpuWhereTold) {
  // Each run sleeps 30 ms, as a run whose core other processes took: 30 ms of wall clock, next to no CPU.
  // By the wall clock the cell rises toward 30 ms; by the thread's CPU time it falls (the table said 1 ms).
  // tests/unit/test_batcher.py holds Python's batcher to the same.
  for (bool on_thread_cpu : {false, true}) {
    std::vector<std::vector<int64_t>> rows;
    for (int64_t b : {1, 2, 4, 8}) rows.emplace_back(4, 1000 * b);
    auto cost = std::make_shared<CostModel>(CostTable::Make({1, 2, 4, 8}, {16, 32, 64, 128}, rows));
    Harness h(/*max_batch_size=*/8, /*delay_us=*/0, 4096, cost, 1, 0, 0, false, 1'000'000, nullptr, 0, nullptr,
              on_thread_cpu);
    h.sleep = std::chrono::milliseconds(30);
    const int64_t before = cost->table().BatchUs(1, 16);
    for (int64_t k = 1; k <= 3; ++k) EXPECT_EQ(Get(*Submit(*h.batcher, {Tokens(k, 16)})).scores, std::vector<float>{float(k * 1000 + 16)});
    h.batcher->Stop();
    EXPECT_EQ(cost->observed(), 3);
    if (on_thread_cpu) {
      EXPECT_LT(cost->table().BatchUs(1, 16), before);
    } else {
      EXPECT_GT(cost->table().BatchUs(1, 16), before + 5000);
    }
  }
}

TEST(Batcher, TwoModelWorkersRunTwoBatchesAtOnce) {
  Harness h(/*max_batch_size=*/1, /*delay_us=*/0, 4096, nullptr, /*workers=*/2);
  h.gated = true;
  auto a = Submit(*h.batcher, {{1}});
  auto b = Submit(*h.batcher, {{2}});
  ASSERT_TRUE(h.gate.WaitEntered(2));  // both in the model together: one worker could never get here
  h.gate.Open();
  EXPECT_EQ(Get(*a).scores, std::vector<float>{1001});
  EXPECT_EQ(Get(*b).scores, std::vector<float>{2001});
}

TEST(Batcher, StopAbortsTheRunsOfEveryWorker) {
  Harness h(/*max_batch_size=*/1, /*delay_us=*/0, 4096, nullptr, /*workers=*/2);
  h.gated = true;
  auto a = Submit(*h.batcher, {{1}});
  auto b = Submit(*h.batcher, {{2}});
  ASSERT_TRUE(h.gate.WaitEntered(2));
  auto queued = Submit(*h.batcher, {{3}});
  h.batcher->Stop();
  // The aborted runs are the drain's refusal, as in StopAbortsTheRunningBatch: UNAVAILABLE draining.
  EXPECT_EQ(Get(*a).status.error_message(), "not ready: draining");
  EXPECT_EQ(Get(*b).status.error_message(), "not ready: draining");
  EXPECT_EQ(Get(*queued).status.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(*a->calls + *b->calls + *queued->calls, 3);
}

TEST(Batcher, ABatchAloneRunsOnTheLoneModelAndOneBesideItOnItsWorker) {
  Harness h(/*max_batch_size=*/1, /*delay_us=*/0, 4096, nullptr, /*workers=*/2, 0, 0, /*lone=*/true);
  h.gated = true;
  auto a = Submit(*h.batcher, {{1}});
  ASSERT_TRUE(h.gate.WaitEntered(1));  // alone: every thread
  auto b = Submit(*h.batcher, {{2}});
  ASSERT_TRUE(h.gate.WaitEntered(2));  // beside it: its worker's session
  auto c = Submit(*h.batcher, {{3}});  // waits for a worker
  h.gate.Open();
  EXPECT_EQ(Get(*a).scores, std::vector<float>{1001});
  EXPECT_EQ(Get(*b).scores, std::vector<float>{2001});
  EXPECT_EQ(Get(*c).scores, std::vector<float>{3001});
  // Batches ran at once, so the one left waiting ran on its worker's session. Whether the next one
  // alone does depends on which of them ended last (the lone one, overlapped, holds); a batch that
  // ends alone, showing no other work, gives every thread back to the one after it.
  EXPECT_EQ(Get(*Submit(*h.batcher, {{4}})).scores, std::vector<float>{4001});
  EXPECT_EQ(Get(*Submit(*h.batcher, {{5}})).scores, std::vector<float>{5001});
  EXPECT_EQ(h.Batches(), (Batches{{1}, {2}, {3}, {4}, {5}}));
  const Batches lone = h.LoneBatches();
  EXPECT_TRUE(lone == (Batches{{1}, {5}}) || lone == (Batches{{1}, {4}, {5}})) << lone.size();
}

TEST(Batcher, WorkArrivingWhileALoneBatchRunsHoldsLoneBatches) {
  // One worker: the second request waits for the lone batch (nothing runs beside it), and still shows
  // a load of more than one request at a time.
  Harness h(/*max_batch_size=*/1, /*delay_us=*/0, 4096, nullptr, /*workers=*/1, 0, 0, /*lone=*/true);
  h.gated = true;
  auto a = Submit(*h.batcher, {{1}});
  ASSERT_TRUE(h.gate.WaitEntered(1));
  auto b = Submit(*h.batcher, {{2}});
  h.gate.Open();
  EXPECT_EQ(Get(*a).scores, std::vector<float>{1001});
  EXPECT_EQ(Get(*b).scores, std::vector<float>{2001});
  EXPECT_EQ(Get(*Submit(*h.batcher, {{3}})).scores, std::vector<float>{3001});  // [2] ended alone
  EXPECT_EQ(h.LoneBatches(), (Batches{{1}, {3}}));  // the one left waiting ran on the worker
}

// [9] alone (every thread), [1] and [2] queued behind it: one batch of two requests after it.
void SeveralAfterALoneOne(Harness& h) {
  h.gated = true;
  auto blocker = Submit(*h.batcher, {{9}});
  ASSERT_TRUE(h.gate.WaitEntered(1));
  auto a = Submit(*h.batcher, {{1}});
  auto b = Submit(*h.batcher, {{2}});
  h.gate.Open();
  EXPECT_EQ(Get(*blocker).scores, std::vector<float>{9001});
  EXPECT_EQ(Get(*a).scores, std::vector<float>{1001});
  EXPECT_EQ(Get(*b).scores, std::vector<float>{2001});
}

TEST(Batcher, ABatchOfSeveralRequestsHoldsLoneBatches) {
  Harness h(/*max_batch_size=*/8, /*delay_us=*/0, 4096, nullptr, /*workers=*/1, 0, 0, /*lone=*/true);
  SeveralAfterALoneOne(h);
  EXPECT_EQ(Get(*Submit(*h.batcher, {{3}})).scores, std::vector<float>{3001});  // held: [1, 2] were two at once
  EXPECT_EQ(Get(*Submit(*h.batcher, {{4}})).scores, std::vector<float>{4001});  // [3] ended alone
  EXPECT_EQ(h.Batches(), (Batches{{9}, {1, 2}, {3}, {4}}));
  EXPECT_EQ(h.LoneBatches(), (Batches{{9}, {4}}));
}

TEST(Batcher, TheHoldEndsOnItsOwnAfterLoneHoldUs) {
  Harness h(/*max_batch_size=*/8, /*delay_us=*/0, 4096, nullptr, /*workers=*/1, 0, 0, /*lone=*/true,
            /*lone_hold_us=*/200'000);
  SeveralAfterALoneOne(h);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // no batch ended meanwhile
  EXPECT_EQ(Get(*Submit(*h.batcher, {{3}})).scores, std::vector<float>{3001});
  EXPECT_EQ(h.LoneBatches(), (Batches{{9}, {3}}));
}

TEST(Batcher, ABatchThatLeavesWorkWaitingRunsOnItsWorker) {
  // Two sequences, batches of one: the first leaves the second waiting for the other worker, so
  // neither takes every thread.
  Harness h(/*max_batch_size=*/1, /*delay_us=*/0, 4096, nullptr, /*workers=*/2, 0, 0, /*lone=*/true);
  h.gated = true;
  auto a = Submit(*h.batcher, {{1}, {2}});
  ASSERT_TRUE(h.gate.WaitEntered(2));
  h.gate.Open();
  EXPECT_EQ(Get(*a).scores, (std::vector<float>{1001, 2001}));
  Batches seen = h.Batches();
  std::sort(seen.begin(), seen.end());
  EXPECT_EQ(seen, (Batches{{1}, {2}}));
  EXPECT_EQ(h.LoneBatches(), Batches{});
}

TEST(Batcher, LoneRunsDoNotRefineTheCostTable) {
  // The table describes the workers' sessions, where batches run under load.
  auto cost = Costs(CpuLike);
  Harness h(/*max_batch_size=*/8, /*delay_us=*/0, 4096, cost, /*workers=*/2, 0, 0, /*lone=*/true);
  for (int64_t k = 1; k <= 3; ++k) {
    EXPECT_EQ(Get(*Submit(*h.batcher, {Tokens(k, 16)})).scores, std::vector<float>{float(k * 1000 + 16)});
  }
  h.batcher->Stop();
  EXPECT_EQ(h.LoneBatches(), (Batches{{1}, {2}, {3}}));
  EXPECT_EQ(cost->observed(), 0);
}

// The runtime gives back memory grown for large batches when the batcher goes idle (model_runner.h
// ReleaseMemory): not while work waits, where the next batch would grow it again. test_batcher.py holds
// the same cases.
struct IdleCalls {
  std::mutex mu;
  std::vector<size_t> seen;  // batches the model had seen at each on_idle call
  Harness* h = nullptr;
  std::function<void()> Hook() {
    return [this] {
      std::lock_guard<std::mutex> lk(h->mu);
      std::lock_guard<std::mutex> lk2(mu);
      seen.push_back(h->batches.size());
    };
  }
  std::vector<size_t> Seen() {
    std::lock_guard<std::mutex> lk(mu);
    return seen;
  }
  std::vector<size_t> AfterFirst() {  // waits up to 5 s for a call
    for (int i = 0; i < 500 && Seen().empty(); ++i) std::this_thread::sleep_for(10ms);
    return Seen();
  }
};

TEST(Batcher, OnIdleRunsOnceWhenABurstEndsNotBetweenItsBatches) {
  IdleCalls calls;
  Harness h(/*max_batch_size=*/1, 0, 4096, nullptr, 1, 0, 0, false, 1'000'000, calls.Hook());
  calls.h = &h;
  h.gated = true;
  std::vector<std::unique_ptr<Submitted>> jobs;
  for (int64_t i = 1; i <= 3; ++i) jobs.push_back(Submit(*h.batcher, {std::vector<int64_t>(4, i)}));
  ASSERT_TRUE(h.gate.WaitEntered(1));
  h.gate.Open();
  for (auto& j : jobs) Get(*j);
  EXPECT_EQ(calls.AfterFirst(), std::vector<size_t>{3});
}

TEST(Batcher, OnIdleWaitsForAQuietSpellAndWorkWithinItDefersIt) {
  // A closed-loop client sends its next request as soon as it is answered: releasing at once would shrink
  // between every two of its batches. Work that starts within idle_release_us defers it.
  IdleCalls calls;
  Harness h(/*max_batch_size=*/1, 0, 4096, nullptr, 1, 0, 0, false, 1'000'000, calls.Hook(),
            /*idle_release_us=*/400'000);
  calls.h = &h;
  for (int64_t i = 1; i <= 3; ++i) {
    Get(*Submit(*h.batcher, {std::vector<int64_t>(4, i)}));
    std::this_thread::sleep_for(50ms);
  }
  EXPECT_TRUE(calls.Seen().empty());
  EXPECT_EQ(calls.AfterFirst(), std::vector<size_t>{3});
}

TEST(Batcher, AFailingOnIdleLeavesServingAsItWas) {
  Harness h(/*max_batch_size=*/4, 0, 4096, nullptr, 1, 0, 0, false, 1'000'000,
            [] { throw std::runtime_error("no"); });
  EXPECT_EQ(Get(*Submit(*h.batcher, {std::vector<int64_t>(4, 1)})).scores, std::vector<float>{1004});
  EXPECT_EQ(Get(*Submit(*h.batcher, {std::vector<int64_t>(4, 2)})).scores, std::vector<float>{2004});
}

TEST(Batcher, OnRefinedHandsOverTheRefinedTableOncePerQuietSpellAfterBatches) {
  // The server keeps the table the batches refined for its next start (cost_profile.h): told at the quiet
  // spell after a burst, with how many batches refined it; not again until more ran.
  std::mutex mu;
  std::vector<std::pair<CostTable, int64_t>> seen;
  const CostTable table = CostTable::Make({1, 2}, {4, 8}, {{100, 200}, {150, 300}});
  auto cost = std::make_shared<CostModel>(table);
  Harness h(/*max_batch_size=*/1, 0, 4096, cost, 1, 0, 0, false, 1'000'000, nullptr, /*idle_release_us=*/300'000,
            [&](const CostTable& t, int64_t n) {
              std::lock_guard<std::mutex> lk(mu);
              seen.emplace_back(t, n);
            });
  auto count = [&] {
    std::lock_guard<std::mutex> lk(mu);
    return seen.size();
  };
  auto wait_for = [&](size_t n) {
    for (int i = 0; i < 500 && count() < n; ++i) std::this_thread::sleep_for(10ms);
    return count();
  };
  for (int64_t i = 1; i <= 3; ++i) Get(*Submit(*h.batcher, {std::vector<int64_t>(4, i)}));
  ASSERT_EQ(wait_for(1), 1u);
  {
    std::lock_guard<std::mutex> lk(mu);
    EXPECT_EQ(seen[0].second, 3);
    EXPECT_NE(seen[0].first.cost_us, table.cost_us);
  }
  std::this_thread::sleep_for(100ms);
  EXPECT_EQ(count(), 1u);
  Get(*Submit(*h.batcher, {std::vector<int64_t>(4, 4)}));
  ASSERT_EQ(wait_for(2), 2u);
  std::lock_guard<std::mutex> lk(mu);
  EXPECT_EQ(seen[1].second, 1);
}

TEST(Batcher, StopHandsOverWhatBatchesRefinedSinceTheLastQuietSpell) {
  // A server loaded until it stops is never idle for a second: Stop keeps the refined table then.
  std::vector<std::pair<CostTable, int64_t>> seen;  // Stop calls on_refined on this thread
  auto cost = std::make_shared<CostModel>(CostTable::Make({1, 2}, {4, 8}, {{100, 200}, {150, 300}}));
  Harness h(/*max_batch_size=*/1, 0, 4096, cost, 1, 0, 0, false, 1'000'000, nullptr,
            /*idle_release_us=*/60'000'000, [&](const CostTable& t, int64_t n) { seen.emplace_back(t, n); });
  for (int64_t i = 1; i <= 2; ++i) Get(*Submit(*h.batcher, {std::vector<int64_t>(4, i)}));
  EXPECT_TRUE(seen.empty());
  h.batcher->Stop();
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_EQ(seen[0].second, 2);
  EXPECT_EQ(seen[0].first.cost_us, cost->table().cost_us);
  h.batcher->Stop();  // a second Stop has nothing new to tell
  EXPECT_EQ(seen.size(), 1u);
}

TEST(Batcher, AFailingOnRefinedLeavesServingAsItWas) {
  Harness h(/*max_batch_size=*/1, 0, 4096, std::make_shared<CostModel>(CostTable::Make({1}, {4}, {{100}})), 1, 0, 0,
            false, 1'000'000, nullptr, 0, [](const CostTable&, int64_t) { throw std::runtime_error("read-only"); });
  EXPECT_EQ(Get(*Submit(*h.batcher, {std::vector<int64_t>(4, 1)})).scores, std::vector<float>{1004});
  std::this_thread::sleep_for(50ms);
  EXPECT_EQ(Get(*Submit(*h.batcher, {std::vector<int64_t>(4, 2)})).scores, std::vector<float>{2004});
}

// ---- Fair shares (issue 29, defect 4): tests/unit/test_caller_turns.py holds the same cases. ----

std::unique_ptr<Submitted> SubmitAs(Harness& h, const std::string& caller, std::vector<std::vector<int64_t>> ids,
                                    std::optional<Clock::time_point> deadline = std::nullopt) {
  return Submit(*h.batcher, std::move(ids), deadline, caller);
}

TEST(FairShare, ANewCallerRunsNextWhateverAFloodingCallerHasQueued) {
  Harness h(/*max_batch_size=*/1);
  h.gated = true;
  std::vector<std::unique_ptr<Submitted>> flood;
  for (int64_t i = 1; i <= 6; ++i) flood.push_back(SubmitAs(h, "a", {std::vector<int64_t>(8, i)}));
  ASSERT_TRUE(h.gate.WaitEntered(1));  // 1 runs, 2..6 wait
  auto probe = SubmitAs(h, "b", {std::vector<int64_t>(8, 50)});
  h.gate.Open();
  EXPECT_EQ(Get(*probe).scores, std::vector<float>{50008});
  for (int64_t i = 1; i <= 6; ++i) EXPECT_EQ(Get(*flood[size_t(i - 1)]).scores, std::vector<float>{float(i * 1000 + 8)});
  // The probe ran right after the batch that was running, before the flood's queue.
  EXPECT_EQ(h.Batches(), (Batches{{1}, {50}, {2}, {3}, {4}, {5}, {6}}));
}

TEST(FairShare, CallersWithWorkQueuedTakeTurnsByTokens) {
  Harness h(/*max_batch_size=*/1);
  h.gated = true;
  auto first = SubmitAs(h, "a", {std::vector<int64_t>(10, 1)});
  ASSERT_TRUE(h.gate.WaitEntered(1));
  auto a = SubmitAs(h, "a", {std::vector<int64_t>(10, 2), std::vector<int64_t>(10, 3), std::vector<int64_t>(10, 4),
                             std::vector<int64_t>(10, 5)});
  auto b = SubmitAs(h, "b", {std::vector<int64_t>(20, 20), std::vector<int64_t>(20, 21)});  // one of b's to two of a's
  h.gate.Open();
  Get(*first), Get(*a), Get(*b);
  // Turns end at a: 20, 30, 40, 50 and b: 20, 40 (b starts at the head, 0, where a's first began): ties
  // by arrival, so one of b's runs per two of a's.
  EXPECT_EQ(h.Batches(), (Batches{{1}, {2}, {20}, {3}, {4}, {21}, {5}}));
}

TEST(FairShare, ALongSequenceWaitsForItsTurnsWorthOfNewCallersNotForEver) {
  // test_caller_turns.py's namesake says why: one 10-token newcomer per batch, each a new caller, and the
  // 100-token sequence runs after 44 of them.
  Harness h(/*max_batch_size=*/1);
  h.gated = true;
  auto running = SubmitAs(h, "r", {std::vector<int64_t>(10, 1)});
  ASSERT_TRUE(h.gate.WaitEntered(1));
  auto long_one = SubmitAs(h, "x", {std::vector<int64_t>(100, 2)});
  std::vector<std::unique_ptr<Submitted>> newcomers;
  for (int k = 1; k <= 60; ++k) {
    newcomers.push_back(SubmitAs(h, "n" + std::to_string(k), {std::vector<int64_t>(10, 100 + k)}));
    h.gate.Release();
    ASSERT_TRUE(h.gate.WaitEntered(k + 1));  // the batch after the one released has started
  }
  h.gate.Open();
  Get(*running), Get(*long_one);
  for (auto& n : newcomers) Get(*n);
  Batches want{{1}};
  for (int64_t k = 1; k <= 44; ++k) want.push_back({100 + k});
  want.push_back({2});
  for (int64_t k = 45; k <= 60; ++k) want.push_back({100 + k});
  EXPECT_EQ(h.Batches(), want);
}

TEST(FairShare, OneCallerKeepsArrivalOrder) {
  Harness h(/*max_batch_size=*/1);
  h.gated = true;
  std::vector<std::unique_ptr<Submitted>> jobs;
  for (int64_t i = 1; i <= 5; ++i) jobs.push_back(SubmitAs(h, "a", {std::vector<int64_t>(size_t(40 - i), i)}));
  ASSERT_TRUE(h.gate.WaitEntered(1));
  h.gate.Open();
  for (auto& j : jobs) Get(*j);
  EXPECT_EQ(h.Batches(), (Batches{{1}, {2}, {3}, {4}, {5}}));
}

TEST(FairShare, AFloodingCallerIsRefusedForItsOwnWorkWhileAnotherIsAccepted) {
  // 100 us per token, a 1 s bound: the work each caller would wait for is known exactly.
  Harness h(/*max_batch_size=*/1, /*delay_us=*/0, /*max_queue=*/4096, nullptr, /*workers=*/1,
            /*max_wait_us=*/1'000'000, /*seed=*/100.0);
  h.gated = true;
  auto running = SubmitAs(h, "a", {std::vector<int64_t>(10, 1)});
  ASSERT_TRUE(h.gate.WaitEntered(1));  // 1 ms running
  auto held = SubmitAs(h, "a", {std::vector<int64_t>(12000, 2)});  // 1.2 s of a's own work queued
  EXPECT_TRUE(held->admitted.ok());  // only the work ahead counted when it came: 1 ms
  auto more = SubmitAs(h, "a", {{3}});
  EXPECT_EQ(more->admitted.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(more->admitted.error_message(),
            "queue full: about 1201 ms of model work waiting exceeds max_queue_wait_seconds (1000 ms)");
  EXPECT_EQ(h.batcher->WorkRefusal(std::nullopt, "a").error_message(), more->admitted.error_message());
  // Another caller waits for the batch running only: accepted, even with a deadline of 0.1 s.
  EXPECT_TRUE(h.batcher->WorkRefusal(Clock::now() + 100ms, "b").ok());
  auto probe = SubmitAs(h, "b", {std::vector<int64_t>(5, 4)}, Clock::now() + 100ms);
  EXPECT_TRUE(probe->admitted.ok()) << probe->admitted.error_message();
  // The gauge still reads all the work queued and running.
  EXPECT_EQ(h.Read("rmscore_queue_expected_wait_seconds"), 1.2015);
  h.gate.Open();
  EXPECT_EQ(Get(*running).scores, std::vector<float>{1010});
  EXPECT_EQ(Get(*probe).scores, std::vector<float>{4005});
  EXPECT_EQ(Get(*held).scores, std::vector<float>{14000});
  EXPECT_EQ(h.Batches(), (Batches{{1}, {4}, {2}}));
}

// One worker inside a 10-token batch of caller "a" (1 ms at 100 us a token), held until h.gate.Open(), and
// callers "b" to "f" each with one 2,000-token sequence queued, whose turns all start at the head. `h`:
// one worker, batches of 1, a 2 s work bound, seeded at 100 us a token.
std::vector<std::unique_ptr<Submitted>> FiveTiedAtTheHead(Harness& h, std::unique_ptr<Submitted>& running) {
  h.gated = true;
  running = SubmitAs(h, "a", {std::vector<int64_t>(10, 1)});
  EXPECT_TRUE(h.gate.WaitEntered(1));
  std::vector<std::unique_ptr<Submitted>> tied;
  for (int64_t k = 2; k <= 6; ++k) {
    tied.push_back(SubmitAs(h, std::string(1, char('a' + k - 1)), {std::vector<int64_t>(2000, k)}));
    EXPECT_TRUE(tied.back()->admitted.ok()) << tied.back()->admitted.error_message();
  }
  return tied;
}

TEST(FairShare, ANewCallersShortSequenceRunsBeforeLongOnesTiedAtTheHead) {
  // Five callers, each with one 2,000-token sequence whose turn starts at the head (every one of them
  // new): a sixth caller's 5-token sequence starts there too but its turn ends first, so it runs next and
  // only the running batch (1 ms) is ahead of it. Ranked by their turns' starts, it waited for all five
  // (1 s of work): 80 connections streaming 512-token items refused every probe for the whole attack
  // (docs/bench/attacks_2026-12-06.md, streams_80_conns).
  Harness h(/*max_batch_size=*/1, /*delay_us=*/0, /*max_queue=*/4096, nullptr, /*workers=*/1,
            /*max_wait_us=*/2'000'000, /*seed=*/100.0);
  std::unique_ptr<Submitted> running;
  auto tied = FiveTiedAtTheHead(h, running);
  EXPECT_TRUE(h.batcher->WorkRefusal(Clock::now() + 100ms, "g").ok());
  auto probe = SubmitAs(h, "g", {std::vector<int64_t>(5, 9)}, Clock::now() + 100ms);
  EXPECT_TRUE(probe->admitted.ok()) << probe->admitted.error_message();
  // A sequence of a new caller whose turn would end after theirs waits for all five, and is told so.
  auto longer = SubmitAs(h, "h", {std::vector<int64_t>(3000, 8)}, Clock::now() + 500ms);
  EXPECT_EQ(longer->admitted.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  EXPECT_EQ(longer->admitted.error_message().rfind("deadline exceeded before scoring: about 1001 ms of model work waiting",
                                                   0),
            0u)
      << longer->admitted.error_message();
  h.gate.Open();
  Get(*running);
  for (auto& t : tied) Get(*t);
  Get(*probe);
  EXPECT_EQ(h.Batches(), (Batches{{1}, {9}, {2}, {3}, {4}, {5}, {6}}));
}

TEST(FairShare, ARequestsDeadlineIsHeldToItsLastSequence) {
  // Five callers, each with one 2,000-token sequence tied at the head. A new caller's request of four
  // 500-token sequences: its first ends its turn before theirs (only the running 1 ms is ahead), but its
  // last ends it with theirs, after all five (1 s) and its own three before it (0.15 s). Held to its
  // first, it was accepted under a 0.5 s deadline and expired in the queue (tests/unit/test_caller_turns.py).
  Harness h(/*max_batch_size=*/1, /*delay_us=*/0, /*max_queue=*/4096, nullptr, /*workers=*/1,
            /*max_wait_us=*/2'000'000, /*seed=*/100.0);
  std::unique_ptr<Submitted> running;
  auto tied = FiveTiedAtTheHead(h, running);
  const std::vector<std::vector<int64_t>> four(4, std::vector<int64_t>(500, 7));
  auto refused = SubmitAs(h, "g", four, Clock::now() + 500ms);
  EXPECT_EQ(refused->admitted.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  EXPECT_EQ(refused->admitted.error_message().rfind(
                "deadline exceeded before scoring: about 1151 ms of model work before its last sequence (its own "
                "earlier sequences included) and up to 50 ms for that sequence's batch, ",
                0),
            0u)
      << refused->admitted.error_message();
  auto one = SubmitAs(h, "g", {four[0]}, Clock::now() + 500ms);  // one sequence: only the running batch ahead
  EXPECT_TRUE(one->admitted.ok()) << one->admitted.error_message();
  auto accepted = SubmitAs(h, "h", four, Clock::now() + 5s);
  EXPECT_TRUE(accepted->admitted.ok()) << accepted->admitted.error_message();
  h.gate.Open();
  Get(*running);
  for (auto& t : tied) Get(*t);
  Get(*one);
  Get(*accepted);
}

TEST(FairShare, ADeadlineLeavesTimeForTheRequestsOwnBatchPaddedToTheQueuesLongest) {
  // Batches of 2: a 5-token probe runs before the queued 2,000-token sequence (its turn ends first) but may
  // run beside it, padded to it, so its own batch is up to 2 x 2,000 tokens (0.4 s at 100 us per token) on
  // top of the 1 ms running.
  Harness h(/*max_batch_size=*/2, /*delay_us=*/0, /*max_queue=*/4096, nullptr, /*workers=*/1,
            /*max_wait_us=*/2'000'000, /*seed=*/100.0);
  h.gated = true;
  auto running = SubmitAs(h, "a", {std::vector<int64_t>(10, 1)});
  ASSERT_TRUE(h.gate.WaitEntered(1));
  auto queued = SubmitAs(h, "b", {std::vector<int64_t>(2000, 2)});
  auto refused = SubmitAs(h, "c", {std::vector<int64_t>(5, 3)}, Clock::now() + 300ms);
  EXPECT_EQ(refused->admitted.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  EXPECT_EQ(refused->admitted.error_message().rfind(
                "deadline exceeded before scoring: about 1 ms of model work waiting and up to 400 ms for its own batch", 0),
            0u)
      << refused->admitted.error_message();
  auto accepted = SubmitAs(h, "c", {std::vector<int64_t>(5, 3)}, Clock::now() + 5s);
  EXPECT_TRUE(accepted->admitted.ok()) << accepted->admitted.error_message();
  h.gate.Open();
  Get(*running), Get(*queued), Get(*accepted);
}

TEST(FairShare, QueueIndexTokensThroughSumsTheSequencesRankedAtOrBefore) {
  QueueIndex index;
  index.Add(Waiting{1, 0, 8, std::nullopt}, 10);
  index.Add(Waiting{2, 0, 30, std::nullopt}, 20);
  index.Add(Waiting{3, 5, 5, std::nullopt}, 10);
  std::vector<int64_t> got;
  for (int64_t r : {int64_t(9), int64_t(10), int64_t(19), int64_t(20), int64_t(1'000'000'000)}) got.push_back(index.TokensThrough(r));
  EXPECT_EQ(got, (std::vector<int64_t>{0, 13, 13, 43, 43}));
  index.Remove(1);
  EXPECT_EQ(index.TokensThrough(10), 5);
}

TEST(FairShare, QueueWorkWaitsForTheRunningBatchesAndTheTokensAhead) {
  QueueWork w(/*workers=*/2, /*max_wait_us=*/0, /*seed_us_per_token=*/10.0);
  w.Add(1000, "a");
  w.Add(300, "b");
  w.BatchStarted(100);
  EXPECT_EQ(w.WaitUs(0), 100 * 10 / 2);
  EXPECT_EQ(w.WaitUs(300), 400 * 10 / 2);
  EXPECT_EQ(w.WaitUs(), 1400 * 10 / 2);  // nullopt: everything (the gauge)
  w.Remove(300, "b");
  EXPECT_EQ(w.callers(), 1u);
}

TEST(FairShare, QueueIndexOrdersByRankThenId) {
  QueueIndex index;
  index.Add(Waiting{1, 0, 8, std::nullopt}, 10);
  index.Add(Waiting{2, 0, 8, std::nullopt}, 20);
  index.Add(Waiting{3, 5, 8, std::nullopt}, 10);  // a later arrival ranked with the head: after it, before 2
  index.Add(Waiting{4, 6, 8, std::nullopt}, 0);
  std::vector<uint64_t> order;
  for (const auto& [key, id] : index.by_arrival()) order.push_back(id);
  EXPECT_EQ(order, (std::vector<uint64_t>{4, 1, 3, 2}));
  EXPECT_EQ(index.Oldest().id, 4u);
  EXPECT_EQ(index.FirstRank(), 0);
  index.Remove(4);
  EXPECT_EQ(index.Oldest().id, 1u);
}

}  // namespace
}  // namespace rmscore
