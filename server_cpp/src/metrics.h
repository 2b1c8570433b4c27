// Prometheus metrics, built from server_py/rmscore/core/metrics.json (embedded at
// build time) so names, labels and buckets are the Python servers' own.
// Every series carries server="cpp-grpc", backend="onnxruntime" and device (the --device).
#pragma once

#include <grpcpp/support/status.h>
#include <prometheus/counter.h>
#include <prometheus/exposer.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include <array>
#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace rmscore {

const char* StatusCodeName(grpc::StatusCode code);  // "OK", "INVALID_ARGUMENT", ...

class Metrics {
 public:
  // Throws std::runtime_error if metrics.json lacks a metric this code records.
  Metrics(const std::string& model, const std::string& version, const std::string& device = "cpu");
  ~Metrics();

  // Serves /metrics on host:port (0: ephemeral); returns the bound port.
  int Serve(const std::string& host, int port);
  // Stops the HTTP listener (takes ~2 s: civetweb's shutdown).
  void StopServing();

  void RequestAnswered(grpc::StatusCode code, double latency_s);
  void SequencesScored(int64_t n) { scored_->Increment(double(n)); }
  void SequencesDropped(const std::string& reason, int64_t n);
  void QueueWait(double s) { queue_wait_->Observe(s); }
  void BatchRan(double seconds, int64_t size, double padding_ratio);
  void SetQueueDepth(int64_t n) { queue_depth_->Set(double(n)); }
  void SetQueueExpectedWait(double seconds);
  void SetQueueCapacity(int64_t n);
  void InFlight(int delta) { in_flight_->Increment(double(delta)); }
  void SetQueuedRequestBytes(int64_t n) { queued_bytes_->Set(double(n)); }
  // rmscore_batcher_stalled_seconds is seconds(), called at each scrape (liveness.h): a value set by
  // the batcher would stop changing exactly when the batcher hangs. Must not block; callable any time.
  void SetStalledSource(std::function<double()> seconds);

  // What a scrape reads: the registry, with the scrape-time gauges brought up to date first.
  std::vector<prometheus::MetricFamily> Collect();
  prometheus::Registry& registry() { return *registry_; }

 private:
  std::shared_ptr<prometheus::Registry> registry_;
  std::shared_ptr<prometheus::Collectable> process_;  // metrics.json's process_metrics, from /proc
  std::shared_ptr<prometheus::Collectable> scraped_;  // registry_ through Collect(): what the exposer serves
  std::unique_ptr<prometheus::Exposer> exposer_;
  std::map<std::string, prometheus::Family<prometheus::Counter>*> counters_;
  std::map<std::string, prometheus::Family<prometheus::Gauge>*> gauges_;
  std::map<std::string, prometheus::Family<prometheus::Histogram>*> histograms_;
  std::map<std::string, prometheus::Histogram::BucketBoundaries> buckets_;

  std::array<std::atomic<prometheus::Counter*>, 17> requests_by_code_{};
  prometheus::Counter* scored_ = nullptr;
  prometheus::Histogram* latency_ = nullptr;
  prometheus::Histogram* queue_wait_ = nullptr;
  prometheus::Histogram* batch_seconds_ = nullptr;
  prometheus::Histogram* batch_size_ = nullptr;
  prometheus::Histogram* batch_padding_ = nullptr;
  prometheus::Gauge* queue_depth_ = nullptr;
  prometheus::Gauge* in_flight_ = nullptr;
  prometheus::Gauge* stalled_ = nullptr;
  prometheus::Gauge* queued_bytes_ = nullptr;
  std::mutex stalled_mu_;  // guards stalled_source_ (a scrape thread reads it, the main thread sets it)
  std::function<double()> stalled_source_;

  template <typename T>
  prometheus::Family<T>& Family(std::map<std::string, prometheus::Family<T>*>& m, const std::string& name);
  prometheus::Histogram& Histo(const std::string& name);
};

}  // namespace rmscore
