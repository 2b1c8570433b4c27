// --max-queued-request-bytes (issue 29, defect 1): admission.h HeldBytes and the flag. The same rule
// and message as server_py/rmscore/core/admission.py (tests/unit/test_held_bytes.py).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "admission.h"
#include "config.h"

namespace rmscore {
namespace {

TEST(HeldBytes, CountsIdsAsInt64) {
  EXPECT_EQ(RequestBytes(512), 4096);
  EXPECT_EQ(RequestBytes(3, 5), 29);
}

TEST(HeldBytes, PastTheBudgetIsRefusedWithTheFiguresAndCountsNothing) {
  HeldBytes held(1000);
  ASSERT_TRUE(held.Hold(600).ok());
  const grpc::Status refused = held.Hold(401);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(refused.error_message(),
            "queue full: 600 bytes of accepted requests held, plus this request's 401, exceeds "
            "max_queued_request_bytes 1000");
  EXPECT_EQ(held.held(), 600);
  EXPECT_TRUE(held.Hold(400).ok());  // exactly at the budget fits
  EXPECT_EQ(held.held(), 1000);
}

TEST(HeldBytes, ALeaseGivesItsBytesBackWhenTheLastCopyGoes) {
  HeldBytes held(1000);
  std::shared_ptr<HeldBytes::Lease> lease;
  ASSERT_TRUE(held.Acquire(1000, &lease).ok());
  std::shared_ptr<HeldBytes::Lease> refused;
  EXPECT_FALSE(held.Acquire(1, &refused).ok());
  EXPECT_EQ(refused, nullptr);
  auto copy = lease;  // the answer callback's copy
  lease.reset();
  EXPECT_EQ(held.held(), 1000);
  copy.reset();
  EXPECT_EQ(held.held(), 0);
  EXPECT_TRUE(held.Hold(1).ok());
}

TEST(HeldBytes, AnIdleServerAcceptsOneRequestLargerThanTheBudget) {
  HeldBytes held(1000);
  EXPECT_TRUE(held.Hold(5000).ok());  // else it would be refused "queue full" forever
  EXPECT_FALSE(held.Hold(1).ok());
  held.Release(5000);
  EXPECT_TRUE(held.Hold(1).ok());
}

TEST(HeldBytes, TheFlag) {
  bool help = false;
  EXPECT_EQ(ParseConfig({}, &help).max_queued_request_bytes, INT64_C(1) << 30);
  EXPECT_EQ(ParseConfig({"--max-queued-request-bytes", "2097152"}, &help).max_queued_request_bytes, 2097152);
  try {
    ParseConfig({"--max-queued-request-bytes", "0"}, &help);
    FAIL() << "accepted 0";
  } catch (const ConfigError& e) {
    EXPECT_STREQ(e.what(), "--max-queued-request-bytes: must be >= 1, got 0");
  }
}

}  // namespace
}  // namespace rmscore
