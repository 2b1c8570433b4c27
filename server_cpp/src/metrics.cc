#include "metrics.h"

#include <dirent.h>
#include <prometheus/collectable.h>
#include <prometheus/metric_family.h>
#include <sys/resource.h>
#include <unistd.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>

#include "metrics_json.h"

namespace rmscore {
namespace {

// metrics.json's "process_metrics", read from /proc at each scrape with the Prometheus client
// libraries' names and meanings (prometheus_client's ProcessCollector on the Python servers).
class ProcessCollectable : public prometheus::Collectable {
 public:
  explicit ProcessCollectable(const nlohmann::json& specs) {
    for (const auto& m : specs) help_[m.at("name").get<std::string>()] = m.at("help").get<std::string>();
  }

  std::vector<prometheus::MetricFamily> Collect() const override {
    std::vector<prometheus::MetricFamily> out;
    for (const auto& [name, value] : Read()) {
      prometheus::ClientMetric m;
      const bool counter = name.size() > 6 && name.compare(name.size() - 6, 6, "_total") == 0;
      if (counter) {
        m.counter.value = value;
      } else {
        m.gauge.value = value;
      }
      out.push_back({name, help_.at(name), counter ? prometheus::MetricType::Counter : prometheus::MetricType::Gauge,
                     {m}});
    }
    return out;
  }

 private:
  std::map<std::string, std::string> help_;

  // /proc/self/stat after the command name (which may hold spaces): field 3 (state) onwards.
  static std::vector<std::string> StatFields() {
    std::ifstream in("/proc/self/stat");
    std::string line;
    std::getline(in, line);
    std::istringstream rest(line.substr(line.rfind(')') + 2));
    std::vector<std::string> fields;
    for (std::string f; rest >> f;) fields.push_back(f);
    return fields;
  }

  static double BootTimeSeconds() {
    std::ifstream in("/proc/stat");
    for (std::string key; in >> key;) {
      if (key == "btime") {
        double t = 0;
        in >> t;
        return t;
      }
    }
    return 0;
  }

  static double OpenFds() {
    DIR* d = opendir("/proc/self/fd");
    if (d == nullptr) return 0;
    double n = 0;
    while (dirent* e = readdir(d)) n += e->d_name[0] != '.';
    closedir(d);
    return n;  // the directory stream's own descriptor included, as the client libraries count
  }

  std::map<std::string, double> Read() const {
    const std::vector<std::string> f = StatFields();  // f[i] is stat field i + 3 (proc(5))
    if (f.size() < 22) return {};
    const double ticks = double(sysconf(_SC_CLK_TCK));
    rlimit fds{};
    getrlimit(RLIMIT_NOFILE, &fds);
    return {
        {"process_cpu_seconds_total", (std::stod(f[11]) + std::stod(f[12])) / ticks},  // utime + stime
        {"process_start_time_seconds", BootTimeSeconds() + std::stod(f[19]) / ticks},   // starttime
        {"process_virtual_memory_bytes", std::stod(f[20])},                             // vsize
        {"process_resident_memory_bytes", std::stod(f[21]) * double(sysconf(_SC_PAGESIZE))},  // rss pages
        {"process_open_fds", OpenFds()},
        {"process_max_fds", double(fds.rlim_cur)},
    };
  }
};

// The registry as the exposer serves it: through Metrics::Collect, which computes the scrape-time gauges
// first. Holds the Metrics by pointer: the exposer that calls it is stopped before the Metrics goes.
class ScrapeCollectable : public prometheus::Collectable {
 public:
  explicit ScrapeCollectable(Metrics* metrics) : metrics_(metrics) {}
  std::vector<prometheus::MetricFamily> Collect() const override { return metrics_->Collect(); }

 private:
  Metrics* const metrics_;
};

}  // namespace

const char* StatusCodeName(grpc::StatusCode code) {
  static const char* const kNames[] = {
      "OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND",
      "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION", "ABORTED",
      "OUT_OF_RANGE", "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS", "UNAUTHENTICATED"};
  const int i = int(code);
  return i >= 0 && i < 17 ? kNames[i] : "UNKNOWN";
}

Metrics::Metrics(const std::string& model, const std::string& version, const std::string& device)
    : registry_(std::make_shared<prometheus::Registry>()) {
  const std::map<std::string, std::string> common = {
      {"server", "cpp-grpc"}, {"backend", "onnxruntime"}, {"device", device}};
  const auto spec = nlohmann::json::parse(kMetricsJson);
  process_ = std::make_shared<ProcessCollectable>(spec.at("process_metrics"));
  for (const auto& m : spec.at("metrics")) {
    const std::string name = m.at("name"), type = m.at("type"), help = m.at("help");
    if (type == "counter") {
      counters_[name] = &prometheus::BuildCounter().Name(name).Help(help).Labels(common).Register(*registry_);
    } else if (type == "gauge") {
      gauges_[name] = &prometheus::BuildGauge().Name(name).Help(help).Labels(common).Register(*registry_);
    } else if (type == "histogram") {
      histograms_[name] =
          &prometheus::BuildHistogram().Name(name).Help(help).Labels(common).Register(*registry_);
      // A list, or the name of one of "bucket_sets" (shared by the histograms in seconds).
      const auto& b = m.at("buckets");
      buckets_[name] = (b.is_string() ? spec.at("bucket_sets").at(b.get<std::string>()) : b).get<std::vector<double>>();
    } else {
      throw std::runtime_error("metrics.json: " + name + ": unknown type " + type);
    }
  }
  // Series without extra labels exist from the start (they read 0 until used).
  scored_ = &Family(counters_, "rmscore_sequences_scored_total").Add({});
  Family(counters_, "rmscore_recompiles_total").Add({});  // stays 0: ORT never recompiles
  latency_ = &Histo("rmscore_request_latency_seconds");
  queue_wait_ = &Histo("rmscore_queue_wait_seconds");
  batch_seconds_ = &Histo("rmscore_batch_inference_seconds");
  batch_size_ = &Histo("rmscore_batch_size");
  batch_padding_ = &Histo("rmscore_batch_padding_ratio");
  queue_depth_ = &Family(gauges_, "rmscore_queue_depth").Add({});
  in_flight_ = &Family(gauges_, "rmscore_requests_in_flight").Add({});
  stalled_ = &Family(gauges_, "rmscore_batcher_stalled_seconds").Add({});
  queued_bytes_ = &Family(gauges_, "rmscore_queued_request_bytes").Add({});
  // Work waiting to be tokenized: the Python kinds' tokenizing pool. This server takes token ids only
  // (a text is refused INVALID_ARGUMENT), so nothing waits here; the series is exported, at 0, so that
  // every kind has the same names and a dashboard summing over kinds finds it.
  Family(gauges_, "rmscore_tokenize_queue_characters").Add({});
  scraped_ = std::make_shared<ScrapeCollectable>(this);
  Family(gauges_, "rmscore_build_info").Add({{"model", model}, {"version", version}}).Set(1);
  // Labelled families are exported only once they hold a series: make the
  // known ones now so every metric name is visible from the first scrape.
  for (const char* reason : {"deadline", "cancelled"}) {
    Family(counters_, "rmscore_sequences_dropped_total").Add({{"reason", reason}});
  }
  Family(counters_, "rmscore_requests_total").Add({{"code", "OK"}});
  // The Python HTTP server's /get_reward counts its formats here; every kind exports the name.
  for (const char* format : {"pair", "one_segment"}) {
    Family(counters_, "rmscore_get_reward_sequences_total").Add({{"format", format}});
  }
}

Metrics::~Metrics() { StopServing(); }

template <typename T>
prometheus::Family<T>& Metrics::Family(std::map<std::string, prometheus::Family<T>*>& m, const std::string& name) {
  auto it = m.find(name);
  if (it == m.end()) throw std::runtime_error("metrics.json has no metric '" + name + "' of the expected type");
  return *it->second;
}

prometheus::Histogram& Metrics::Histo(const std::string& name) {
  return Family(histograms_, name).Add({}, buckets_.at(name));
}

int Metrics::Serve(const std::string& host, int port) {
  exposer_ = std::make_unique<prometheus::Exposer>(host + ":" + std::to_string(port), 2);
  exposer_->RegisterCollectable(scraped_);
  exposer_->RegisterCollectable(process_);
  const auto ports = exposer_->GetListeningPorts();
  if (ports.empty()) throw std::runtime_error("metrics: no listening port on " + host);
  return ports.front();
}

void Metrics::StopServing() { exposer_.reset(); }

void Metrics::SetStalledSource(std::function<double()> seconds) {
  std::lock_guard<std::mutex> lk(stalled_mu_);
  stalled_source_ = std::move(seconds);
}

std::vector<prometheus::MetricFamily> Metrics::Collect() {
  {
    std::lock_guard<std::mutex> lk(stalled_mu_);
    if (stalled_source_) stalled_->Set(stalled_source_());
  }
  return registry_->Collect();
}

void Metrics::RequestAnswered(grpc::StatusCode code, double latency_s) {
  const int i = int(code) >= 0 && int(code) < 17 ? int(code) : int(grpc::StatusCode::UNKNOWN);
  prometheus::Counter* c = requests_by_code_[size_t(i)].load(std::memory_order_acquire);
  if (c == nullptr) {
    // Family::Add is thread-safe and returns the existing series for equal labels.
    c = &Family(counters_, "rmscore_requests_total").Add({{"code", StatusCodeName(code)}});
    requests_by_code_[size_t(i)].store(c, std::memory_order_release);
  }
  c->Increment();
  latency_->Observe(latency_s);
}

void Metrics::SequencesDropped(const std::string& reason, int64_t n) {
  Family(counters_, "rmscore_sequences_dropped_total").Add({{"reason", reason}}).Increment(double(n));
}

void Metrics::SetQueueExpectedWait(double seconds) {
  Family(gauges_, "rmscore_queue_expected_wait_seconds").Add({}).Set(seconds);
}
void Metrics::SetQueueCapacity(int64_t n) { Family(gauges_, "rmscore_queue_capacity_sequences").Add({}).Set(double(n)); }

void Metrics::BatchRan(double seconds, int64_t size, double padding_ratio) {
  batch_seconds_->Observe(seconds);
  batch_size_->Observe(double(size));
  batch_padding_->Observe(padding_ratio);
}

}  // namespace rmscore
