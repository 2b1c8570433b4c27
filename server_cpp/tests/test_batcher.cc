// The batcher end to end with a deterministic stand-in model (score = a
// function of the packed row), so the tests see exactly which sequences went
// into which batch: splitting and joining, ordering, failures, admission,
// deadlines, cancellation, drain and stop, each request finished once.
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

// Score of a row: first id * 1000 + real length, read back from the tensors
// (so padding and masks are exercised too).
std::vector<float> RowScores(const PackedBatch& b) {
  std::vector<float> out;
  for (int64_t r = 0; r < b.batch; ++r) {
    int64_t len = 0;
    for (int64_t c = 0; c < b.longest; ++c) len += b.attention_mask[size_t(r * b.longest + c)];
    out.push_back(float(b.input_ids[size_t(r * b.longest)] * 1000 + len));
  }
  return out;
}

struct Harness {
  Metrics metrics{"test", "v0"};
  std::mutex mu;
  std::vector<int64_t> batch_sizes;  // every batch the model saw
  std::function<void(const PackedBatch&)> hook = [](const PackedBatch&) {};
  std::unique_ptr<Batcher> batcher;

  std::function<void()> abort = [] {};

  explicit Harness(int64_t max_batch_size, int64_t delay_us = 0, int64_t max_queue = 4096) {
    Batcher::Options o;
    o.planner = PlannerConfig{max_batch_size, 1 << 20, delay_us, BatchingMode::kFifo};
    o.max_queue_sequences = max_queue;
    o.pad_token_id = 0;
    batcher = std::make_unique<Batcher>(o, [this](const PackedBatch& b) {
      hook(b);
      std::lock_guard<std::mutex> lk(mu);
      batch_sizes.push_back(b.batch);
      return RowScores(b);
    }, &metrics, [this] { abort(); });
  }
};

// A submitted job and the future of its one result; counts completions.
struct Submitted {
  std::vector<std::vector<int64_t>> ids;  // owns the token ids the views point at
  std::shared_ptr<std::promise<JobResult>> promise = std::make_shared<std::promise<JobResult>>();
  std::shared_ptr<std::atomic<int>> calls = std::make_shared<std::atomic<int>>(0);
  std::future<JobResult> result = promise->get_future();
  std::shared_ptr<Job> job;
  grpc::Status admitted;
};

std::unique_ptr<Submitted> Submit(Batcher& b, std::vector<std::vector<int64_t>> ids,
                                  std::optional<Clock::time_point> deadline = std::nullopt) {
  auto s = std::make_unique<Submitted>();
  s->ids = std::move(ids);
  std::vector<SeqView> views;
  for (const auto& v : s->ids) views.push_back(SeqView{v.data(), int64_t(v.size())});
  auto promise = s->promise;
  auto calls = s->calls;
  s->job = std::make_shared<Job>(std::move(views), deadline, nullptr, [promise, calls](JobResult&& r) {
    if (calls->fetch_add(1) == 0) promise->set_value(std::move(r));
  });
  s->admitted = b.Submit(s->job);
  return s;
}

JobResult Get(Submitted& s) {
  EXPECT_EQ(s.result.wait_for(10s), std::future_status::ready);
  return s.result.get();
}

TEST(Batcher, SplitsRequestsOverBatchesAndAnswersInRequestOrder) {
  Harness h(/*max_batch_size=*/2);
  auto a = Submit(*h.batcher, {{1, 1, 1}, {2}, {3, 3}, {4, 4, 4, 4}, {5}});
  auto b = Submit(*h.batcher, {{6, 6}});
  ASSERT_TRUE(a->admitted.ok());
  JobResult ra = Get(*a), rb = Get(*b);
  ASSERT_TRUE(ra.status.ok()) << ra.status.error_message();
  EXPECT_EQ(ra.scores, (std::vector<float>{1003, 2001, 3002, 4004, 5001}));
  EXPECT_EQ(rb.scores, (std::vector<float>{6002}));
  EXPECT_GT(ra.inference_ms, 0);
  EXPECT_GE(ra.total_ms, ra.inference_ms);
  std::lock_guard<std::mutex> lk(h.mu);
  for (int64_t n : h.batch_sizes) EXPECT_LE(n, 2);
  int64_t total = 0;
  for (int64_t n : h.batch_sizes) total += n;
  EXPECT_EQ(total, 6);
  h.batcher->Stop();
  EXPECT_EQ(*a->calls, 1);
  EXPECT_EQ(*b->calls, 1);
}

TEST(Batcher, JoinsSequencesOfSeveralRequestsIntoOneBatch) {
  // A long delay and room for all: the three requests must share one batch.
  Harness h(/*max_batch_size=*/8, /*delay_us=*/200000);
  auto a = Submit(*h.batcher, {{1}});
  auto b = Submit(*h.batcher, {{2}, {2, 2}});
  auto c = Submit(*h.batcher, {{3}});
  EXPECT_EQ(Get(*a).scores, std::vector<float>{1001});
  EXPECT_EQ(Get(*b).scores, (std::vector<float>{2001, 2002}));
  EXPECT_EQ(Get(*c).scores, std::vector<float>{3001});
  std::lock_guard<std::mutex> lk(h.mu);
  EXPECT_EQ(h.batch_sizes, std::vector<int64_t>{4});
}

TEST(Batcher, WhileABatchRunsOnlyAFullBatchIsBuiltAhead) {
  // Zero delay: an idle worker takes whatever waits. While the model is held
  // inside the first batch, three single sequences arrive one by one; the
  // shared policy builds no partial batch ahead, so all three (not just the
  // first) join the batch after it.
  Harness h(/*max_batch_size=*/8, /*delay_us=*/0);
  std::promise<void> entered, release;
  std::shared_future<void> released = release.get_future().share();
  std::atomic<int> calls{0};
  h.hook = [&](const PackedBatch&) {
    if (calls.fetch_add(1) == 0) {
      entered.set_value();
      released.wait();
    }
  };
  auto first = Submit(*h.batcher, {{1}});
  ASSERT_EQ(entered.get_future().wait_for(10s), std::future_status::ready);
  auto a = Submit(*h.batcher, {{2}});
  std::this_thread::sleep_for(20ms);  // the batcher plans after each arrival
  auto b = Submit(*h.batcher, {{3}});
  auto c = Submit(*h.batcher, {{4}});
  std::this_thread::sleep_for(20ms);
  release.set_value();
  EXPECT_EQ(Get(*first).scores, std::vector<float>{1001});
  EXPECT_EQ(Get(*a).scores, std::vector<float>{2001});
  EXPECT_EQ(Get(*b).scores, std::vector<float>{3001});
  EXPECT_EQ(Get(*c).scores, std::vector<float>{4001});
  std::lock_guard<std::mutex> lk(h.mu);
  EXPECT_EQ(h.batch_sizes, (std::vector<int64_t>{1, 3}));
}

TEST(Batcher, AFailingBatchFailsItsRequestsAndServingGoesOn) {
  Harness h(/*max_batch_size=*/1);
  h.hook = [](const PackedBatch& b) {
    if (b.input_ids[0] == 66) throw std::runtime_error("boom");
  };
  auto bad = Submit(*h.batcher, {{1}, {66}, {2}, {3}});
  JobResult r = Get(*bad);
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::INTERNAL);
  EXPECT_EQ(r.status.error_message(), "batch failed: boom");
  auto good = Submit(*h.batcher, {{7}});
  EXPECT_EQ(Get(*good).scores, std::vector<float>{7001});
  h.batcher->Stop();
  EXPECT_EQ(*bad->calls, 1);
}

TEST(Batcher, QueueFullIsRefusedAtOnceWithTheContractMessage) {
  Harness h(/*max_batch_size=*/64, /*delay_us=*/60'000'000, /*max_queue=*/3);
  auto a = Submit(*h.batcher, {{1}, {2}});
  ASSERT_TRUE(a->admitted.ok());
  auto b = Submit(*h.batcher, {{3}, {4}});
  EXPECT_EQ(b->admitted.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(b->admitted.error_message(), "queue full: 2 sequences waiting + 2 requested exceed max_queue_sequences 3");
  h.batcher->Stop();  // the waiting one fails once, refused one never runs its callback
  EXPECT_EQ(Get(*a).status.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(*b->calls, 0);
}

TEST(Batcher, ExpiredSequencesNeverReachTheModel) {
  Harness h(/*max_batch_size=*/8);
  auto late = Submit(*h.batcher, {{1}, {2}}, Clock::now() - 1ms);
  JobResult r = Get(*late);
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  EXPECT_EQ(r.status.error_message(), "deadline exceeded before scoring");
  std::lock_guard<std::mutex> lk(h.mu);
  EXPECT_TRUE(h.batch_sizes.empty());
}

TEST(Batcher, CancelledSequencesAreDroppedBeforeTheModel) {
  Harness h(/*max_batch_size=*/8, /*delay_us=*/60'000'000);
  auto s = Submit(*h.batcher, {{1}, {2}});
  h.batcher->Cancel(s->job);
  EXPECT_EQ(Get(*s).status.error_code(), grpc::StatusCode::CANCELLED);
  std::lock_guard<std::mutex> lk(h.mu);
  EXPECT_TRUE(h.batch_sizes.empty());
}

TEST(Batcher, DrainFinishesAcceptedWorkThenRefuses) {
  Harness h(/*max_batch_size=*/8, /*delay_us=*/100'000);
  h.hook = [](const PackedBatch&) { std::this_thread::sleep_for(50ms); };
  auto a = Submit(*h.batcher, {{1}, {2}, {3}});
  EXPECT_TRUE(h.batcher->Drain(Clock::now() + 5s));
  ASSERT_EQ(a->result.wait_for(0s), std::future_status::ready);
  EXPECT_EQ(a->result.get().scores, (std::vector<float>{1001, 2001, 3001}));
  auto late = Submit(*h.batcher, {{4}});
  EXPECT_EQ(late->admitted.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(late->admitted.error_message(), "not ready: draining");
}

TEST(Batcher, StopAbortsTheRunningBatchAndFailsTheRestOnce) {
  Harness h(/*max_batch_size=*/1);
  std::mutex mu;
  std::condition_variable cv;
  bool running = false, aborted = false;
  h.hook = [&](const PackedBatch&) {
    std::unique_lock<std::mutex> lk(mu);
    running = true;
    cv.notify_all();
    cv.wait(lk, [&] { return aborted; });  // a model run that only ends when aborted
    throw std::runtime_error("terminated");
  };
  h.abort = [&] {
    std::lock_guard<std::mutex> lk(mu);
    aborted = true;
    cv.notify_all();
  };
  auto running_job = Submit(*h.batcher, {{1}});
  {
    std::unique_lock<std::mutex> lk(mu);
    ASSERT_TRUE(cv.wait_for(lk, 10s, [&] { return running; }));
  }
  auto queued = Submit(*h.batcher, {{2}, {3}});
  h.batcher->Stop();
  JobResult r = Get(*running_job);
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::INTERNAL);
  EXPECT_EQ(r.status.error_message(), "batch failed: terminated");
  EXPECT_EQ(Get(*queued).status.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(*running_job->calls, 1);
  EXPECT_EQ(*queued->calls, 1);
}

TEST(Batcher, ManyConcurrentSubmittersEachAnsweredOnce) {
  Harness h(/*max_batch_size=*/5, /*delay_us=*/500);
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
    JobResult r = Get(*s);
    ASSERT_TRUE(r.status.ok());
    EXPECT_EQ(r.scores, (std::vector<float>{float(s->ids[0][0] * 1000 + 2), float(s->ids[1][0] * 1000 + 1)}));
  }
  h.batcher->Stop();
  for (auto& s : all) EXPECT_EQ(*s->calls, 1);
}

}  // namespace
}  // namespace rmscore
