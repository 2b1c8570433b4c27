// The cost model and its profile files (cost.h, cost_profile.h); tests/unit/test_cost*.py hold the
// Python side. The shared interpolation vectors are checked in test_planner.cc.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <sstream>

#include "config.h"
#include "cost.h"
#include "cost_profile.h"

namespace rmscore {
namespace {

using nlohmann::ordered_json;

std::string ErrorOf(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "(no error)";
}

ordered_json Identity(int threads = 2, int workers = 1) {
  return {{"model", "m"},         {"model_version", "v1"},       {"backend", "onnxruntime"},     {"device", "cpu"},
          {"precision", "fp32"}, {"intra_op_threads", threads}, {"model_workers", workers}, {"cpu", "Xeon"}};
}

// A file in a fresh directory under /tmp, removed with it.
struct TempFile {
  std::string dir, path;
  TempFile() {
    char tmpl[] = "/tmp/rmscore-cost-XXXXXX";
    dir = mkdtemp(tmpl);
    path = dir + "/profile.json";
  }
  ~TempFile() {
    std::remove(path.c_str());
    rmdir(dir.c_str());
  }
  void Write(const std::string& text) const { std::ofstream(path) << text; }
  std::string Read() const {
    std::ifstream in(path);
    return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  }
};

TEST(CostTable, MakeIsNonDecreasingAndRefusesBadGrids) {
  const CostTable t = CostTable::Make({1, 4, 16}, {16, 128}, {{900, 2500}, {800, 9000}, {4000, 8000}});
  EXPECT_EQ(t.cost_us, (std::vector<std::vector<int64_t>>{{900, 2500}, {900, 9000}, {4000, 9000}}));
  EXPECT_EQ(ErrorOf([] { CostTable::Make({1, 1}, {16}, {{1}, {1}}); }),
            "cost table batch_sizes must be ascending integers >= 1, got [1, 1]");
  EXPECT_EQ(ErrorOf([] { CostTable::Make({1}, {16, 32}, {{1}}); }),
            "cost table cost_us must be 1 rows of 2 values, got [1] row lengths");
  EXPECT_EQ(ErrorOf([] { CostTable::Make({1}, {16}, {{0}}); }),
            "cost table cost_us must be integers >= 1 microsecond, got [[0]]");
}

TEST(CostModel, ObserveMovesTheNearestCellATenthOfTheWay) {
  CostModel m(CostTable::Make({1, 8}, {16, 128}, {{1000, 2000}, {4000, 8000}}));
  EXPECT_EQ(m.table().BatchUs(6, 100), 5500);
  // Nearest cell (8, 128): 10 ms at the predicted 5500 us reads as 8000 * 10000 / 5500 = 14545.45 there,
  // and the cell moves a tenth of the way: 8000 + 654.5 -> 8655.
  m.Observe(6, 100, 0.010);
  EXPECT_EQ(m.table().cost_us[1][1], 8655);
  EXPECT_EQ(m.table().cost_us[0][0], 1000);
  EXPECT_EQ(m.observed(), 1);
}

TEST(CostModel, GridIsPowersOfTwoWithTheLimits) {
  EXPECT_EQ(Grid(32, 512).first, (std::vector<int64_t>{1, 2, 4, 8, 16, 32}));
  EXPECT_EQ(Grid(24, 100).second, (std::vector<int64_t>{16, 32, 64, 100}));
  EXPECT_EQ(Grid(1, 8), (std::pair<std::vector<int64_t>, std::vector<int64_t>>{{1}, {8}}));
}

TEST(CostProfile, TheServersIdentityHasEveryKeyInOrder) {
  Manifest m;
  m.name = "default";
  m.version = "sha256:0";
  Config cfg;
  cfg.model_workers = kAutoWorkers;
  const ordered_json id = cost_profile::Identity(cfg, m);
  std::vector<std::string> keys;
  for (const auto& item : id.items()) keys.push_back(item.key());
  EXPECT_EQ(keys, cost_profile::IdentityKeys());
  EXPECT_EQ(id.dump(), "{\"model\":\"default\",\"model_version\":\"sha256:0\",\"backend\":\"onnxruntime\","
                       "\"device\":\"cpu\",\"precision\":\"fp32\",\"intra_op_threads\":2,\"model_workers\":0,"
                       "\"cpu\":" + ordered_json(cost_profile::CpuModel()).dump() + "}");
}

TEST(CostProfile, SavedLoadsBackForTheSameServer) {
  TempFile f;
  const CostTable t = CostTable::Make({1, 2}, {16, 32}, {{10, 20}, {30, 40}});
  cost_profile::Save(f.path, t, Identity(), 1.23456);
  EXPECT_EQ(cost_profile::Load(f.path, Identity()).table.cost_us, t.cost_us);
  std::ifstream in(f.path);
  const nlohmann::json doc = nlohmann::json::parse(in);
  EXPECT_EQ(doc.at("format"), "rmscore-cost-profile/1");
  EXPECT_EQ(doc.at("measured_seconds"), 1.235);
}

TEST(CostProfile, ARefinedTableIsKeptWithItsMeasurementAndCounted) {
  TempFile f;
  const CostTable t = CostTable::Make({1, 4}, {16, 128}, {{100, 900}, {300, 3000}});
  cost_profile::Save(f.path, t, Identity(), 1.5);
  auto read = [](const std::string& path) {
    std::ifstream in(path);
    return nlohmann::json::parse(in);
  };
  const nlohmann::json measured = read(f.path);
  CostModel model(t);
  model.Observe(4, 128, 0.006);
  cost_profile::SaveRefined(f.path, model.table(), Identity(), 3);
  cost_profile::SaveRefined(f.path, model.table(), Identity(), 2);
  nlohmann::json doc = read(f.path);
  EXPECT_EQ(doc.at("measured_at"), measured.at("measured_at"));
  EXPECT_EQ(doc.at("measured_seconds"), 1.5);
  EXPECT_EQ(doc.at("refined_batches"), 5);
  EXPECT_EQ(cost_profile::Load(f.path, Identity()).table.cost_us, model.table().cost_us);
  EXPECT_NE(model.table().cost_us, t.cost_us);
  // Another identity's file is replaced by this one's table (nothing of the other kept).
  cost_profile::Save(f.path, t, Identity(4), 1.5);
  cost_profile::SaveRefined(f.path, model.table(), Identity(), 4);
  doc = read(f.path);
  EXPECT_EQ(doc.at("refined_batches"), 4);
  EXPECT_FALSE(doc.contains("measured_at"));
  EXPECT_EQ(cost_profile::Load(f.path, Identity()).table.cost_us, model.table().cost_us);
}

TEST(CostProfile, AnotherServersProfileIsRefusedNamingWhatDiffers) {
  TempFile f;
  cost_profile::Save(f.path, CostTable::Make({1}, {16}, {{10}}), Identity(4), 1);
  EXPECT_EQ(ErrorOf([&] { cost_profile::Load(f.path, Identity(2)); }),
            "--cost-profile " + f.path + ": measured for intra_op_threads=4, but this server runs "
            "intra_op_threads=2; remove the file (or name another) to measure again");
  ordered_json other = Identity();
  other["model_version"] = "v2";
  EXPECT_EQ(ErrorOf([&] { cost_profile::Load(f.path, other); }),
            "--cost-profile " + f.path + ": measured for model_version='v1', but this server runs "
            "model_version='v2'; remove the file (or name another) to measure again");
}

TEST(CostProfile, AutoWorkersTakeTheProfilesCount) {
  TempFile f;
  cost_profile::Save(f.path, CostTable::Make({1}, {16}, {{10}}), Identity(2, 2), 1);
  EXPECT_EQ(cost_profile::Load(f.path, Identity(2, kAutoWorkers)).model_workers, 2);
  EXPECT_EQ(ErrorOf([&] { cost_profile::Load(f.path, Identity(2, 1)); }),
            "--cost-profile " + f.path + ": measured for model_workers=2, but this server runs "
            "model_workers=1; remove the file (or name another) to measure again");
}

TEST(CostProfile, CorruptOrForeignFilesAreRefused) {
  TempFile f;
  const std::string where = "--cost-profile " + f.path + ": ";
  f.Write("{\"format\": \"rmscore-cost-profile/1\", \"ident");
  EXPECT_EQ(ErrorOf([&] { cost_profile::Load(f.path, Identity()); }).rfind(where + "cannot read a cost profile: ", 0), 0u);
  f.Write("[1, 2]");
  EXPECT_EQ(ErrorOf([&] { cost_profile::Load(f.path, Identity()); }),
            where + "not a cost profile (format 'list', expected 'rmscore-cost-profile/1')");
  f.Write("{\"format\": \"other/2\"}");
  EXPECT_EQ(ErrorOf([&] { cost_profile::Load(f.path, Identity()); }),
            where + "not a cost profile (format 'other/2', expected 'rmscore-cost-profile/1')");
  ordered_json doc = {{"format", "rmscore-cost-profile/1"}, {"identity", Identity()},
                      {"table", {{"batch_sizes", {1}}, {"lengths", {16}}, {"cost_us", {{0}}}}}};
  f.Write(doc.dump());
  EXPECT_EQ(ErrorOf([&] { cost_profile::Load(f.path, Identity()); }),
            where + "corrupt table: cost table cost_us must be integers >= 1 microsecond, got [[0]]");
}

TEST(CostProfile, TheCpuIsTheFirstModelNameLine) {
  TempFile f;
  f.Write("processor\t: 0\nmodel name\t: AMD EPYC 7B13 \nflags\t: avx2\n\nmodel name\t: other\n");
  EXPECT_EQ(cost_profile::CpuModel(f.path), "AMD EPYC 7B13");
  EXPECT_EQ(cost_profile::CpuModel(f.dir + "/absent"), "unknown");
}

TEST(CostProfile, TheCacheFileIsNamedAsInPython) {
  // tests/unit/test_cost.py holds cost_profile.cache_path to the same name.
  ordered_json id = Identity();
  id["model"] = "my model/v2";
  EXPECT_EQ(cost_profile::CachePath("/c", id, 32), "/c/my_model_v2-onnxruntime-cpu-fp32-2t-b32.json");
}

TEST(CostProfile, ACachedProfileThatDoesNotMatchIsMeasuredAgainSayingWhy) {
  TempFile f;
  std::vector<std::string> said;
  auto progress = [&](const std::string& l) { said.push_back(l); };
  EXPECT_FALSE(cost_profile::LoadCached(f.path, Identity(), progress));
  EXPECT_EQ(said.back(), "cost profile: none cached at " + f.path + ": measuring");
  ordered_json amd = Identity();
  amd["cpu"] = "AMD EPYC 7B13";
  cost_profile::Save(f.path, CostTable::Make({1}, {16}, {{10}}), amd, 1);
  EXPECT_FALSE(cost_profile::LoadCached(f.path, Identity(), progress));
  EXPECT_EQ(said.back(), "cost profile: not used: cached cost profile " + f.path +
                             ": measured for cpu='AMD EPYC 7B13', but this server runs cpu='Xeon'; measuring again "
                             "(the file will be replaced)");
  f.Write("{half a profi");
  EXPECT_FALSE(cost_profile::LoadCached(f.path, Identity(), progress));
  EXPECT_NE(said.back().find("cannot read a cost profile"), std::string::npos);
  cost_profile::Save(f.path, CostTable::Make({1}, {16}, {{10}}), Identity(), 1);
  EXPECT_EQ(cost_profile::LoadCached(f.path, Identity(), progress)->table.cost_us[0][0], 10);
}

TEST(CostProfile, ACachedTableRefinedBeforeProfilesSaidTheirTimingIsMeasuredAgain) {
  // Refined by the wall clock, other processes' load in its cells: not used. tests/unit/test_cost.py
  // holds Python's cache to the same.
  TempFile f;
  std::vector<std::string> said;
  auto progress = [&](const std::string& l) { said.push_back(l); };
  const CostTable table = CostTable::Make({1}, {16}, {{10}});
  for (const char* timing : {cost_profile::kThreadCpu, cost_profile::kWall}) {
    cost_profile::SaveRefined(f.path, table, Identity(), 3, timing);
    EXPECT_EQ(ordered_json::parse(f.Read()).at("timing"), timing);
    EXPECT_TRUE(cost_profile::LoadCached(f.path, Identity(), progress));
  }
  ordered_json old = ordered_json::parse(f.Read());
  old.erase("timing");
  f.Write(old.dump());
  EXPECT_FALSE(cost_profile::LoadCached(f.path, Identity(), progress));
  EXPECT_EQ(said.back(), "cost profile: not used: cached cost profile " + f.path +
                             ": refined by the wall clock before profiles said how they were timed, so other "
                             "processes' load is in its cells; measuring again (the file will be replaced)");
  EXPECT_EQ(cost_profile::Load(f.path, Identity()).table.cost_us[0][0], 10);  // the operator's file: as written
  // Measured and never refined, it is used.
  cost_profile::Save(f.path, table, Identity(), 1);
  old = ordered_json::parse(f.Read());
  old.erase("timing");
  f.Write(old.dump());
  EXPECT_TRUE(cost_profile::LoadCached(f.path, Identity(), progress));
}

TEST(CostProfile, MeasureWithinTheBudgetExtrapolatesTheRest) {
  // A stand-in runtime: 1 us per token. With room, every shape is measured; with none, only the first
  // (1 x 16) is, and the rest are in proportion to tokens.
  auto run = [](int64_t b, int64_t n) { return double(b * n) * 1e-6; };
  std::vector<std::string> lines;
  auto progress = [&](const std::string& l) { lines.push_back(l); };
  const cost_profile::Measured all = cost_profile::Measure(run, 4, 32, 60, progress);
  EXPECT_EQ(all.table.cost_us, (std::vector<std::vector<int64_t>>{{16, 32}, {32, 64}, {64, 128}}));
  EXPECT_EQ(lines.size(), 1u);  // the last of 6 shapes
  lines.clear();
  const cost_profile::Measured one = cost_profile::Measure(run, 4, 32, 1e-12, progress);
  EXPECT_EQ(one.table.cost_us, all.table.cost_us);
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(lines[0], "cost profile: budget 1e-12 s spent after 1/6 shapes; the rest extrapolated");
}

}  // namespace
}  // namespace rmscore
