#include "validation.h"

#include <algorithm>

namespace rmscore {
namespace {

grpc::Status Invalid(std::string msg) { return {grpc::StatusCode::INVALID_ARGUMENT, std::move(msg)}; }

// Checks one token-id sequence and cuts it as `truncation` says.
// `prefix` is "sequences[i]" (Score) or "sequence" (ScoreStream).
grpc::Status CheckTokens(const v1::TokenIds& tokens, v1::Truncation truncation, const Limits& limits,
                         const std::string& prefix, SeqView* out) {
  const auto& ids = tokens.ids();
  if (ids.empty()) return Invalid(prefix + ".tokens.ids: empty sequence");
  // Refused before anything looks at its ids: a sequence is held (SeqView points into its message)
  // until answered, so one of millions of ids kept whole would hold what admission, which counts
  // the max_sequence_length ids it runs, never sees (docs/contract.md, "Input bounds").
  const int64_t most = kInputFactor * limits.max_sequence_length;
  if (ids.size() > most) {
    return Invalid(prefix + ".tokens.ids: length " + std::to_string(ids.size()) + " exceeds " +
                   std::to_string(most) + ", the most a sequence may send even with truncation (" +
                   std::to_string(kInputFactor) + " x max_sequence_length " +
                   std::to_string(limits.max_sequence_length) + "); cut it before sending");
  }
  for (int j = 0; j < ids.size(); ++j) {
    if (ids[j] < 0 || ids[j] >= limits.vocab_size) {
      return Invalid(prefix + ".tokens.ids[" + std::to_string(j) + "]: token id " + std::to_string(ids[j]) +
                     " is outside the vocabulary [0, " + std::to_string(limits.vocab_size) + ")");
    }
  }
  const int64_t len = ids.size();
  const int64_t max_len = limits.max_sequence_length;
  out->ids = ids.data();
  out->length = len;
  if (len <= max_len) return grpc::Status::OK;
  switch (truncation) {
    case v1::TRUNCATION_LEFT:  // keep the last max_len ids (the response end)
      out->ids = ids.data() + (len - max_len);
      out->length = max_len;
      return grpc::Status::OK;
    case v1::TRUNCATION_RIGHT:  // keep the first max_len ids
      out->length = max_len;
      return grpc::Status::OK;
    default:
      return Invalid(prefix + ": length " + std::to_string(len) + " exceeds max_sequence_length " +
                     std::to_string(max_len) + " (set truncation to cut it)");
  }
}

// proto3 enums are open: an unknown value arrives as itself and is refused,
// never read as TRUNCATION_NONE (the same words as the Python servers).
grpc::Status CheckTruncation(int truncation) {
  if (v1::Truncation_IsValid(truncation)) return grpc::Status::OK;
  return Invalid("truncation: unknown value " + std::to_string(truncation) +
                 "; send TRUNCATION_NONE, TRUNCATION_LEFT or TRUNCATION_RIGHT");
}

std::string TextRefusal(const std::string& prefix) {
  return prefix + ".text: this server does not tokenize text; send token ids (tokenize with ModelInfo.tokenizer_json)";
}

}  // namespace

grpc::Status ValidateScoreRequest(const v1::ScoreRequest& req, const Limits& limits, std::vector<SeqView>* out) {
  if (grpc::Status s = CheckTruncation(req.truncation()); !s.ok()) return s;
  const int n = req.sequences_size();
  if (n == 0) return Invalid("sequences: empty request, send at least one sequence");
  if (n > limits.max_sequences_per_request) {
    return Invalid("sequences: " + std::to_string(n) + " sequences exceed max_sequences_per_request " +
                   std::to_string(limits.max_sequences_per_request));
  }
  // Shape first (every sequence set, one kind per request), then contents.
  const auto first_kind = req.sequences(0).input_case();
  for (int i = 0; i < n; ++i) {
    const auto kind = req.sequences(i).input_case();
    const std::string prefix = "sequences[" + std::to_string(i) + "]";
    if (kind == v1::Sequence::INPUT_NOT_SET) return Invalid(prefix + ": no input set, send tokens or text");
    if (first_kind != v1::Sequence::INPUT_NOT_SET && kind != first_kind) {
      return Invalid(prefix + ": mixes text and token ids in one request; send all token ids or all text");
    }
  }
  if (first_kind == v1::Sequence::kText) return Invalid(TextRefusal("sequences[0]"));
  out->assign(size_t(n), SeqView{});
  for (int i = 0; i < n; ++i) {
    grpc::Status s = CheckTokens(req.sequences(i).tokens(), req.truncation(), limits,
                                 "sequences[" + std::to_string(i) + "]", &(*out)[size_t(i)]);
    if (!s.ok()) return s;
  }
  return grpc::Status::OK;
}

grpc::Status ValidateStreamItem(const v1::ScoreStreamRequest& req, const Limits& limits, SeqView* out) {
  if (grpc::Status s = CheckTruncation(req.truncation()); !s.ok()) return s;
  const auto kind = req.sequence().input_case();
  if (kind == v1::Sequence::INPUT_NOT_SET) return Invalid("sequence: no input set, send tokens or text");
  if (kind == v1::Sequence::kText) return Invalid(TextRefusal("sequence"));
  return CheckTokens(req.sequence().tokens(), req.truncation(), limits, "sequence", out);
}

double PackedBatch::padding_ratio() const {
  const int64_t total = batch * longest;
  return total == 0 ? 0.0 : double(total - real_tokens) / double(total);
}

PackedBatch Pack(const std::vector<SeqView>& seqs, int64_t pad_token_id) {
  PackedBatch b;
  b.batch = int64_t(seqs.size());
  for (const SeqView& s : seqs) b.longest = std::max(b.longest, s.length);
  const size_t total = size_t(b.batch * b.longest);
  b.input_ids.assign(total, pad_token_id);
  b.attention_mask.assign(total, 0);
  for (size_t r = 0; r < seqs.size(); ++r) {
    const SeqView& s = seqs[r];
    int64_t* row_ids = b.input_ids.data() + r * size_t(b.longest);
    int64_t* row_mask = b.attention_mask.data() + r * size_t(b.longest);
    std::copy(s.ids, s.ids + s.length, row_ids);
    std::fill(row_mask, row_mask + s.length, int64_t{1});
    b.real_tokens += s.length;
  }
  return b;
}

}  // namespace rmscore
