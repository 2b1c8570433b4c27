// One ONNX Runtime session over the repository's graph. Run() is called from
// the batcher's single worker thread (and, before serving, the self-check).
#pragma once

#include <onnxruntime_cxx_api.h>

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

  // Scores every golden input alone and all of them as one padded batch;
  // returns the largest |score - golden|.
  double SelfCheck(const Manifest& manifest);

  const std::string& graph_path() const { return graph_path_; }

 private:
  Ort::Env env_;
  Ort::Session session_{nullptr};
  Ort::MemoryInfo cpu_mem_;
  std::string graph_path_;
  std::vector<std::string> input_names_;
  std::string output_name_;
};

// Tolerance the self-check holds a precision to: fp32 graphs must match the
// eager golden scores to 1e-5; the dynamically quantized int8 graph is
// checked for gross breakage only, at 1e-1.
double SelfCheckTolerance(Precision p);

}  // namespace rmscore
