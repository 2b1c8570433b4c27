// The C++ planner against every shared vector (contract/batching_vectors.json),
// the same file server_py's planner is held to: decisions must be identical.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <random>
#include <nlohmann/json.hpp>

#include "admission.h"
#include "planner.h"

namespace rmscore {
namespace {

using nlohmann::json;

json LoadVectors() {
  std::ifstream in(RMSCORE_VECTORS_JSON);
  EXPECT_TRUE(in.good()) << "cannot read " << RMSCORE_VECTORS_JSON;
  return json::parse(in);
}

std::optional<int64_t> OptInt(const json& j) {
  return j.is_null() ? std::nullopt : std::optional<int64_t>(j.get<int64_t>());
}

TEST(Planner, MatchesEverySharedVector) {
  const json vectors = LoadVectors();
  size_t checked = 0, cost_aware = 0;
  for (const char* group : {"hand", "generated"}) {
    for (const json& c : vectors.at(group)) {
      const json& cj = c.at("config");
      PlannerConfig cfg;
      cfg.max_batch_size = cj.at("max_batch_size");
      cfg.max_batch_tokens = cj.at("max_batch_tokens");
      cfg.max_queue_delay_us = cj.at("max_queue_delay_us");
      cfg.max_batch_us = cj.at("max_batch_us");
      const std::string mode = cj.at("mode");
      ASSERT_TRUE(mode == "fifo" || mode == "length_aware" || mode == "cost_aware") << mode;
      cfg.mode = mode == "fifo"         ? BatchingMode::kFifo
                 : mode == "cost_aware" ? BatchingMode::kCostAware
                                        : BatchingMode::kLengthAware;
      std::optional<CostTable> table;
      if (cj.contains("cost_table")) table = CostTable::FromJson(cj.at("cost_table"));
      std::vector<Waiting> queue;
      for (const json& w : c.at("waiting")) {
        queue.push_back(Waiting{w.at("id"), w.at("arrival_us"), w.at("length"), OptInt(w.at("deadline_us"))});
      }
      const Decision d = Plan(queue, c.at("now_us"), cfg, table ? &*table : nullptr, cj.at("us_per_token").get<double>(),
                              cj.at("arrivals_per_s").get<double>());
      const json& e = c.at("expect");
      const std::string name = c.at("name");
      EXPECT_EQ(d.expired, e.at("expired").get<std::vector<uint64_t>>()) << name;
      EXPECT_EQ(d.batch, e.at("batch").get<std::vector<uint64_t>>()) << name;
      EXPECT_EQ(d.wait_us, OptInt(e.at("wait_us"))) << name;
      ++checked;
      cost_aware += cfg.mode == BatchingMode::kCostAware;
    }
  }
  // The file holds 39 hand-made and 750 generated cases today (150 with a token rate, cut by
  // deadlines; 150 with an arrival rate, where waits become dispatches), over 250 cost_aware; never zero.
  EXPECT_GE(checked, 600u);
  EXPECT_GE(cost_aware, 200u);
}

// CostTable::BatchUs against Python's integer interpolation at grid points, between them, below and
// past them, on the CPU-like, GPU-like and noisy (made non-decreasing) tables.
TEST(CostTable, MatchesEverySharedQuery) {
  const json vectors = LoadVectors();
  size_t checked = 0;
  for (const json& entry : vectors.at("cost_tables")) {
    const CostTable table = CostTable::FromJson(entry.at("table"));
    for (const json& q : entry.at("queries")) {
      const int64_t b = q.at(0), n = q.at(1), want = q.at(2);
      EXPECT_EQ(table.BatchUs(b, n), want) << entry.at("table").dump() << " B=" << b << " L=" << n;
      ++checked;
    }
  }
  EXPECT_GE(checked, 27u);
}

// QueueWork (admission.h) against Python's reference: same codes, messages and expected waits.
TEST(Admission, MatchesEverySharedVector) {
  const json vectors = LoadVectors();
  size_t checked = 0;
  for (const json& c : vectors.at("admission")) {
    QueueWork w(c.at("workers"), c.at("max_wait_us"), c.at("seed_us_per_token").get<double>(), c.at("max_batch_us"));
    for (const json& o : c.at("observe")) w.Observe(o.at(0).get<double>(), o.at(1).get<int64_t>());
    w.Add(c.at("tokens"));
    w.BatchStarted(c.value("running", int64_t(0)));
    const grpc::Status r = w.Refusal(c.at("now_us"), OptInt(c.at("deadline_us")), std::nullopt, c.at("own_batch_tokens"),
                                     OptInt(c.at("queued_before_last")));
    const json& e = c.at("expect");
    const std::string name = c.at("name");
    const std::string code = r.ok()                                                ? "OK"
                             : r.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED ? "RESOURCE_EXHAUSTED"
                             : r.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED  ? "DEADLINE_EXCEEDED"
                                                                                    : "other";
    EXPECT_EQ(code, e.at("code").get<std::string>()) << name;
    EXPECT_EQ(r.error_message(), e.at("message").get<std::string>()) << name;
    EXPECT_EQ(w.WaitUs(), e.at("wait_us").get<int64_t>()) << name;
    w.Remove(c.at("tokens"));
    w.BatchEnded(c.value("running", int64_t(0)));
    EXPECT_EQ(w.WaitUs(), 0) << name;
    ++checked;
  }
  EXPECT_GE(checked, 13u);
}

TEST(Planner, CostAwareWithoutATableIsRefused) {
  PlannerConfig cfg{8, 4096, 0, BatchingMode::kCostAware};
  EXPECT_THROW(Plan({Waiting{1, 0, 10, std::nullopt}}, 0, cfg), std::invalid_argument);
}

TEST(Planner, EmptyQueueSleeps) {
  const Decision d = Plan({}, 123, PlannerConfig{});
  EXPECT_TRUE(d.batch.empty());
  EXPECT_TRUE(d.expired.empty());
  EXPECT_FALSE(d.wait_us.has_value());
}

TEST(Planner, OversizedOldestStillRunsAlone) {
  // A sequence longer than the token budget must still be scored (alone).
  PlannerConfig cfg{8, 100, 0, BatchingMode::kLengthAware};
  const Decision d = Plan({Waiting{1, 0, 500, std::nullopt}, Waiting{2, 0, 10, std::nullopt}}, 0, cfg);
  EXPECT_EQ(d.batch, std::vector<uint64_t>{1});
}

// The batcher keeps a QueueIndex as sequences come and go; every decision on it must be the reference's
// on the same queue rebuilt as a list (tests/unit/test_planner.py has the same case).
TEST(Planner, AnIndexKeptThroughAddsAndRemovesDecidesAsTheListDoes) {
  const json vectors = LoadVectors();
  const CostTable table = CostTable::FromJson(vectors.at("cost_tables").at(0).at("table"));
  std::mt19937_64 rng(7);
  auto uniform = [&](int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng); };
  const int64_t lengths[] = {4, 16, 16, 100, 300, 512};
  for (BatchingMode mode : {BatchingMode::kFifo, BatchingMode::kLengthAware, BatchingMode::kCostAware}) {
    PlannerConfig cfg{8, 2048, 500, mode};
    QueueIndex index;
    std::vector<Waiting> queue;
    uint64_t next_id = 1;
    int64_t now = 0;
    for (int step = 0; step < 600; ++step) {
      now += uniform(0, 300);
      if (!queue.empty() && uniform(0, 9) < 4) {
        const size_t gone = size_t(uniform(0, int64_t(queue.size()) - 1));
        ASSERT_TRUE(index.Remove(queue[gone].id));
        queue.erase(queue.begin() + gone);
      } else {
        std::optional<int64_t> deadline;
        if (uniform(0, 1)) deadline = now + uniform(0, 5000);
        queue.push_back(Waiting{next_id, now, lengths[uniform(0, 5)], deadline});
        index.Add(queue.back(), int64_t(next_id));
        ++next_id;
      }
      const double rate = uniform(0, 1) ? 2.0 : 0.0;
      const double arrivals = std::vector<double>{0.0, 100.0, 5000.0}[size_t(uniform(0, 2))];
      const Decision reference = Plan(queue, now, cfg, &table, rate, arrivals);
      std::vector<uint64_t> expired = index.Expired(now), want = reference.expired;
      std::sort(expired.begin(), expired.end());
      std::sort(want.begin(), want.end());
      ASSERT_EQ(expired, want) << step;
      for (uint64_t id : reference.expired) {
        index.Remove(id);
        queue.erase(std::find_if(queue.begin(), queue.end(), [&](const Waiting& w) { return w.id == id; }));
      }
      const Decision live = PlanLive(index, now, cfg, &table, rate, arrivals);
      ASSERT_EQ(live.batch, reference.batch) << step;
      ASSERT_EQ(live.wait_us, reference.wait_us) << step;
    }
  }
}

TEST(Planner, TheArrivalRateReadsASteadyRateAsItselfAndDecaysWhenIdle) {
  // tests/unit/test_planner.py has the same case.
  ArrivalRate r;
  EXPECT_EQ(r.PerS(0), 0.0);
  for (int64_t t = 0; t < 2'000'000; t += 10'000) r.Add(1, t);
  EXPECT_GT(r.PerS(2'000'000), 95);
  EXPECT_LT(r.PerS(2'000'000), 105);
  EXPECT_LT(r.PerS(3'000'000), 1);
  r.Add(8, 3'000'000);
  EXPECT_GT(r.PerS(3'000'000), 40);
}

}  // namespace
}  // namespace rmscore
