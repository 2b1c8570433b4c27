// The model repository's manifest.json (written by `rmscore export`), read
// once at start. Missing or mistyped keys fail start with the key's name.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "config.h"

namespace rmscore {

struct Manifest {
  std::string dir;
  std::string name, version, architecture, family, pooling;
  int64_t max_sequence_length = 0;
  int64_t pad_token_id = 0;
  int64_t vocab_size = 0;
  std::vector<std::string> inputs;  // ["input_ids", "attention_mask"]
  std::string output;               // "scores"
  std::string graph_fp32, graph_int8;
  std::string tokenizer_file, text_format;
  std::vector<std::vector<int64_t>> golden_inputs;
  std::vector<float> golden_scores;       // eager fp32, each scored alone
  // The int8 graph's own golden scores and the tolerance the exporter set for
  // them (`golden[].score_int8`, `parity.int8.self_check_tolerance`); empty /
  // negative when the manifest predates them.
  std::vector<float> golden_scores_int8;
  double int8_self_check_tolerance = -1;
  // How a precision ranks against fp32 on the exporter's held-out pairs
  // (`parity.PRECISION.ranking`); zeros when the manifest has no figures.
  struct Ranking {
    double spearman = 0, pairwise_agreement = 0, max_abs_diff = 0;
  };
  Ranking int8_ranking;
  // fp32 is its own reference: 1, 1, 0 (the Python servers say the same).
  Ranking RankingFor(Precision p) const;

  std::string GraphPath(Precision p) const;
  std::string TokenizerPath() const;
};

// Throws std::runtime_error naming the file and key.
Manifest LoadManifest(const std::string& model_dir);

std::string ReadFile(const std::string& path);  // throws std::runtime_error

}  // namespace rmscore
