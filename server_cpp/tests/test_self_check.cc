// The start-up self-check's padded batch: the longest golden input, then the shortest, eight in all
// (server_py's runtimes.padded_rows picks the same rows; tests/unit/test_self_check.py).
#include <gtest/gtest.h>

#include "model_runner.h"

namespace rmscore {
namespace {

std::vector<std::vector<int64_t>> OfLengths(const std::vector<int64_t>& lengths) {
  std::vector<std::vector<int64_t>> out;
  for (int64_t n : lengths) out.emplace_back(size_t(n), 1);
  return out;
}

TEST(SelfCheckPaddedRows, TheLongestThenTheShortestTiesByIndex) {
  // The default model's golden lengths.
  const auto seqs = OfLengths({35, 19, 48, 50, 24, 22, 27, 23, 38, 22, 49, 51, 21, 1, 2, 3, 17, 64, 128, 255, 511, 512});
  const std::vector<size_t> rows = SelfCheckPaddedRows(seqs);
  ASSERT_EQ(rows.size(), kSelfCheckPaddedRows);
  EXPECT_EQ(rows, (std::vector<size_t>{21, 13, 14, 15, 16, 1, 12, 5}));
}

TEST(SelfCheckPaddedRows, FewInputsAreAllInIt) {
  EXPECT_EQ(SelfCheckPaddedRows(OfLengths({5, 3, 9})), (std::vector<size_t>{1, 0, 2}));
}

}  // namespace
}  // namespace rmscore
