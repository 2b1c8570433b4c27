// libFuzzer target: the C++ server's request decoding, validation and tensor
// packing (docs/fuzzing.md). Bytes are parsed as a ScoreRequest (the Score RPC)
// and as a ScoreStreamRequest (one ScoreStream item), as gRPC hands them to
// service.cc; each parsed message is validated against two limit sets (the
// default model's, and tiny ones so that truncation and the per-request cap
// are reached by short inputs), and what validates is packed as batcher.cc
// packs a batch. A sanitizer report or a broken invariant (abort) is a crash.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "rmscore/v1/reward.pb.h"
#include "validation.h"

namespace {

using rmscore::Limits;
using rmscore::SeqView;
namespace v1 = rmscore::v1;

#define CHECK(cond)                                                                       \
  do {                                                                                    \
    if (!(cond)) {                                                                        \
      std::fprintf(stderr, "invariant broken: %s (%s:%d)\n", #cond, __FILE__, __LINE__); \
      std::abort();                                                                       \
    }                                                                                     \
  } while (0)

constexpr Limits kModel{30522, 512, 1024};  // models/default
constexpr Limits kTiny{50, 4, 3};
constexpr int64_t kPad = 0;

bool StartsWith(const std::string& s, const std::string& prefix) { return s.rfind(prefix, 0) == 0; }

// Every contract message names the field at fault first.
void CheckRefusal(const grpc::Status& s, const std::string& prefix) {
  CHECK(s.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
  CHECK(StartsWith(s.error_message(), prefix) || StartsWith(s.error_message(), "truncation: "));
}

// A view lies inside the ids it was cut from, is what the truncation mode
// keeps (all of it, a prefix, or a suffix), and holds in-vocabulary ids only.
void CheckView(const SeqView& v, const v1::TokenIds& tokens, v1::Truncation truncation, const Limits& limits) {
  const auto& ids = tokens.ids();
  const int64_t n = ids.size();
  CHECK(v.length >= 1 && v.length <= limits.max_sequence_length);
  CHECK(v.ids >= ids.data() && v.ids + v.length <= ids.data() + n);
  if (n <= limits.max_sequence_length) {
    CHECK(v.ids == ids.data() && v.length == n);
  } else if (truncation == v1::TRUNCATION_LEFT) {
    CHECK(v.ids + v.length == ids.data() + n && v.length == limits.max_sequence_length);
  } else {
    CHECK(truncation == v1::TRUNCATION_RIGHT && v.ids == ids.data() && v.length == limits.max_sequence_length);
  }
  for (int64_t j = 0; j < v.length; ++j) CHECK(v.ids[j] >= 0 && v.ids[j] < limits.vocab_size);
}

// The packed tensors the model gets: row r holds sequence r then padding,
// the mask marks exactly the real tokens.
void CheckPack(const std::vector<SeqView>& seqs) {
  const rmscore::PackedBatch b = rmscore::Pack(seqs, kPad);
  CHECK(b.batch == int64_t(seqs.size()));
  int64_t longest = 0, real = 0;
  for (const SeqView& s : seqs) longest = std::max(longest, s.length), real += s.length;
  CHECK(b.longest == longest && b.real_tokens == real);
  CHECK(b.input_ids.size() == size_t(b.batch * b.longest) && b.attention_mask.size() == b.input_ids.size());
  for (size_t r = 0; r < seqs.size(); ++r) {
    for (int64_t c = 0; c < b.longest; ++c) {
      const size_t k = r * size_t(b.longest) + size_t(c);
      const bool real_token = c < seqs[r].length;
      CHECK(b.attention_mask[k] == (real_token ? 1 : 0));
      CHECK(b.input_ids[k] == (real_token ? seqs[r].ids[c] : kPad));
    }
  }
  const double ratio = b.padding_ratio();
  CHECK(ratio >= 0.0 && ratio < 1.0);
}

void FuzzScore(const v1::ScoreRequest& req, const Limits& limits) {
  std::vector<SeqView> views;
  const grpc::Status s = rmscore::ValidateScoreRequest(req, limits, &views);
  if (!s.ok()) return CheckRefusal(s, "sequences");
  CHECK(req.sequences_size() >= 1 && req.sequences_size() <= limits.max_sequences_per_request);
  CHECK(views.size() == size_t(req.sequences_size()));
  for (int i = 0; i < req.sequences_size(); ++i) {
    CHECK(req.sequences(i).has_tokens());
    CheckView(views[size_t(i)], req.sequences(i).tokens(), req.truncation(), limits);
  }
  CheckPack(views);
}

void FuzzStreamItem(const v1::ScoreStreamRequest& item, const Limits& limits) {
  SeqView view;
  const grpc::Status s = rmscore::ValidateStreamItem(item, limits, &view);
  if (!s.ok()) return CheckRefusal(s, "sequence");
  CHECK(item.sequence().has_tokens());
  CheckView(view, item.sequence().tokens(), item.truncation(), limits);
  // One stream item is batched with others: pack it alone and beside a longer row.
  CheckPack({view});
  const int64_t other[] = {1, 2, 3, 4, 5};
  CheckPack({SeqView{other, 5}, view});
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  v1::ScoreRequest req;
  if (req.ParseFromArray(data, int(size))) {
    FuzzScore(req, kModel);
    FuzzScore(req, kTiny);
  }
  v1::ScoreStreamRequest item;
  if (item.ParseFromArray(data, int(size))) {
    FuzzStreamItem(item, kModel);
    FuzzStreamItem(item, kTiny);
  }
  return 0;
}
