#include "manifest.h"

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>

namespace rmscore {
namespace {

using nlohmann::json;

const json& Key(const json& j, const char* key, const std::string& where) {
  auto it = j.find(key);
  if (it == j.end()) throw std::runtime_error(where + ": missing key '" + key + "'");
  return *it;
}

template <typename T>
T Get(const json& j, const char* key, const std::string& where) {
  try {
    return Key(j, key, where).get<T>();
  } catch (const json::exception& e) {
    throw std::runtime_error(where + ": key '" + key + "': " + e.what());
  }
}

}  // namespace

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot read " + path);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

Manifest LoadManifest(const std::string& model_dir) {
  const std::string path = model_dir + "/manifest.json";
  json j;
  try {
    j = json::parse(ReadFile(path));
  } catch (const json::exception& e) {
    throw std::runtime_error(path + ": not valid JSON: " + e.what());
  }
  Manifest m;
  m.dir = model_dir;
  m.name = Get<std::string>(j, "name", path);
  m.version = Get<std::string>(j, "version", path);
  m.architecture = Get<std::string>(j, "architecture", path);
  m.family = Get<std::string>(j, "family", path);
  m.pooling = Get<std::string>(j, "pooling", path);
  m.max_sequence_length = Get<int64_t>(j, "max_sequence_length", path);
  m.pad_token_id = Get<int64_t>(j, "pad_token_id", path);
  m.vocab_size = Get<int64_t>(j, "vocab_size", path);
  m.inputs = Get<std::vector<std::string>>(j, "inputs", path);
  m.output = Get<std::string>(j, "output", path);
  const json& graphs = Key(j, "graphs", path);
  m.graph_fp32 = Get<std::string>(graphs, "fp32", path + " graphs");
  if (graphs.contains("int8") && graphs["int8"].is_string()) m.graph_int8 = graphs["int8"].get<std::string>();
  const json& tok = Key(j, "tokenizer", path);
  m.tokenizer_file = Get<std::string>(tok, "file", path + " tokenizer");
  m.text_format = Get<std::string>(tok, "text_format", path + " tokenizer");
  for (const json& g : Key(j, "golden", path)) {
    m.golden_inputs.push_back(Get<std::vector<int64_t>>(g, "input_ids", path + " golden"));
    m.golden_scores.push_back(Get<float>(g, "score", path + " golden"));
    if (g.contains("score_int8")) m.golden_scores_int8.push_back(Get<float>(g, "score_int8", path + " golden"));
  }
  if (m.golden_scores_int8.size() != m.golden_scores.size()) m.golden_scores_int8.clear();
  if (j.contains("parity") && j["parity"].contains("int8") && j["parity"]["int8"].contains("self_check_tolerance")) {
    m.int8_self_check_tolerance = Get<double>(j["parity"]["int8"], "self_check_tolerance", path + " parity.int8");
  }
  if (j.contains("parity") && j["parity"].contains("int8") && j["parity"]["int8"].contains("ranking")) {
    const json& r = j["parity"]["int8"]["ranking"];
    const std::string where = path + " parity.int8.ranking";
    m.int8_ranking = {Get<double>(r, "spearman", where), Get<double>(r, "pairwise_order_agreement", where),
                      Get<double>(r, "max_abs_diff", where)};
  }
  if (m.inputs != std::vector<std::string>{"input_ids", "attention_mask"}) {
    throw std::runtime_error(path + ": inputs must be [\"input_ids\", \"attention_mask\"]");
  }
  if (m.max_sequence_length < 1 || m.vocab_size < 1) {
    throw std::runtime_error(path + ": max_sequence_length and vocab_size must be >= 1");
  }
  if (m.golden_inputs.empty()) throw std::runtime_error(path + ": 'golden' is empty; the self-check needs it");
  return m;
}

std::string Manifest::GraphPath(Precision p) const {
  if (p == Precision::kInt8) {
    if (graph_int8.empty()) throw std::runtime_error(dir + "/manifest.json: no int8 graph (export with --int8)");
    return dir + "/" + graph_int8;
  }
  return dir + "/" + graph_fp32;
}

Manifest::Ranking Manifest::RankingFor(Precision p) const {
  return p == Precision::kInt8 ? int8_ranking : Ranking{1, 1, 0};
}

std::string Manifest::TokenizerPath() const { return dir + "/" + tokenizer_file; }

}  // namespace rmscore
