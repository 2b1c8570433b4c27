#include "config.h"

#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <iomanip>
#include <iterator>
#include <limits>
#include <map>
#include <optional>
#include <sstream>
#include <stdexcept>

namespace rmscore {
namespace {

[[noreturn]] void Fail(const std::string& flag, const std::string& why) {
  throw ConfigError(flag + ": " + why);
}

int64_t ParseInt(const std::string& flag, const std::string& v, int64_t min, int64_t max) {
  size_t used = 0;
  int64_t n = 0;
  try {
    n = std::stoll(v, &used, 10);
  } catch (const std::exception&) {
    used = 0;
  }
  if (v.empty() || used != v.size()) Fail(flag, "not an integer, got '" + v + "'");
  if (n < min) Fail(flag, "must be >= " + std::to_string(min) + ", got " + v);
  if (n > max) Fail(flag, "must be <= " + std::to_string(max) + ", got " + v);
  return n;
}

// A finite number >= min, or > min when `min_excluded`.
double ParseNumber(const std::string& flag, const std::string& v, double min, bool min_excluded = false) {
  size_t used = 0;
  double x = 0;
  try {
    x = std::stod(v, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (v.empty() || used != v.size() || !std::isfinite(x)) Fail(flag, "not a number, got '" + v + "'");
  if (x < min || (min_excluded && x == min)) {
    std::ostringstream m;
    m << "must be " << (min_excluded ? "> " : ">= ") << min << ", got " << v;
    Fail(flag, m.str());
  }
  return x;
}

// A number of seconds for a gRPC channel argument in milliseconds: above `min` (or equal to it when
// `min_included`) and at most kMaxChannelSeconds. Same messages as server_py/rmscore/core/config.py.
double ParseChannelSeconds(const std::string& flag, const std::string& v, bool min_included) {
  std::ostringstream rule;
  rule << "must be " << (min_included ? ">= 0" : "> 0") << " and <= " << std::fixed << std::setprecision(0)
       << kMaxChannelSeconds << ", got " << v;
  double x = 0;
  try {
    x = ParseNumber(flag, v, 0, !min_included);
  } catch (const ConfigError& e) {
    if (std::string(e.what()).find("not a number") != std::string::npos) throw;
    Fail(flag, rule.str());
  }
  if (x > kMaxChannelSeconds) Fail(flag, rule.str());
  return x;
}

std::string NonEmpty(const std::string& flag, const std::string& v) {
  if (v.empty()) Fail(flag, "must not be empty");
  return v;
}

// A file to write later: its directory must exist now (server_py's config.py, same message).
std::string FileInExistingDir(const std::string& flag, const std::string& v) {
  const size_t slash = v.rfind('/');
  const std::string dir = slash == std::string::npos ? "." : slash == 0 ? "/" : v.substr(0, slash);
  struct stat st {};
  if (v.empty() || ::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    Fail(flag, "must be a file in an existing directory, got '" + v + "'");
  }
  return v;
}

template <typename E>
E ParseChoice(const std::string& flag, const std::string& v, const std::map<std::string, E>& choices) {
  auto it = choices.find(v);
  if (it != choices.end()) return it->second;
  std::string names;
  for (const auto& [name, _] : choices) names += (names.empty() ? "" : ", ") + name;
  Fail(flag, "must be one of " + names + ", got '" + v + "'");
}

using Setter = std::function<void(Config&, const std::string& flag, const std::string& value)>;

const std::map<std::string, Setter>& Setters() {
  static const std::map<std::string, Setter> setters = {
      {"--model", [](Config& c, auto& f, auto& v) {
         if (v.empty()) Fail(f, "must not be empty");
         c.model_dir = v;
       }},
      {"--host", [](Config& c, auto& f, auto& v) {
         if (v.empty()) Fail(f, "must not be empty");
         c.host = v;
       }},
      {"--port", [](Config& c, auto& f, auto& v) { c.port = int(ParseInt(f, v, 0, 65535)); }},
      {"--metrics-port", [](Config& c, auto& f, auto& v) { c.metrics_port = int(ParseInt(f, v, 0, 65535)); }},
      {"--port-file", [](Config& c, auto& f, auto& v) {
         if (v.empty()) Fail(f, "must not be empty");
         c.port_file = v;
       }},
      {"--batching", [](Config& c, auto& f, auto& v) {
         c.batching = ParseChoice<BatchingMode>(
             f, v,
             {{"length_aware", BatchingMode::kLengthAware}, {"fifo", BatchingMode::kFifo},
              {"cost_aware", BatchingMode::kCostAware}});
       }},
      {"--max-batch-size", [](Config& c, auto& f, auto& v) { c.max_batch_size = int(ParseInt(f, v, 1, 1 << 20)); }},
      {"--max-batch-tokens", [](Config& c, auto& f, auto& v) { c.max_batch_tokens = ParseInt(f, v, 1, INT64_C(1) << 40); }},
      {"--max-queue-delay-ms", [](Config& c, auto& f, auto& v) { c.max_queue_delay_ms = ParseNumber(f, v, 0); }},
      {"--max-batch-ms",
       [](Config& c, auto& f, auto& v) {
         const double x = ParseNumber(f, v, -std::numeric_limits<double>::infinity());
         std::ostringstream rule;
         rule << "must be >= 0 and <= " << std::fixed << std::setprecision(0) << kMaxChannelSeconds * 1000 << ", got " << v;
         if (x < 0 || x > kMaxChannelSeconds * 1000) Fail(f, rule.str());
         c.max_batch_ms = x;
       }},
      {"--max-queue-sequences", [](Config& c, auto& f, auto& v) { c.max_queue_sequences = ParseInt(f, v, 1, INT64_C(1) << 40); }},
      {"--max-queue-wait-seconds", [](Config& c, auto& f, auto& v) {
         c.max_queue_wait_seconds = ParseChannelSeconds(f, v, true);
       }},
      {"--max-sequences-per-request", [](Config& c, auto& f, auto& v) {
         c.max_sequences_per_request = int(ParseInt(f, v, 1, 1 << 24));
       }},
      {"--max-request-bytes", [](Config& c, auto& f, auto& v) {
         // gRPC takes an int for the receive limit.
         c.max_request_bytes = ParseInt(f, v, 1, INT32_MAX);
       }},
      {"--intra-op-threads", [](Config& c, auto& f, auto& v) { c.intra_op_threads = int(ParseInt(f, v, 1, 1024)); }},
      {"--inter-op-threads", [](Config& c, auto& f, auto& v) { c.inter_op_threads = int(ParseInt(f, v, 1, 1024)); }},
      {"--graph-optimization-level", [](Config& c, auto& f, auto& v) {
         c.graph_optimization_level = ParseChoice<GraphOptLevel>(
             f, v, {{"disable", GraphOptLevel::kDisable}, {"basic", GraphOptLevel::kBasic},
                    {"extended", GraphOptLevel::kExtended}, {"all", GraphOptLevel::kAll}});
       }},
      {"--precision", [](Config& c, auto& f, auto& v) {
         c.precision = ParseChoice<Precision>(f, v, {{"fp32", Precision::kFp32}, {"int8", Precision::kInt8}});
       }},
      {"--device", [](Config& c, auto& f, auto& v) {
         c.device = ParseChoice<Device>(f, v, {{"cpu", Device::kCpu}, {"cuda", Device::kCuda}});
       }},
      {"--drain-grace-seconds", [](Config& c, auto& f, auto& v) { c.drain_grace_seconds = ParseNumber(f, v, 0, true); }},
      {"--max-connection-age-seconds", [](Config& c, auto& f, auto& v) {
         c.max_connection_age_seconds = ParseChannelSeconds(f, v, false);
       }},
      {"--max-connection-age-grace-seconds", [](Config& c, auto& f, auto& v) {
         c.max_connection_age_grace_seconds = ParseChannelSeconds(f, v, true);
       }},
      {"--warmup-rounds", [](Config& c, auto& f, auto& v) { c.warmup_rounds = int(ParseInt(f, v, 1, 1 << 20)); }},
      {"--cost-profile", [](Config& c, auto& f, auto& v) { c.cost_profile = FileInExistingDir(f, v); }},
      {"--cost-profile-dir", [](Config& c, auto& f, auto& v) {
         struct stat st {};
         if (v.empty()) Fail(f, "must not be empty");
         if (v != "none" && ::stat(v.c_str(), &st) == 0 && !S_ISDIR(st.st_mode)) {
           Fail(f, "must be a directory (created when missing) or none, got '" + v + "'");
         }
         c.cost_profile_dir = v == "none" ? "" : v;
       }},
      {"--cost-profile-seconds", [](Config& c, auto& f, auto& v) {
         c.cost_profile_seconds = ParseNumber(f, v, 0, true);
       }},
      {"--model-workers", [](Config& c, auto& f, auto& v) {
         if (v == "elastic" || v == "auto") {
           c.model_workers = v == "elastic" ? kElasticWorkers : kAutoWorkers;
           return;
         }
         try {
           c.model_workers = int(ParseInt(f, v, 1, 1024));
         } catch (const ConfigError&) {
           Fail(f, "must be 'elastic', 'auto' or an integer >= 1, got '" + v + "'");
         }
       }},
      {"--max-concurrent-streams", [](Config& c, auto& f, auto& v) {
         c.max_concurrent_streams = int(ParseInt(f, v, 1, INT32_MAX));
       }},
      {"--max-stream-items-in-flight", [](Config& c, auto& f, auto& v) {
         c.max_stream_items_in_flight = int(ParseInt(f, v, 1, 1 << 24));
       }},
      {"--body-timeout-seconds", [](Config& c, auto& f, auto& v) { c.body_timeout_seconds = ParseChannelSeconds(f, v, false); }},
      {"--liveness-stall-seconds", [](Config& c, auto& f, auto& v) {
         c.liveness_stall_seconds = ParseChannelSeconds(f, v, true);
       }},
      {"--max-queued-request-bytes", [](Config& c, auto& f, auto& v) {
         c.max_queued_request_bytes = ParseInt(f, v, 1, INT64_C(1) << 50);
       }},
      {"--max-buffered-request-bytes", [](Config& c, auto& f, auto& v) {
         c.max_buffered_request_bytes = ParseInt(f, v, 1, INT64_C(1) << 50);
       }},
      {"--tls-cert-file", [](Config& c, auto& f, auto& v) { c.tls_cert_file = NonEmpty(f, v); }},
      {"--tls-key-file", [](Config& c, auto& f, auto& v) { c.tls_key_file = NonEmpty(f, v); }},
      {"--auth-token-file", [](Config& c, auto& f, auto& v) { c.auth_token_file = NonEmpty(f, v); }},
  };
  return setters;
}

// The whole file, or nullopt when it cannot be opened and read as a regular file.
std::optional<std::string> ReadWhole(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::nullopt;
  try {
    std::string data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (in.bad()) return std::nullopt;
    return data;
  } catch (const std::exception&) {  // a directory opens, then libstdc++ throws on the first read
    return std::nullopt;
  }
}

// Same rules and messages as server_py/rmscore/core/config.py: a request the queue can never hold
// would be refused "queue full" forever, and a model worker needs at least one thread of its own.
void CheckLimits(const Config& c) {
  if (c.max_sequences_per_request > c.max_queue_sequences) {
    Fail("--max-sequences-per-request", "must be <= --max-queue-sequences (" + std::to_string(c.max_queue_sequences) +
                                            "), got " + std::to_string(c.max_sequences_per_request));
  }
  if (c.max_buffered_request_bytes < c.max_request_bytes) {
    Fail("--max-buffered-request-bytes", "must be >= --max-request-bytes (" + std::to_string(c.max_request_bytes) +
                                             "), got " + std::to_string(c.max_buffered_request_bytes));
  }
  if (c.model_workers > c.intra_op_threads) {
    Fail("--model-workers", "each worker needs an intra-op thread: must be <= --intra-op-threads (" +
                                std::to_string(c.intra_op_threads) + "), got " + std::to_string(c.model_workers));
  }
}

// Same rules and messages as server_py/rmscore/core/config.py.
void CheckAccessFlags(Config& c) {
  if (!c.tls_cert_file.empty() && c.tls_key_file.empty()) {
    Fail("--tls-cert-file", "needs --tls-key-file too (TLS takes both or neither), got '" + c.tls_cert_file + "'");
  }
  if (!c.tls_key_file.empty() && c.tls_cert_file.empty()) {
    Fail("--tls-key-file", "needs --tls-cert-file too (TLS takes both or neither), got '" + c.tls_key_file + "'");
  }
  for (const auto& [flag, path] : {std::pair<const char*, const std::string*>{"--tls-cert-file", &c.tls_cert_file},
                                   {"--tls-key-file", &c.tls_key_file}}) {
    if (!path->empty() && !ReadWhole(*path)) Fail(flag, "cannot read the file, got '" + *path + "'");
  }
  if (c.auth_token_file.empty()) return;
  const std::optional<std::string> raw = ReadWhole(c.auth_token_file);
  if (!raw) Fail("--auth-token-file", "cannot read the file, got '" + c.auth_token_file + "'");
  const char* space = " \t\r\n\f\v";
  const size_t first = raw->find_first_not_of(space);
  if (first == std::string::npos) Fail("--auth-token-file", "the file holds no token, got '" + c.auth_token_file + "'");
  c.auth_token = raw->substr(first, raw->find_last_not_of(space) - first + 1);
  // It travels in a header: visible ASCII only (the token itself is never printed).
  for (char ch : c.auth_token) {
    if (ch < 0x21 || ch > 0x7e) {
      Fail("--auth-token-file", "the token must be printable ASCII without spaces, got '" + c.auth_token_file + "'");
    }
  }
}

}  // namespace

int64_t Config::max_queue_delay_us() const { return static_cast<int64_t>(std::llround(max_queue_delay_ms * 1000.0)); }
int64_t Config::max_batch_us() const { return static_cast<int64_t>(std::llround(max_batch_ms * 1000.0)); }

double Config::shutdown_reserve_s() const { return std::min(kShutdownReserveMaxS, drain_grace_seconds / 2); }

int Config::max_connection_age_ms() const {
  return std::max(1, static_cast<int>(std::llround(max_connection_age_seconds * 1000.0)));
}

int Config::max_connection_age_grace_ms() const {
  return static_cast<int>(std::llround(max_connection_age_grace_seconds * 1000.0));
}

std::string DefaultCostProfileDir() {
  auto env = [](const char* name) -> std::string {
    const char* v = std::getenv(name);
    return v == nullptr ? "" : v;
  };
  std::string base;
  if (!env("RMSCORE_CACHE_DIR").empty()) {
    base = env("RMSCORE_CACHE_DIR");
  } else if (!env("XDG_CACHE_HOME").empty()) {
    base = env("XDG_CACHE_HOME") + "/rmscore";
  } else {
    base = (env("HOME").empty() ? std::string("/tmp") : env("HOME")) + "/.cache/rmscore";
  }
  return base + "/cost-profiles";
}

Config ParseConfig(const std::vector<std::string>& args, bool* help_requested) {
  *help_requested = false;
  Config c;
  c.cost_profile_dir = DefaultCostProfileDir();
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--help" || a == "-h") {
      *help_requested = true;
      return c;
    }
    std::string flag = a, value;
    bool inline_value = false;
    if (auto eq = a.find('='); a.rfind("--", 0) == 0 && eq != std::string::npos) {
      flag = a.substr(0, eq);
      value = a.substr(eq + 1);
      inline_value = true;
    }
    auto it = Setters().find(flag);
    if (it == Setters().end() && (flag == "--chat-template" || flag == "--strip-string")) {
      // The Python servers' framework-text flags: said as py-grpc says it (core/config.py _check_text),
      // so every gRPC kind refuses them in the same words.
      if (!inline_value && i + 1 < args.size()) value = args[++i];
      // Python quotes the parsed value: the string, or the tuple of --strip-string's repeats.
      const std::string got = flag == "--strip-string" ? "('" + value + "',)" : "'" + value + "'";
      Fail(flag, "applies to the HTTP server's framework routes only; add --transport http, got " + got);
    }
    if (it == Setters().end()) throw ConfigError("unknown flag '" + a + "' (see --help)");
    if (!inline_value) {
      if (i + 1 >= args.size()) Fail(flag, "missing value");
      value = args[++i];
    }
    it->second(c, flag, value);
  }
  CheckLimits(c);
  CheckAccessFlags(c);
  return c;
}

std::string Usage() {
  return "usage: rmscore-server-cpp [--flag value]...\n"
         "  --model DIR (models/default)  --host (127.0.0.1)  --port (50051, 0: ephemeral)\n"
         "  --metrics-port (9100, 0: ephemeral)  --port-file PATH\n"
         "  --batching cost_aware|length_aware|fifo  --max-batch-size 32  --max-batch-tokens 8192\n"
         "  --cost-profile FILE (cost table: loaded when it exists, else measured at warm-up and saved there)\n"
         "  --cost-profile-seconds 10 (the measuring budget)\n"
         "  --cost-profile-dir DIR|none (without --cost-profile: the cache of measured tables; default\n"
         "     $RMSCORE_CACHE_DIR/cost-profiles, else $XDG_CACHE_HOME/rmscore/..., else ~/.cache/rmscore/...)\n"
         "  --model-workers elastic|N|auto (elastic: a lone batch gets every intra-op thread, concurrent batches one\n"
         "      each; N: sessions in parallel, each with intra-op-threads / N threads; auto: N measured)\n"
         "  --max-queue-delay-ms 2  --max-batch-ms 500  --max-queue-sequences 4096  --max-sequences-per-request 1024\n"
         "  --max-queue-wait-seconds 60 (refuse when the queued model time exceeds it; 0: no bound)\n"
         "  --max-request-bytes 16777216  --intra-op-threads 2  --inter-op-threads 1\n"
         "  --max-queued-request-bytes 1073741824 (bytes of accepted requests held until answered, 8 per id;\n"
         "      a request past it is refused RESOURCE_EXHAUSTED)\n"
         "  --graph-optimization-level disable|basic|extended|all  --precision fp32|int8\n"
         "  --device cpu|cuda  --drain-grace-seconds 30  --warmup-rounds 1\n"
         "  --max-connection-age-seconds 300  --max-connection-age-grace-seconds 30 (gRPC GOAWAY, re-resolve)\n"
         "  --max-concurrent-streams 100  --max-stream-items-in-flight 32 (per ScoreStream; then it is not read)\n"
         "  --body-timeout-seconds 30  --max-buffered-request-bytes 134217728 (the HTTP server's; checked only)\n"
         "  --liveness-stall-seconds 300 (gRPC health \"liveness\" NOT_SERVING once work waits this long with no\n"
         "      batch completing; 0: never)\n"
         "  --tls-cert-file PEM --tls-key-file PEM (both or neither; default: plaintext)\n"
         "  --auth-token-file PATH (shared bearer token; default: none)\n"
         "See docs/contract.md and docs/cpp_server.md.\n";
}

const char* ToString(Device d) { return d == Device::kCuda ? "cuda" : "cpu"; }
const char* ToString(Precision p) { return p == Precision::kInt8 ? "int8" : "fp32"; }

}  // namespace rmscore
