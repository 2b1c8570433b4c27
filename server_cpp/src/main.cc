// rmscore-server-cpp: start-up, readiness and the SIGTERM drain.
//
// Order: flags -> manifest -> metrics endpoint -> gRPC bound (health
// NOT_SERVING, calls refused "not ready: warming up") -> port file -> model
// loaded, warmed up (--warmup-rounds) and golden self-check -> SERVING. On SIGTERM/SIGINT: NOT_SERVING,
// new calls refused "not ready: draining", accepted work finished, exit 0.
#include <google/protobuf/stubs/logging.h>
#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <sstream>

#include "batcher.h"
#include "config.h"
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
  return server;
}

// The golden self-check; throws when the scores are off, so the server never says SERVING.
void SelfCheck(ModelRunner& runner, const Manifest& manifest, const Config& cfg) {
  const SelfCheckReference ref = SelfCheckReferenceFor(manifest, cfg.precision);
  const double diff = runner.SelfCheck(manifest, cfg.precision);
  std::cout << "rmscore self-check " << ToString(cfg.precision) << " graph=" << runner.graph_path()
            << " golden=" << manifest.golden_inputs.size() << " (alone and as one padded batch) vs " << ref.what
            << " max_abs_diff=" << diff << " tolerance=" << ref.tolerance << std::endl;
  if (!(diff <= ref.tolerance)) {
    std::ostringstream msg;
    msg << "self-check failed: max abs diff " << diff << " vs " << ref.what << " exceeds the tolerance "
        << ref.tolerance << "; refusing to serve";
    throw std::runtime_error(msg.str());
  }
}

// Loads, warms up and self-checks the model; nullptr when a stop signal came first (it is checked
// before the self-check too: no need to wait for it).
std::unique_ptr<ModelRunner> LoadModel(const Config& cfg, const Manifest& manifest, const sigset_t& signals) {
  auto runner = std::make_unique<ModelRunner>(cfg, manifest);
  WarmUp(*runner, cfg, signals);
  if (StopPending(signals)) return nullptr;
  SelfCheck(*runner, manifest, cfg);
  if (StopPending(signals)) return nullptr;
  return runner;
}

// Serves until SIGTERM/SIGINT, then drains: accepted work may run until the grace less the shutdown
// reserve, what is left fails, and the transports close (docs/cpp_server.md, "Shutdown").
void ServeAndDrain(const Config& cfg, const Manifest& manifest, ModelRunner& runner, RewardModelService& service,
                   grpc::Server& server, Metrics& metrics, const sigset_t& signals, Clock::time_point t0) {
  Batcher::Options bopts;
  bopts.planner = PlannerConfig{cfg.max_batch_size, cfg.max_batch_tokens, cfg.max_queue_delay_us(), cfg.batching};
  bopts.max_queue_sequences = cfg.max_queue_sequences;
  bopts.pad_token_id = manifest.pad_token_id;
  ModelRunner* model = &runner;
  Batcher batcher(
      bopts, [model](const PackedBatch& b) { return model->Run(b); }, &metrics, [model] { model->Abort(); });
  service.StartServing(&batcher);
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
  std::string tokenizer_json = ReadFile(manifest.TokenizerPath());

  Metrics metrics(manifest.name, manifest.version, ToString(cfg.device));
  metrics.SetQueueCapacity(cfg.max_queue_sequences);
  const int metrics_port = metrics.Serve(cfg.host, cfg.metrics_port);
  RewardModelService service(cfg, manifest, std::move(tokenizer_json), &metrics);
  ReflectionV1 reflection(ServiceNames());
  int port = 0;
  std::unique_ptr<grpc::Server> server = StartGrpc(cfg, service, reflection, metrics, &port);
  if (!cfg.port_file.empty()) WritePortFile(cfg.port_file, port, metrics_port);
  std::cout << "rmscore listening port=" << port << " metrics_port=" << metrics_port << std::endl;

  std::unique_ptr<ModelRunner> runner;
  try {
    runner = LoadModel(cfg, manifest, signals);
  } catch (...) {
    server->Shutdown(std::chrono::system_clock::now());
    throw;
  }
  if (!runner) {  // stopped while loading, warming up or self-checking: never SERVING, nothing to drain
    std::cout << "rmscore stopped during warm-up" << std::endl;
    server->Shutdown(std::chrono::system_clock::now());
    server->Wait();
    metrics.StopServing();
    return 0;
  }
  ServeAndDrain(cfg, manifest, *runner, service, *server, metrics, signals, t0);
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
  } catch (const std::exception& e) {
    std::cerr << "rmscore-server-cpp: " << e.what() << std::endl;
    return 1;
  }
}
