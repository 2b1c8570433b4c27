#include "metrics.h"

#include <nlohmann/json.hpp>
#include <stdexcept>

#include "metrics_json.h"

namespace rmscore {

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
  Family(gauges_, "rmscore_build_info").Add({{"model", model}, {"version", version}}).Set(1);
  // Labelled families are exported only once they hold a series: make the
  // known ones now so every metric name is visible from the first scrape.
  for (const char* reason : {"deadline", "cancelled"}) {
    Family(counters_, "rmscore_sequences_dropped_total").Add({{"reason", reason}});
  }
  Family(counters_, "rmscore_requests_total").Add({{"code", "OK"}});
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
  exposer_->RegisterCollectable(registry_);
  const auto ports = exposer_->GetListeningPorts();
  if (ports.empty()) throw std::runtime_error("metrics: no listening port on " + host);
  return ports.front();
}

void Metrics::StopServing() { exposer_.reset(); }

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

void Metrics::BatchRan(double seconds, int64_t size, double padding_ratio) {
  batch_seconds_->Observe(seconds);
  batch_size_->Observe(double(size));
  batch_padding_->Observe(padding_ratio);
}

}  // namespace rmscore
