// rmscore-server-cpp: start-up, readiness and the SIGTERM drain.
//
// Order: flags -> manifest -> metrics endpoint -> gRPC bound (health
// NOT_SERVING, calls refused "not ready: warming up") -> port file -> model
// loaded, warmed up (--warmup-rounds), cost table measured or loaded (--batching cost_aware,
// --cost-profile) and golden self-check -> SERVING. A --cost-profile file that is corrupt or
// measured for another server refuses to start (exit code 2) before anything loads. On SIGTERM/SIGINT: NOT_SERVING,
// new calls refused "not ready: draining", accepted work finished, exit 0. Health "liveness" is
// SERVING from the bind on, and NOT_SERVING only while the batcher is stalled (liveness.h).
#include <google/protobuf/stubs/logging.h>
#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <signal.h>
#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>
#include <random>
#include <sstream>
#include <thread>

#include "batcher.h"
#include "config.h"
#include "cost.h"
#include "cost_profile.h"
#include "liveness.h"
#include "manifest.h"
#include "metrics.h"
#include "model_runner.h"
#include "reflection_v1.h"
#include "service.h"
#include "transport.h"

namespace rmscore {
namespace {

constexpr const char* kServiceName = "rmscore.v1.RewardModel";

double SecondsSince(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// Written aside, then renamed, so a reader never sees half a file.
void WritePortFile(const std::string& path, int port, int metrics_port) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << "{\"port\": " << port << ", \"metrics_port\": " << metrics_port << "}\n";
    if (!out) throw std::runtime_error("cannot write --port-file " + tmp);
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) throw std::runtime_error("cannot rename " + tmp + " to " + path);
}

void SetHealth(grpc::Server& server, bool serving) {
  auto* health = server.GetHealthCheckService();
  health->SetServingStatus("", serving);
  health->SetServingStatus(kServiceName, serving);
}

// SIGTERM/SIGINT arrived (they stay pending, blocked, until sigwait takes them).
bool StopPending(const sigset_t& signals) {
  sigset_t pending;
  sigpending(&pending);
  return (sigismember(&signals, SIGTERM) && sigismember(&pending, SIGTERM)) ||
         (sigismember(&signals, SIGINT) && sigismember(&pending, SIGINT));
}

// The same warm-up set as the Python ONNX Runtime backend (backends/ort.py):
// one tiny batch and one mid-sized one, so the first real batches find the
// runtime's kernels and arena ready. All-ones ids are valid in any vocabulary.
// Stops early when a stop signal is pending: a long --warmup-rounds must not delay a shutdown.
void WarmUp(ModelRunner& runner, const Config& cfg, const sigset_t& signals) {
  const Clock::time_point t = Clock::now();
  const int64_t shapes[][2] = {{1, 8}, {std::min<int64_t>(8, cfg.max_batch_size), 64}};
  int round = 0;
  for (; round < cfg.warmup_rounds && !StopPending(signals); ++round) {
    for (const auto& [batch, length] : shapes) {
      PackedBatch b;
      b.batch = batch;
      b.longest = length;
      b.input_ids.assign(size_t(batch * length), 1);
      b.attention_mask.assign(size_t(batch * length), 1);
      b.real_tokens = batch * length;
      runner.Run(b);
    }
  }
  std::cout << "rmscore warm-up rounds=" << round << " warmup_s=" << SecondsSince(t) << std::endl;
}

void Progress(const std::string& line) { std::cout << "rmscore " << line << std::endl; }

// Where a measured cost table is saved: --cost-profile, else (cost_aware only) the cache; empty: nowhere.
std::string ProfilePath(const Config& cfg, const nlohmann::ordered_json& identity) {
  if (!cfg.cost_profile.empty()) return cfg.cost_profile;
  if (cfg.batching != BatchingMode::kCostAware || cfg.cost_profile_dir.empty()) return "";
  return cost_profile::CachePath(cfg.cost_profile_dir, identity, cfg.max_batch_size);
}

// The table in --cost-profile when that file exists, else the cached one (cost_aware). Checked before
// anything loads, so a wrong or corrupt --cost-profile refuses to start at once, as a bad flag does
// (ConfigError: exit code 2); a cached one that does not match is measured again instead. Under
// --model-workers auto the profile's worker count is taken (*identity): no second measurement.
std::optional<CostTable> LoadSavedProfile(const Config& cfg, nlohmann::ordered_json* identity) {
  std::optional<cost_profile::Profile> profile;
  const std::string path = ProfilePath(cfg, *identity);
  if (!cfg.cost_profile.empty()) {
    struct stat st {};
    if (::stat(cfg.cost_profile.c_str(), &st) != 0) return std::nullopt;
    try {
      profile = cost_profile::Load(cfg.cost_profile, *identity);
    } catch (const cost_profile::ProfileError& e) {
      throw ConfigError(e.what());
    }
  } else if (!path.empty()) {
    profile = cost_profile::LoadCached(path, *identity, Progress);
  }
  if (!profile) return std::nullopt;
  (*identity)["model_workers"] = profile->model_workers;
  std::cout << "rmscore cost profile loaded from " << path << std::endl;
  return std::move(profile->table);
}

// Saves a measured table where ProfilePath says. A cache that cannot be written (a read-only home in a
// container) costs the next start a measurement, not this one its start; --cost-profile must be written.
void SaveProfile(const Config& cfg, const std::string& path, const CostTable& table,
                 const nlohmann::ordered_json& identity, double seconds, const std::string& timing) {
  if (path.empty()) return;
  try {
    if (cfg.cost_profile.empty()) {
      std::error_code ec;
      std::filesystem::create_directories(std::filesystem::path(path).parent_path(), ec);
    }
    cost_profile::Save(path, table, identity, seconds, timing);
  } catch (const std::exception& e) {
    if (!cfg.cost_profile.empty()) throw;
    Progress("cost profile: cannot cache it at " + path + ": " + e.what() + "; serving without saving it");
    return;
  }
  std::cout << "rmscore cost profile saved to " << path << std::endl;
}

// `b` sequences of `n` random ids from the vocabulary's upper part (clear of special tokens), unpadded.
PackedBatch RandomBatch(int64_t b, int64_t n, int64_t vocab_size, std::mt19937_64& rng) {
  std::uniform_int_distribution<int64_t> id(std::min<int64_t>(1000, vocab_size - 1), vocab_size - 1);
  PackedBatch batch;
  batch.batch = b;
  batch.longest = n;
  for (int64_t i = 0; i < b * n; ++i) batch.input_ids.push_back(id(rng));
  batch.attention_mask.assign(size_t(b * n), 1);
  batch.real_tokens = b * n;
  return batch;
}

// The cost table: the profile loaded at start, or measured now within --cost-profile-seconds (and
// saved with --cost-profile or in the cache, ProfilePath). nullptr when nothing plans with it and no profile was asked for:
// measuring costs start-up time.
// `timing`: how the runs are timed (cost_profile::Timing; LoadModel says which).
std::shared_ptr<CostModel> MakeCostModel(const Config& cfg, const Manifest& m, ModelRunner& runner,
                                         const nlohmann::ordered_json& identity, std::optional<CostTable> table,
                                         const std::string& timing) {
  if (cfg.batching != BatchingMode::kCostAware && cfg.cost_profile.empty()) return nullptr;
  if (!table) {
    const std::string path = ProfilePath(cfg, identity);
    std::mt19937_64 rng(0);
    auto run = [&](int64_t b, int64_t n) {
      const PackedBatch batch = RandomBatch(b, n, m.vocab_size, rng);
      const Clock::time_point t = Clock::now();
      const double cpu = ThreadCpuSeconds();
      runner.Run(batch);
      return timing == cost_profile::kThreadCpu ? ThreadCpuSeconds() - cpu : SecondsSince(t);
    };
    const cost_profile::Measured got =
        cost_profile::Measure(run, cfg.max_batch_size, m.max_sequence_length, cfg.cost_profile_seconds, Progress);
    table = got.table;
    SaveProfile(cfg, path, *table, identity, got.seconds, timing);
  }
  std::cout << cost_profile::Describe(*table) << std::endl;
  return std::make_shared<CostModel>(*table);
}

using Workers = std::vector<std::unique_ptr<ModelRunner>>;

// `count` sessions, each with its share of the intra-op threads.
Workers CreateWorkers(const Config& cfg, const Manifest& m, int count) {
  Config per_worker = cfg;
  per_worker.intra_op_threads = cfg.intra_op_threads / count;
  per_worker.model_workers = 1;
  Workers workers;
  for (int i = 0; i < count; ++i) workers.push_back(std::make_unique<ModelRunner>(per_worker, m));
  return workers;
}

// The batch `auto` times (server_py's runtimes/workers.py): a mid-sized, mid-length batch of a trainer's load.
constexpr int64_t kProbeBatch = 8, kProbeLength = 128;
constexpr double kProbeSeconds = 1.5;

// Sequences per second with every worker scoring `probe` at once, each in its own thread.
double Throughput(const Workers& workers, const PackedBatch& probe) {
  for (const auto& w : workers) w->Run(probe);  // the first run of a shape allocates: not timed
  std::vector<int64_t> done(workers.size(), 0);
  const Clock::time_point t0 = Clock::now();
  const Clock::time_point end = t0 + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(kProbeSeconds));
  std::vector<std::thread> threads;
  for (size_t i = 0; i < workers.size(); ++i) {
    threads.emplace_back([&, i] {
      while (Clock::now() < end) {
        workers[i]->Run(probe);
        done[i] += probe.batch;
      }
    });
  }
  for (std::thread& t : threads) t.join();
  int64_t total = 0;
  for (int64_t d : done) total += d;
  return double(total) / SecondsSince(t0);
}

// What the server scores with (server_py's runtimes/workers.py, Workers, says why elastic is built so).
struct Sessions {
  Workers owned;                    // every session once: warmed up, and aborted by Stop
  std::vector<ModelRunner*> runs;   // one per batcher thread; the same session may be listed more than once
  ModelRunner* lone = nullptr;      // a batch alone: every intra-op thread; nullptr: the runs have them
};

// --model-workers elastic: one batcher thread per intra-op thread, all calling one 1-thread session (an
// ONNX Runtime run is thread-safe and works on its caller's thread: one copy of the weights), and a
// session of every intra-op thread for a batch that starts alone. One session when there is one thread
// or the batch runs on a GPU.
Sessions ElasticSessions(const Config& cfg, const Manifest& m) {
  Sessions s;
  const int threads = cfg.intra_op_threads;
  if (threads == 1 || cfg.device != Device::kCpu) {
    s.owned = CreateWorkers(cfg, m, 1);
    s.runs = {s.owned[0].get()};
    std::cout << "rmscore model workers: elastic keeps 1 x " << threads << " intra-op threads ("
              << (threads == 1 ? "one intra-op thread" : "a GPU") << ")" << std::endl;
    return s;
  }
  Config shared = cfg;
  shared.intra_op_threads = 1;
  shared.model_workers = 1;
  Config lone = cfg;
  lone.model_workers = 1;
  s.owned.push_back(std::make_unique<ModelRunner>(shared, m));
  s.owned.push_back(std::make_unique<ModelRunner>(lone, m));
  s.runs.assign(size_t(threads), s.owned[0].get());
  s.lone = s.owned[1].get();
  std::cout << "rmscore model workers: elastic, up to " << threads << " batches at once on one 1-thread session, "
            << "a batch alone on a " << threads << "-thread one" << std::endl;
  return s;
}

// The workers to serve with: `fixed` of them, or (--model-workers auto: kAutoWorkers) the count among
// 1, 2, 4, ... <= --intra-op-threads that scored the most sequences per second, said at start-up.
Workers StartWorkers(const Config& cfg, const Manifest& m, int fixed) {
  if (fixed != kAutoWorkers) {
    Workers workers = CreateWorkers(cfg, m, fixed);
    std::cout << "rmscore model workers: " << fixed << " x " << cfg.intra_op_threads / fixed << " intra-op threads"
              << std::endl;
    return workers;
  }
  std::mt19937_64 rng(0);
  const PackedBatch probe = RandomBatch(kProbeBatch, kProbeLength, m.vocab_size, rng);
  Workers best;
  double best_rate = 0;
  std::string seen;
  for (int count = 1; count <= cfg.intra_op_threads; count *= 2) {
    Workers workers = CreateWorkers(cfg, m, count);
    const double rate = Throughput(workers, probe);
    char line[96];
    std::snprintf(line, sizeof line, "%s%d x %d: %.1f seq/s", seen.empty() ? "" : "; ", count,
                  cfg.intra_op_threads / count, rate);
    seen += line;
    if (best.empty() || rate > best_rate) best = std::move(workers), best_rate = rate;
  }
  std::cout << "rmscore model workers: " << best.size() << " x " << cfg.intra_op_threads / int(best.size())
            << " intra-op threads (auto, batch " << kProbeBatch << " x " << kProbeLength << ": " << seen << ")"
            << std::endl;
  return best;
}

// Blocks until SIGTERM or SIGINT (blocked in every thread since start).
int WaitForSignal(const sigset_t& signals) {
  int sig = 0;
  while (sigwait(&signals, &sig) != 0) {
  }
  return sig;
}

// Every service the port serves, as reflection lists them.
std::vector<std::string> ServiceNames() {
  return {kServiceName, "grpc.health.v1.Health", "grpc.reflection.v1alpha.ServerReflection",
          grpc::reflection::v1::ServerReflection::service_full_name()};
}

// Binds gRPC with health NOT_SERVING: scoring calls are refused "not ready: warming up" until
// StartServing. Reflection: v1alpha from gRPC's plugin, v1 from `reflection`. *port: the bound port.
std::unique_ptr<grpc::Server> StartGrpc(const Config& cfg, RewardModelService& service, ReflectionV1& reflection,
                                        Metrics& metrics, int* port) {
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  builder.AddListeningPort(cfg.host + ":" + std::to_string(cfg.port), ServerCredentialsFor(cfg, &metrics), port);
  ConfigureTransport(cfg, &builder);
  builder.RegisterService(&service);
  builder.RegisterService(&reflection);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (!server || *port == 0) {
    throw std::runtime_error("cannot listen on " + cfg.host + ":" + std::to_string(cfg.port));
  }
  SetHealth(*server, false);
  // Liveness (docs/contract.md): alive while warming up and draining; the LivenessWatch in
  // ServeAndDrain turns it NOT_SERVING while the batcher is stalled. gRPC's default health service
  // answers Check and Watch from its own threads, which a stuck batcher thread does not block.
  server->GetHealthCheckService()->SetServingStatus(kLivenessService, true);
  return server;
}

// The golden self-check; throws when the scores are off, so the server never says SERVING.
void SelfCheck(ModelRunner& runner, const Manifest& manifest, const Config& cfg) {
  const SelfCheckReference ref = SelfCheckReferenceFor(manifest, cfg.precision);
  const double diff = runner.SelfCheck(manifest, cfg.precision);
  std::cout << "rmscore self-check " << ToString(cfg.precision) << " graph=" << runner.graph_path()
            << " golden=" << manifest.golden_inputs.size() << " alone, "
            << SelfCheckPaddedRows(manifest.golden_inputs).size() << " as one padded batch, vs " << ref.what
            << " max_abs_diff=" << diff << " tolerance=" << ref.tolerance << std::endl;
  if (!(diff <= ref.tolerance)) {
    std::ostringstream msg;
    msg << "self-check failed: max abs diff " << diff << " vs " << ref.what << " exceeds the tolerance "
        << ref.tolerance << "; refusing to serve";
    throw std::runtime_error(msg.str());
  }
}

struct Loaded {
  Sessions sessions;                // none: a stop signal came first
  std::shared_ptr<CostModel> cost;  // nullptr: not planned with (see MakeCostModel)
  double seed_us_per_token = 0;     // admission's first rate (WorkSeed)
  // Keeps the table the batches refined for the next start (the batcher's on_refined): set where the
  // table is cached, never for the operator's --cost-profile file, which a restart loads as written.
  std::function<void(const CostTable&, int64_t)> keep_refined;
  bool on_thread_cpu = false;  // the batcher refines the table by its thread's CPU time (LoadModel)
};

// What liveness needs from Run: the stall clock (shared with the gauge) and the fault hook.
struct LivenessParts {
  std::shared_ptr<StallClock> stall;
  HangHook* hang = nullptr;
};

// Admission's first rate (admission.h), model microseconds per token: one batch of sequences as long
// as the model takes (up to kSeedLength); the batches served refine it from the first one on. Long,
// because a token costs more in a long sequence: seeded from 64 tokens the rate was half the real one
// while the first 512-token batches ran, and a probe admitted on it expired in the queue. Read from
// the cost table where there is one (it timed that shape, at this start or one with the same
// identity), else timed once here: a second of every start at 512 tokens. As server_py's _work_seed
// (its docstring says more).
constexpr int64_t kSeedLength = 512;

double WorkSeed(ModelRunner& runner, const Config& cfg, const Manifest& manifest, const CostModel* cost) {
  PackedBatch b;
  b.batch = std::min<int64_t>(8, cfg.max_batch_size);
  b.longest = std::min<int64_t>(kSeedLength, manifest.max_sequence_length);
  if (cost) return double(cost->table().BatchUs(b.batch, b.longest)) / double(b.batch * b.longest);
  b.input_ids.assign(size_t(b.batch * b.longest), 1);
  b.attention_mask.assign(size_t(b.batch * b.longest), 1);
  b.real_tokens = b.batch * b.longest;
  const Clock::time_point t = Clock::now();
  runner.Run(b);
  return std::chrono::duration<double, std::micro>(Clock::now() - t).count() / double(b.real_tokens);
}

// Starts the model workers (the count in *identity: the flag's, or a loaded profile's; measured for
// auto), warms them up, measures the cost table on the first (unless `profiled` has it) and
// self-checks it; stops early when a stop signal came first (checked before each step).
Loaded LoadModel(const Config& cfg, const Manifest& manifest, const sigset_t& signals,
                 nlohmann::ordered_json* identity, std::optional<CostTable> profiled) {
  const int asked = (*identity)["model_workers"].get<int>();
  Sessions sessions;
  if (asked == kElasticWorkers) {
    sessions = ElasticSessions(cfg, manifest);
  } else {
    sessions.owned = StartWorkers(cfg, manifest, asked);
    for (const auto& w : sessions.owned) sessions.runs.push_back(w.get());
    (*identity)["model_workers"] = sessions.owned.size();  // what a saved profile says it measured (auto)
  }
  for (const auto& w : sessions.owned) {
    if (StopPending(signals)) return {};
    WarmUp(*w, cfg, signals);
  }
  // The first run session: the cost table and the seed are measured on what runs under load.
  ModelRunner& first = *sessions.runs[0];
  if (StopPending(signals)) return {};
  // Every run session works on its caller's thread alone (one intra-op thread on a CPU, as elastic's
  // workers): the cost table is timed by that thread's CPU time (Batcher::Options::refine_on_thread_cpu).
  const std::string timing =
      cost_profile::Timing(cfg.device == Device::kCpu, cfg.intra_op_threads / int(sessions.runs.size()));
  std::shared_ptr<CostModel> cost = MakeCostModel(cfg, manifest, first, *identity, std::move(profiled), timing);
  std::optional<LongestBatch> longest;
  if (cost) longest = LongestBatchOf(cost->table(), cfg.max_batch_size, cfg.max_batch_tokens, manifest.max_sequence_length);
  const auto [note, warning] = ThresholdNote(cfg.liveness_stall_seconds, longest);
  PrintLivenessLine(note, warning);
  if (StopPending(signals)) return {};
  SelfCheck(first, manifest, cfg);
  if (StopPending(signals)) return {};
  const double seed = WorkSeed(first, cfg, manifest, cost.get());
  // The self-check's padded batch and the cost profile's grew the arena past what serving starts with.
  for (const auto& w : sessions.owned) w->ReleaseMemory();
  std::function<void(const CostTable&, int64_t)> keep_refined;
  if (const std::string path = ProfilePath(cfg, *identity); cost && cfg.cost_profile.empty() && !path.empty()) {
    keep_refined = [path, id = *identity, timing](const CostTable& table, int64_t batches) {
      try {
        cost_profile::SaveRefined(path, table, id, batches, timing);
      } catch (const std::exception& e) {  // a cache not written costs the next start this refinement only
        Progress(std::string("cost profile: cannot keep the refined table at ") + path + ": " + e.what());
      }
    };
  }
  return {std::move(sessions), std::move(cost), seed, std::move(keep_refined), timing == cost_profile::kThreadCpu};
}

// Serves until SIGTERM/SIGINT, then drains: accepted work may run until the grace less the shutdown
// reserve, what is left fails, and the transports close (docs/cpp_server.md, "Shutdown").
void ServeAndDrain(const Config& cfg, const Manifest& manifest, const Loaded& loaded, RewardModelService& service,
                   grpc::Server& server, Metrics& metrics, const sigset_t& signals, Clock::time_point t0,
                   const LivenessParts& live) {
  Batcher::Options bopts;
  bopts.planner = PlannerConfig{cfg.max_batch_size, cfg.max_batch_tokens, cfg.max_queue_delay_us(), cfg.batching,
                                cfg.max_batch_us()};
  bopts.max_queue_sequences = cfg.max_queue_sequences;
  bopts.pad_token_id = manifest.pad_token_id;
  bopts.cost = loaded.cost;
  bopts.max_queue_wait_us = int64_t(cfg.max_queue_wait_seconds * 1e6);
  bopts.seed_us_per_token = loaded.seed_us_per_token;
  bopts.progress = live.stall;
  const Workers& owned = loaded.sessions.owned;
  bopts.on_idle = [&owned] {
    for (const auto& w : owned) w->ReleaseMemory();
  };
  bopts.on_refined = loaded.keep_refined;
  bopts.refine_on_thread_cpu = loaded.on_thread_cpu;
  HangHook* hang = live.hang;  // RMSCORE_FAULT_HANG_BATCH (tests only): a stuck device
  std::vector<BatchModel> models;
  for (ModelRunner* model : loaded.sessions.runs) {
    models.push_back([model, hang](const PackedBatch& b) {
      hang->BeforeBatch();
      return model->Run(b);
    });
  }
  BatchModel lone;
  if (ModelRunner* model = loaded.sessions.lone) {
    lone = [model, hang](const PackedBatch& b) {
      hang->BeforeBatch();
      return model->Run(b);
    };
  }
  Batcher batcher(bopts, std::move(models), &metrics, [&owned] {
    for (const auto& w : owned) w->Abort();
  }, std::move(lone));
  service.StartServing(&batcher);
  Liveness liveness(live.stall, cfg.liveness_stall_seconds);
  // Until Stop below: the health service ignores a status set after server.Shutdown anyway.
  LivenessWatch watch(&liveness, [&server](bool alive) {
    server.GetHealthCheckService()->SetServingStatus(kLivenessService, alive);
  });
  PinMmapThreshold();  // request-sized buffers are unmapped when freed (transport.h says why)
  HeapTrimmer trimmer(kHeapTrimInterval);
  SetHealth(server, true);
  std::cout << "rmscore ready model=" << manifest.name << " version=" << manifest.version
            << " device=" << ToString(cfg.device) << " startup_s=" << SecondsSince(t0) << std::endl;

  const int sig = WaitForSignal(signals);
  const Clock::time_point t_sig = Clock::now();
  std::cout << "rmscore draining on signal " << sig << std::endl;
  SetHealth(server, false);
  service.StartDraining();
  const auto until = t_sig + std::chrono::duration_cast<Clock::duration>(
                                 std::chrono::duration<double>(cfg.drain_grace_seconds - cfg.shutdown_reserve_s()));
  const bool drained = batcher.Drain(until);
  batcher.Stop();  // fails what is left (only when not drained), so no call stays open
  watch.Stop();
  // Reactors may still call the batcher (a cancellation) until the server is down: it outlives it.
  server.Shutdown(std::chrono::system_clock::now() + std::chrono::milliseconds(500));
  server.Wait();
  metrics.StopServing();
  std::cout << "rmscore stopped drained=" << (drained ? "true" : "false") << " drain_s=" << SecondsSince(t_sig)
            << std::endl;
}

int Run(const Config& cfg, const sigset_t& signals) {
  const Clock::time_point t0 = Clock::now();
  const Manifest manifest = LoadManifest(cfg.model_dir);
  nlohmann::ordered_json identity = cost_profile::Identity(cfg, manifest);
  std::optional<CostTable> profiled = LoadSavedProfile(cfg, &identity);
  std::string tokenizer_json = ReadFile(manifest.TokenizerPath());

  HangHook hang(HangFaultFromEnv());  // a bad RMSCORE_FAULT_HANG_BATCH refuses the start (exit 2)
  // Declared before the Metrics that read it at each scrape, so it outlives the metrics endpoint.
  const auto stall = std::make_shared<StallClock>();
  Metrics metrics(manifest.name, manifest.version, ToString(cfg.device));
  metrics.SetQueueCapacity(cfg.max_queue_sequences);
  metrics.SetStalledSource([stall] { return double(stall->StalledUs(StallClock::NowUs())) / 1e6; });
  const int metrics_port = metrics.Serve(cfg.host, cfg.metrics_port);
  RewardModelService service(cfg, manifest, std::move(tokenizer_json), &metrics);
  ReflectionV1 reflection(ServiceNames());
  int port = 0;
  std::unique_ptr<grpc::Server> server = StartGrpc(cfg, service, reflection, metrics, &port);
  if (!cfg.port_file.empty()) WritePortFile(cfg.port_file, port, metrics_port);
  std::cout << "rmscore listening port=" << port << " metrics_port=" << metrics_port << std::endl;

  Loaded loaded;
  try {
    loaded = LoadModel(cfg, manifest, signals, &identity, std::move(profiled));
  } catch (...) {
    server->Shutdown(std::chrono::system_clock::now());
    throw;
  }
  if (loaded.sessions.owned.empty()) {  // stopped while loading, warming up or self-checking: never SERVING, nothing to drain
    std::cout << "rmscore stopped during warm-up" << std::endl;
    server->Shutdown(std::chrono::system_clock::now());
    server->Wait();
    metrics.StopServing();
    return 0;
  }
  ServeAndDrain(cfg, manifest, loaded, service, *server, metrics, signals, t0, LivenessParts{stall, &hang});
  return 0;
}

}  // namespace
}  // namespace rmscore

// libprotobuf logs an ERROR line for every message with invalid UTF-8 in a
// string field. That is the client's input, already answered INVALID_ARGUMENT;
// logging it would let any client fill the server's log. Other lines go on.
static void ProtobufLog(google::protobuf::LogLevel level, const char* file, int line, const std::string& message) {
  if (message.find("invalid UTF-8") != std::string::npos) return;
  std::cerr << "[libprotobuf " << (level >= google::protobuf::LOGLEVEL_ERROR ? "ERROR" : "WARNING") << " " << file
            << ":" << line << "] " << message << std::endl;
}

int main(int argc, char** argv) {
  google::protobuf::SetLogHandler(&ProtobufLog);
  // Block the stop signals in every thread (threads inherit the mask); the
  // main thread takes them with sigwait once serving.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  rmscore::Config cfg;
  try {
    bool help = false;
    cfg = rmscore::ParseConfig(std::vector<std::string>(argv + 1, argv + argc), &help);
    if (help) {
      std::cout << rmscore::Usage();
      return 0;
    }
  } catch (const rmscore::ConfigError& e) {
    std::cerr << "rmscore-server-cpp: " << e.what() << std::endl;
    return 2;
  }
  try {
    return rmscore::Run(cfg, signals);
  } catch (const rmscore::ConfigError& e) {  // what only the model repository tells, e.g. a cost profile for another model
    std::cerr << "rmscore-server-cpp: " << e.what() << std::endl;
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "rmscore-server-cpp: " << e.what() << std::endl;
    return 1;
  }
}
