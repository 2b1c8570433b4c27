// The C++ planner against every shared vector (contract/batching_vectors.json),
// the same file server_py's planner is held to: decisions must be identical.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

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
  size_t checked = 0;
  for (const char* group : {"hand", "generated"}) {
    for (const json& c : vectors.at(group)) {
      const json& cj = c.at("config");
      PlannerConfig cfg;
      cfg.max_batch_size = cj.at("max_batch_size");
      cfg.max_batch_tokens = cj.at("max_batch_tokens");
      cfg.max_queue_delay_us = cj.at("max_queue_delay_us");
      const std::string mode = cj.at("mode");
      ASSERT_TRUE(mode == "fifo" || mode == "length_aware") << mode;
      cfg.mode = mode == "fifo" ? BatchingMode::kFifo : BatchingMode::kLengthAware;
      std::vector<Waiting> queue;
      for (const json& w : c.at("waiting")) {
        queue.push_back(Waiting{w.at("id"), w.at("arrival_us"), w.at("length"), OptInt(w.at("deadline_us"))});
      }
      const Decision d = Plan(queue, c.at("now_us"), cfg);
      const json& e = c.at("expect");
      const std::string name = c.at("name");
      EXPECT_EQ(d.expired, e.at("expired").get<std::vector<uint64_t>>()) << name;
      EXPECT_EQ(d.batch, e.at("batch").get<std::vector<uint64_t>>()) << name;
      EXPECT_EQ(d.wait_us, OptInt(e.at("wait_us"))) << name;
      ++checked;
    }
  }
  // The file holds 17 hand-made and 300 generated cases today; never zero.
  EXPECT_GE(checked, 300u);
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

}  // namespace
}  // namespace rmscore
