// Request validation (docs/contract.md's error table, exact messages) and
// tensor packing. Pure functions over the request messages: nothing here
// copies token ids until they are packed into a batch's tensors.
#pragma once

#include <grpcpp/support/status.h>

#include <cstdint>
#include <string>
#include <vector>

#include "rmscore/v1/reward.pb.h"

namespace rmscore {

// The most token ids one sequence may send, as a multiple of max_sequence_length: truncation keeps
// max_sequence_length of them, and a longer input is refused rather than held whole (the same in
// server_py/rmscore/core/validation.py INPUT_FACTOR).
inline constexpr int64_t kInputFactor = 64;

struct Limits {
  int64_t vocab_size = 0;
  int64_t max_sequence_length = 0;
  int64_t max_sequences_per_request = 0;
};

// A validated sequence: a window into a request message's ids, already
// truncated. Valid as long as the message it points into.
struct SeqView {
  const int64_t* ids = nullptr;
  int64_t length = 0;
};

// Validates a whole Score request; on OK fills *out, one view per sequence
// in request order. Otherwise INVALID_ARGUMENT with the contract's message.
grpc::Status ValidateScoreRequest(const v1::ScoreRequest& req, const Limits& limits,
                                  std::vector<SeqView>* out);

// Validates one ScoreStream item (message prefix `sequence`).
grpc::Status ValidateStreamItem(const v1::ScoreStreamRequest& req, const Limits& limits, SeqView* out);

// Padded int64 tensors for one model batch, row-major [batch, longest]:
// ids right-padded with pad_token_id, attention_mask 1 on real tokens.
struct PackedBatch {
  int64_t batch = 0;
  int64_t longest = 0;
  std::vector<int64_t> input_ids;
  std::vector<int64_t> attention_mask;
  int64_t real_tokens = 0;
  double padding_ratio() const;
};

PackedBatch Pack(const std::vector<SeqView>& seqs, int64_t pad_token_id);

}  // namespace rmscore
