#include "model_runner.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace rmscore {
namespace {

GraphOptimizationLevel OrtLevel(GraphOptLevel l) {
  switch (l) {
    case GraphOptLevel::kDisable: return ORT_DISABLE_ALL;
    case GraphOptLevel::kBasic: return ORT_ENABLE_BASIC;
    case GraphOptLevel::kExtended: return ORT_ENABLE_EXTENDED;
    case GraphOptLevel::kAll: break;
  }
  return ORT_ENABLE_ALL;
}

// --device cuda must use the GPU or fail start: never fall back to CPU.
void AppendCuda(Ort::SessionOptions& opts) {
  const auto providers = Ort::GetAvailableProviders();
  if (std::find(providers.begin(), providers.end(), "CUDAExecutionProvider") == providers.end()) {
    std::string have;
    for (const auto& p : providers) have += (have.empty() ? "" : ", ") + p;
    throw std::runtime_error(
        "--device cuda: this ONNX Runtime library has no CUDAExecutionProvider (it has: " + have +
        "); build with RMSCORE_ORT_GPU=1 scripts/setup_ort_sdk.sh (see docs/cpp_server.md)");
  }
  OrtCUDAProviderOptions cuda{};
  cuda.device_id = 0;
  try {
    opts.AppendExecutionProvider_CUDA(cuda);
  } catch (const Ort::Exception& e) {
    throw std::runtime_error(std::string("--device cuda: the CUDA execution provider failed to load: ") + e.what());
  }
}

}  // namespace

SelfCheckReference SelfCheckReferenceFor(const Manifest& m, Precision p) {
  if (p == Precision::kFp32) return {&m.golden_scores, 1e-5, "golden.score"};
  if (!m.golden_scores_int8.empty() && m.int8_self_check_tolerance >= 0) {
    return {&m.golden_scores_int8, m.int8_self_check_tolerance, "golden.score_int8"};
  }
  return {&m.golden_scores, 1e-1, "golden.score"};
}

ModelRunner::ModelRunner(const Config& cfg, const Manifest& manifest)
    : env_(ORT_LOGGING_LEVEL_WARNING, "rmscore"),
      cpu_mem_(Ort::MemoryInfo::CreateCpu(OrtArenaAllocator, OrtMemTypeDefault)),
      graph_path_(manifest.GraphPath(cfg.precision)),
      input_names_(manifest.inputs),
      output_name_(manifest.output) {
  Ort::SessionOptions opts;
  opts.SetGraphOptimizationLevel(OrtLevel(cfg.graph_optimization_level));
  opts.SetIntraOpNumThreads(cfg.intra_op_threads);
  opts.SetInterOpNumThreads(cfg.inter_op_threads);
  // One run at a time from one worker thread: sequential execution.
  opts.SetExecutionMode(ORT_SEQUENTIAL);
  // ORT's CPU arena stays on, as in the Python backend: without it every large
  // batch allocates its activations afresh, and a 32x256 batch took 1.26x as
  // long (docs/cpp_bench.md). The cost is resident memory: the arena keeps the
  // largest batch's activations until ReleaseMemory gives them back, which the
  // server calls after its start-up checks and whenever the batcher goes idle.
  if (cfg.device == Device::kCuda) AppendCuda(opts);
  session_ = Ort::Session(env_, graph_path_.c_str(), opts);
  shrink_options_.AddConfigEntry("memory.enable_memory_arena_shrinkage", "cpu:0");
}

std::vector<float> ModelRunner::Run(const PackedBatch& batch) {
  grown_.store(true, std::memory_order_relaxed);
  return RunWith(batch, run_options_);
}

bool ModelRunner::ReleaseMemory() {
  if (!grown_.exchange(false)) return false;
  PackedBatch tiny;
  tiny.batch = 1;
  tiny.longest = 8;
  tiny.input_ids.assign(8, 1);
  tiny.attention_mask.assign(8, 1);
  tiny.real_tokens = 8;
  RunWith(tiny, shrink_options_);
  return true;
}

std::vector<float> ModelRunner::RunWith(const PackedBatch& batch, Ort::RunOptions& options) {
  const int64_t shape[2] = {batch.batch, batch.longest};
  // The tensors borrow the batch's buffers: no copy. Ort takes non-const data.
  Ort::Value inputs[2] = {
      Ort::Value::CreateTensor<int64_t>(cpu_mem_, const_cast<int64_t*>(batch.input_ids.data()),
                                        batch.input_ids.size(), shape, 2),
      Ort::Value::CreateTensor<int64_t>(cpu_mem_, const_cast<int64_t*>(batch.attention_mask.data()),
                                        batch.attention_mask.size(), shape, 2),
  };
  const char* in_names[2] = {input_names_[0].c_str(), input_names_[1].c_str()};
  const char* out_names[1] = {output_name_.c_str()};
  auto outputs = session_.Run(options, in_names, inputs, 2, out_names, 1);
  const auto info = outputs[0].GetTensorTypeAndShapeInfo();
  if (info.GetElementType() != ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT || info.GetElementCount() != size_t(batch.batch)) {
    throw std::runtime_error("output '" + output_name_ + "' is not float32 [" + std::to_string(batch.batch) + "]");
  }
  const float* data = outputs[0].GetTensorData<float>();
  return std::vector<float>(data, data + batch.batch);
}

double ModelRunner::SelfCheck(const Manifest& m, Precision precision) {
  const std::vector<float>& ref = *SelfCheckReferenceFor(m, precision).scores;
  double max_diff = 0;
  auto check = [&](float got, float want) {
    const double d = std::fabs(double(got) - double(want));
    max_diff = std::max(max_diff, std::isfinite(d) ? d : INFINITY);
  };
  auto view = [&](size_t i) { return SeqView{m.golden_inputs[i].data(), int64_t(m.golden_inputs[i].size())}; };
  for (size_t i = 0; i < m.golden_inputs.size(); ++i) check(Run(Pack({view(i)}, m.pad_token_id))[0], ref[i]);
  const std::vector<size_t> rows = SelfCheckPaddedRows(m.golden_inputs);
  std::vector<SeqView> padded;
  for (size_t i : rows) padded.push_back(view(i));
  const std::vector<float> batched = Run(Pack(padded, m.pad_token_id));
  for (size_t k = 0; k < rows.size(); ++k) check(batched[k], ref[rows[k]]);
  return max_diff;
}

std::vector<size_t> SelfCheckPaddedRows(const std::vector<std::vector<int64_t>>& inputs) {
  std::vector<size_t> order(inputs.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return inputs[a].size() < inputs[b].size(); });
  if (order.size() <= kSelfCheckPaddedRows) return order;
  std::vector<size_t> rows{order.back()};  // the longest sets the padded length
  rows.insert(rows.end(), order.begin(), order.begin() + (kSelfCheckPaddedRows - 1));
  return rows;
}

}  // namespace rmscore
