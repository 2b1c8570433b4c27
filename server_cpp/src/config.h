// The server's one typed configuration, parsed once from the command line.
// Flag names and defaults are docs/contract.md's, the same as the Python servers.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace rmscore {

enum class BatchingMode { kLengthAware, kFifo, kCostAware };
enum class Precision { kFp32, kInt8 };
enum class Device { kCpu, kCuda };
enum class GraphOptLevel { kDisable, kBasic, kExtended, kAll };

// --model-workers auto: the count is measured at warm-up (server_py's AUTO_WORKERS).
inline constexpr int kAutoWorkers = 0;
// --model-workers elastic, the default: one batcher thread per intra-op thread sharing a one-thread
// session, and a session of every intra-op thread for a batch that runs alone (main.cc, ElasticSessions).
inline constexpr int kElasticWorkers = -1;

struct Config {
  std::string model_dir = "models/default";
  std::string host = "127.0.0.1";
  int port = 50051;
  int metrics_port = 9100;
  std::string port_file;  // empty: none
  // cost_aware: the batch doing the most work (its sequences at their own best batch's cost) per
  // second of measured model time (docs/batching.md);
  // length_aware and fifo stay for ablations.
  BatchingMode batching = BatchingMode::kCostAware;
  int max_batch_size = 32;
  int64_t max_batch_tokens = 8192;
  double max_queue_delay_ms = 2;
  // A batch grows only while its expected model time (the measured time per token) stays within this,
  // so a caller waits at most about this for the batches running (planner.h). 0: no bound.
  double max_batch_ms = 500;
  int64_t max_queue_sequences = 4096;
  // Admission by work (admission.h): refused RESOURCE_EXHAUSTED when the model time queued ahead
  // exceeds this. 0: no bound (deadlines are still checked).
  double max_queue_wait_seconds = 60;
  int max_sequences_per_request = 1024;
  int64_t max_request_bytes = 16777216;
  // Bytes of accepted requests held until answered, summed over every call (admission.h HeldBytes: 8
  // per token id as sent); a request that would pass it is refused RESOURCE_EXHAUSTED before it is
  // queued. 1 GiB: 64x a full queue of full-window sequences, as server_py's config.py says.
  int64_t max_queued_request_bytes = INT64_C(1) << 30;
  int intra_op_threads = 2;
  int inter_op_threads = 1;
  GraphOptLevel graph_optimization_level = GraphOptLevel::kAll;
  Precision precision = Precision::kFp32;
  Device device = Device::kCpu;
  double drain_grace_seconds = 30;
  // A connection older than this gets a GOAWAY, so a round_robin client resolves the name again
  // and finds replicas added since (docs/deploy.md, Kubernetes); gRPC adds +-10% jitter. The grace
  // is how long calls in flight on it may still finish before it is closed.
  double max_connection_age_seconds = 300;
  double max_connection_age_grace_seconds = 30;
  // Times the warm-up set (a few small batches) runs before the self-check;
  // more rounds settle the runtime's allocators and caches before traffic.
  int warmup_rounds = 1;
  // The cost table the cost_aware planner uses (cost.h, cost_profile.h): loaded from this file when it
  // exists, else measured at warm-up within cost_profile_seconds and saved here. Empty: measured (only
  // for --batching cost_aware), not saved.
  std::string cost_profile;
  double cost_profile_seconds = 10.0;
  // Without --cost-profile the table is cached here per model, backend, device, precision, threads and
  // batch size limit (cost_profile.h, CachePath): measured once per machine, reused, replaced when it
  // does not match. Empty (--cost-profile-dir none): measured at every start, never saved. Default:
  // cost_profile::DefaultDir(), from the environment, as the Python servers'.
  std::string cost_profile_dir;
  // Model sessions run in parallel, each with intra_op_threads / model_workers threads, one batcher
  // thread each; kAutoWorkers: measured at warm-up (main.cc, StartWorkers); kElasticWorkers: a lone
  // batch gets every thread, concurrent batches one each.
  int model_workers = kElasticWorkers;
  // Transport limits, the same flags as the Python servers (docs/contract.md): HTTP/2 streams one
  // connection may have open at once; ScoreStream items of one stream read but not yet answered on
  // the wire (at the bound the stream is not read, so flow control holds its client back instead of
  // the shared queue). The two body flags are the HTTP server's: checked here, not used by gRPC.
  int max_concurrent_streams = 100;
  int max_stream_items_in_flight = 32;
  double body_timeout_seconds = 30;
  int64_t max_buffered_request_bytes = INT64_C(134217728);
  // Liveness (liveness.h): the gRPC health service "liveness" says NOT_SERVING once work has waited
  // this long with no batch completing. Default: five times the 60 s admission bound, and 50x the
  // longest batch the default limits allow on this machine (16 x 512 tokens, 5.4 s on one core): only
  // a hang gets there. 0: never fails. The same as server_py's config.py.
  double liveness_stall_seconds = 300;
  // Transport security and the shared bearer token (docs/contract.md, "Access
  // control"). Empty: off. Checked at parse time: TLS takes both files or
  // neither, every file must be readable, the token file must hold a token.
  std::string tls_cert_file;
  std::string tls_key_file;
  std::string auth_token_file;
  std::string auth_token;  // the token file's content, surrounding whitespace stripped

  bool tls() const { return !tls_cert_file.empty(); }

  int64_t max_queue_delay_us() const;
  int64_t max_batch_us() const;
  // The part of --drain-grace-seconds kept for failing what is left and closing the transports after
  // the drain (docs/contract.md): min(kShutdownReserveMaxS, grace / 2), as in the Python servers.
  double shutdown_reserve_s() const;
  // The two connection-age flags as gRPC takes them, in milliseconds (the age at least 1).
  int max_connection_age_ms() const;
  int max_connection_age_grace_ms() const;
};

// The most seconds a gRPC channel argument in milliseconds (an int) holds; Python's MAX_CHANNEL_SECONDS.
inline constexpr double kMaxChannelSeconds = 2147483;

inline constexpr double kShutdownReserveMaxS = 3.0;

// Thrown for a bad flag or value; what() is the message to print, quoting
// the bad value, e.g. "--max-batch-size: must be >= 1, got 0".
struct ConfigError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// The cost-profile cache when --cost-profile-dir is not given: $RMSCORE_CACHE_DIR/cost-profiles, else
// $XDG_CACHE_HOME/rmscore/cost-profiles, else $HOME/.cache/rmscore/cost-profiles (cost_profile.default_dir).
std::string DefaultCostProfileDir();

// Parses `--flag value` and `--flag=value`, then checks the flags that go
// together (TLS files, the per-request and queue limits) and reads the token file. Throws ConfigError. `--help` is
// reported through *help_requested (no other flags are checked then).
Config ParseConfig(const std::vector<std::string>& args, bool* help_requested);

std::string Usage();
const char* ToString(Device d);
const char* ToString(Precision p);

}  // namespace rmscore
