// Validation (every bad input of docs/contract.md, exact messages and codes)
// and tensor packing (padding, attention mask, truncation).
#include <gtest/gtest.h>

#include "validation.h"

namespace rmscore {
namespace {

const Limits kLimits{/*vocab_size=*/100, /*max_sequence_length=*/8, /*max_sequences_per_request=*/3};

v1::Sequence Tokens(std::vector<int64_t> ids) {
  v1::Sequence s;
  s.mutable_tokens();  // set even when empty
  for (int64_t id : ids) s.mutable_tokens()->add_ids(id);
  return s;
}

v1::Sequence Text(const std::string& prompt, const std::string& response) {
  v1::Sequence s;
  s.mutable_text()->set_prompt(prompt);
  s.mutable_text()->set_response(response);
  return s;
}

v1::ScoreRequest Request(std::vector<v1::Sequence> seqs, v1::Truncation t = v1::TRUNCATION_NONE) {
  v1::ScoreRequest r;
  for (auto& s : seqs) *r.add_sequences() = s;
  r.set_truncation(t);
  return r;
}

void ExpectInvalid(const v1::ScoreRequest& r, const std::string& message) {
  std::vector<SeqView> views;
  const grpc::Status s = ValidateScoreRequest(r, kLimits, &views);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << message;
  EXPECT_EQ(s.error_message(), message);
}

TEST(Validation, EmptyRequest) { ExpectInvalid(Request({}), "sequences: empty request, send at least one sequence"); }

TEST(Validation, NoInputSet) {
  ExpectInvalid(Request({Tokens({1}), v1::Sequence{}}), "sequences[1]: no input set, send tokens or text");
}

TEST(Validation, EmptyTokenIds) {
  ExpectInvalid(Request({Tokens({1, 2}), Tokens({})}), "sequences[1].tokens.ids: empty sequence");
}

TEST(Validation, TokenIdOutOfRange) {
  ExpectInvalid(Request({Tokens({1}), Tokens({5, 6, 100})}),
                "sequences[1].tokens.ids[2]: token id 100 is outside the vocabulary [0, 100)");
  ExpectInvalid(Request({Tokens({-1})}), "sequences[0].tokens.ids[0]: token id -1 is outside the vocabulary [0, 100)");
}

TEST(Validation, TooLongWithoutTruncation) {
  ExpectInvalid(Request({Tokens({1, 2, 3, 4, 5, 6, 7, 8, 9})}),
                "sequences[0]: length 9 exceeds max_sequence_length 8 (set truncation to cut it)");
}

TEST(Validation, TooManySequences) {
  ExpectInvalid(Request({Tokens({1}), Tokens({1}), Tokens({1}), Tokens({1})}),
                "sequences: 4 sequences exceed max_sequences_per_request 3");
}

TEST(Validation, MixedTextAndTokens) {
  ExpectInvalid(Request({Tokens({1}), Text("p", "r")}),
                "sequences[1]: mixes text and token ids in one request; send all token ids or all text");
}

TEST(Validation, UnknownTruncationValueIsRefusedNotReadAsNone) {
  ExpectInvalid(Request({Tokens({1, 2})}, v1::Truncation(7)),
                "truncation: unknown value 7; send TRUNCATION_NONE, TRUNCATION_LEFT or TRUNCATION_RIGHT");
  v1::ScoreStreamRequest item;
  *item.mutable_sequence() = Tokens({1, 2});
  item.set_truncation(v1::Truncation(-1));
  SeqView view;
  EXPECT_EQ(ValidateStreamItem(item, kLimits, &view).error_message(),
            "truncation: unknown value -1; send TRUNCATION_NONE, TRUNCATION_LEFT or TRUNCATION_RIGHT");
}

TEST(Validation, TextIsRefusedWithAHintToSendIds) {
  ExpectInvalid(Request({Text("p", "r"), Text("q", "s")}),
                "sequences[0].text: this server does not tokenize text; send token ids "
                "(tokenize with ModelInfo.tokenizer_json)");
}

TEST(Validation, ValidRequestViewsPointIntoTheMessage) {
  const v1::ScoreRequest r = Request({Tokens({1, 2, 3}), Tokens({99})});
  std::vector<SeqView> views;
  ASSERT_TRUE(ValidateScoreRequest(r, kLimits, &views).ok());
  ASSERT_EQ(views.size(), 2u);
  EXPECT_EQ(views[0].ids, r.sequences(0).tokens().ids().data());
  EXPECT_EQ(views[0].length, 3);
  EXPECT_EQ(views[1].ids[0], 99);
}

TEST(Validation, TruncationLeftKeepsTheLastIds) {
  const v1::ScoreRequest r = Request({Tokens({1, 2, 3, 4, 5, 6, 7, 8, 9, 10})}, v1::TRUNCATION_LEFT);
  std::vector<SeqView> views;
  ASSERT_TRUE(ValidateScoreRequest(r, kLimits, &views).ok());
  EXPECT_EQ(std::vector<int64_t>(views[0].ids, views[0].ids + views[0].length),
            (std::vector<int64_t>{3, 4, 5, 6, 7, 8, 9, 10}));
}

TEST(Validation, TruncationRightKeepsTheFirstIds) {
  const v1::ScoreRequest r = Request({Tokens({1, 2, 3, 4, 5, 6, 7, 8, 9, 10})}, v1::TRUNCATION_RIGHT);
  std::vector<SeqView> views;
  ASSERT_TRUE(ValidateScoreRequest(r, kLimits, &views).ok());
  EXPECT_EQ(std::vector<int64_t>(views[0].ids, views[0].ids + views[0].length),
            (std::vector<int64_t>{1, 2, 3, 4, 5, 6, 7, 8}));
}

TEST(Validation, StreamItemUsesTheSequencePrefix) {
  v1::ScoreStreamRequest item;
  SeqView view;
  grpc::Status s = ValidateStreamItem(item, kLimits, &view);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(s.error_message(), "sequence: no input set, send tokens or text");

  *item.mutable_sequence() = Tokens({1, 200});
  s = ValidateStreamItem(item, kLimits, &view);
  EXPECT_EQ(s.error_message(), "sequence.tokens.ids[1]: token id 200 is outside the vocabulary [0, 100)");

  *item.mutable_sequence() = Text("p", "r");
  s = ValidateStreamItem(item, kLimits, &view);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(s.error_message().rfind("sequence.text: this server does not tokenize text", 0), 0u);

  *item.mutable_sequence() = Tokens({1, 2, 3, 4, 5, 6, 7, 8, 9});
  EXPECT_EQ(ValidateStreamItem(item, kLimits, &view).error_message(),
            "sequence: length 9 exceeds max_sequence_length 8 (set truncation to cut it)");
  item.set_truncation(v1::TRUNCATION_LEFT);
  ASSERT_TRUE(ValidateStreamItem(item, kLimits, &view).ok());
  EXPECT_EQ(view.length, 8);
  EXPECT_EQ(view.ids[0], 2);
}

TEST(Packing, RightPadsWithPadIdAndMasksRealTokens) {
  const std::vector<int64_t> a{5, 6, 7}, b{8};
  const PackedBatch p = Pack({SeqView{a.data(), 3}, SeqView{b.data(), 1}}, /*pad_token_id=*/42);
  EXPECT_EQ(p.batch, 2);
  EXPECT_EQ(p.longest, 3);
  EXPECT_EQ(p.input_ids, (std::vector<int64_t>{5, 6, 7, 8, 42, 42}));
  EXPECT_EQ(p.attention_mask, (std::vector<int64_t>{1, 1, 1, 1, 0, 0}));
  EXPECT_EQ(p.real_tokens, 4);
  EXPECT_DOUBLE_EQ(p.padding_ratio(), 2.0 / 6.0);
}

TEST(Packing, TruncatedViewsArePackedAsCut) {
  const v1::ScoreRequest r = Request({Tokens({1, 2, 3, 4, 5, 6, 7, 8, 9, 10}), Tokens({11, 12})}, v1::TRUNCATION_LEFT);
  std::vector<SeqView> views;
  ASSERT_TRUE(ValidateScoreRequest(r, kLimits, &views).ok());
  const PackedBatch p = Pack(views, 0);
  EXPECT_EQ(p.longest, 8);
  EXPECT_EQ(p.input_ids, (std::vector<int64_t>{3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 0, 0, 0, 0, 0, 0}));
  EXPECT_EQ(p.attention_mask, (std::vector<int64_t>{1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0}));
  EXPECT_DOUBLE_EQ(p.padding_ratio(), 6.0 / 16.0);
}

}  // namespace
}  // namespace rmscore
