// One ONNX Runtime session over the repository's graph: one model worker
// (--model-workers). Run() is called from its workers' batcher threads, several at once
// when shared (elastic: ONNX Runtime runs are thread-safe) (and,
// before serving, from warm-up, the cost profile and the self-check).
#pragma once

#include <onnxruntime_cxx_api.h>

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "config.h"
#include "manifest.h"
#include "validation.h"

namespace rmscore {

class ModelRunner {
 public:
  // Throws std::runtime_error / Ort::Exception with a readable reason, e.g.
  // when --device cuda is asked and the CUDA EP is not available (no fallback).
  ModelRunner(const Config& cfg, const Manifest& manifest);

  // Scores one packed batch; returns batch.batch floats. Throws on failure.
  std::vector<float> Run(const PackedBatch& batch);

  // Scores every golden input alone, and SelfCheckPaddedRows of them as one
  // padded batch; returns the largest |score - reference| (see
  // SelfCheckReference).
  double SelfCheck(const Manifest& manifest, Precision precision);

  // ONNX Runtime's CPU arena keeps the largest batch's activations for reuse, so one burst of long
  // batches left a server 12% larger for good (docs/bench/attacks_2026-12-06.md); shrinking after every
  // run costs about 4% a batch. So ReleaseMemory, which the batcher calls when it goes idle, gives back
  // what the batches since its last call grew (one 1 x 8 run with the arena-shrinkage run option), once,
  // and only if a batch ran since. Any batch, not only those with more padded tokens than the warm-up's:
  // a 512-token sequence has no more tokens than its 8 x 64 but needs more (attention is quadratic in
  // the length). True when it shrank. Thread-safe, as Run is. runtimes/ort.py does the same.
  bool ReleaseMemory();

  // Makes the run in progress (and any later one) fail at once; for a
  // shutdown whose drain grace has run out. Thread-safe.
  void Abort() {
    run_options_.SetTerminate();
    shrink_options_.SetTerminate();
  }

  const std::string& graph_path() const { return graph_path_; }

 private:
  std::vector<float> RunWith(const PackedBatch& batch, Ort::RunOptions& options);

  Ort::Env env_;
  Ort::Session session_{nullptr};
  Ort::MemoryInfo cpu_mem_;
  Ort::RunOptions run_options_;
  Ort::RunOptions shrink_options_;
  std::atomic<bool> grown_{false};  // a batch ran since the last ReleaseMemory
  std::string graph_path_;
  std::vector<std::string> input_names_;
  std::string output_name_;
};

// What the self-check compares against, and how closely.
// fp32: the eager golden scores, to 1e-5.
// int8: the int8 graph's own golden scores (`score_int8`) to the exporter's
// `parity.int8.self_check_tolerance` when the manifest has them (the Python
// servers do the same); else the eager golden scores to 1e-1, a gross
// breakage check only: dynamic quantization moves scores by ~0.5 here.
struct SelfCheckReference {
  const std::vector<float>* scores;
  double tolerance;
  const char* what;
};
SelfCheckReference SelfCheckReferenceFor(const Manifest& m, Precision p);

// The golden inputs the self-check scores as one padded batch, by index: the
// longest, then the shortest up to kSelfCheckPaddedRows in all (ties by
// index), so most rows are nearly all padding (what a mask or pooling bug
// changes, and what moves a dynamic int8 graph's scores) without paying for
// every input padded to the longest: all 22 of the default model's at 512
// tokens took 5 s of every start. server_py's runtimes.padded_rows.
constexpr size_t kSelfCheckPaddedRows = 8;
std::vector<size_t> SelfCheckPaddedRows(const std::vector<std::vector<int64_t>>& inputs);

}  // namespace rmscore
