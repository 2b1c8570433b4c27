// Measuring, saving and loading the cost table (cost.h) a server plans with:
// server_py/rmscore/core/cost_profile.py in C++, reading and writing the same file format.
//
// At warm-up a server times a small grid of batch shapes on its own runtime (Measure, bounded by
// --cost-profile-seconds); with --cost-profile FILE it saves the table there, and a restart loads it
// instead of measuring again; without it the table is cached in --cost-profile-dir (CachePath), where a
// file that does not match is measured again and replaced instead of refused. A profile holds the
// identity of what it measured (the CPU's name included): a --cost-profile measured for anything else
// is refused with a message naming what differs, and a file that is not a profile is refused as such.
// Nothing is served from a refused profile: the server does not start.
#pragma once

#include <functional>
#include <optional>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <vector>

#include "config.h"
#include "cost.h"
#include "manifest.h"

namespace rmscore::cost_profile {

inline constexpr const char* kFormat = "rmscore-cost-profile/1";
// How a profile's batches were timed (its "timing"): by the CPU time of the thread that ran them, where a
// run works on its caller's thread alone (a 1-thread session on a CPU), else by the wall clock. A cached
// file refined before profiles said so was refined by the wall clock, other processes' load in its
// cells: LoadCached does not use it (server_py's cost_profile module docstring has the figures).
inline constexpr const char* kThreadCpu = "thread-cpu";
inline constexpr const char* kWall = "wall";
// How a table of runs on sessions of `threads_per_run` intra-op threads is timed: by the running thread's
// CPU time where a run works on its caller's thread alone (one thread, on a CPU), else by the wall clock
// (a GPU's work is not the thread's). Python's cost_profile.timing.
inline const char* Timing(bool on_cpu, int threads_per_run) {
  return on_cpu && threads_per_run == 1 ? kThreadCpu : kWall;
}
// What a profile must match, in the order a mismatch is reported.
const std::vector<std::string>& IdentityKeys();

// A profile that cannot be used: not one, corrupt, or measured for another server. Nothing is served
// from it: the server refuses to start (exit code 2, like a bad flag).
struct ProfileError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// What a profile for a server of this model repository and configuration must match: the same keys
// and values as the Python ONNX Runtime server's (cost_profile.identity), so either server loads a
// profile the other wrote on the same machine.
nlohmann::ordered_json Identity(const Config& cfg, const Manifest& m);

struct Profile {
  CostTable table;
  int64_t model_workers = 1;  // the workers it was measured with
};
// The table in `path` and the model workers it was measured with, or ProfileError saying why a server
// of `identity` cannot use it. model_workers 0 in `identity` (--model-workers auto) matches any count:
// the server then runs the profile's.
// `where` names the file in messages (empty: "--cost-profile PATH", strict: the message says what to do).
// A cached file (`where` given) refined before profiles said their timing is refused too; the
// operator's file is loaded as written.
Profile Load(const std::string& path, const nlohmann::ordered_json& identity, const std::string& where = "");

// The CPU's name as the kernel gives it (the first "model name" line of `cpuinfo`), or "unknown".
std::string CpuModel(const std::string& cpuinfo = "/proc/cpuinfo");
// The cached profile's file for a server of `identity` in `dir` (cost_profile.cache_path): the parts that
// pick a table in its name, the rest checked inside it.
std::string CachePath(const std::string& dir, const nlohmann::ordered_json& identity, int64_t max_batch_size);
// The cached profile, or nullopt (said through `progress`, with the reason) when there is none or it
// cannot be used (another CPU, model version, corrupt): then the server measures again and replaces it.
std::optional<Profile> LoadCached(const std::string& path, const nlohmann::ordered_json& identity,
                                  const std::function<void(const std::string&)>& progress);
// Writes the profile atomically (a crash leaves the old file or none, never half of one).
// `timing`: how its batches were timed (kThreadCpu or kWall).
void Save(const std::string& path, const CostTable& table, const nlohmann::ordered_json& identity, double seconds,
          const std::string& timing = kWall);
// Writes the table as the batches served refined it (CostModel::Observe), so the next start plans with
// what this machine showed under load, not only with its warm-up's few timings: the measurement's
// fields are kept, "refined_batches" counts the batches that refined it since, over every start, and
// "refined_at" says when. A file that is not this identity's profile is replaced. Python's save_refined.
void SaveRefined(const std::string& path, const CostTable& table, const nlohmann::ordered_json& identity,
                 int64_t batches, const std::string& timing = kWall);

// Scores one batch of B sequences of L tokens; returns its seconds.
using TimeBatch = std::function<double(int64_t b, int64_t n)>;
struct Measured {
  CostTable table;
  double seconds = 0;
};
// Times the grid's shapes, cheapest first, until `budget_s` is spent. Each shape runs twice and keeps
// the faster (the first run of a shape pays allocation). Shapes left unmeasured are extrapolated in
// proportion to tokens from the largest measured shape of their length (or of any length).
Measured Measure(const TimeBatch& run, int64_t max_batch_size, int64_t max_length, double budget_s,
                 const std::function<void(const std::string&)>& progress);

// The table as text: milliseconds per sequence, batch sizes down, lengths across.
std::string Describe(const CostTable& table);

}  // namespace rmscore::cost_profile
