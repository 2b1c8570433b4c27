// Flag parsing: the contract's defaults, and bad values refused quoting them.
#include <gtest/gtest.h>

#include "config.h"

namespace rmscore {
namespace {

Config Parse(std::vector<std::string> args) {
  bool help = false;
  return ParseConfig(args, &help);
}

std::string ErrorOf(std::vector<std::string> args) {
  try {
    Parse(args);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(Config, DefaultsAreTheContracts) {
  const Config c = Parse({});
  EXPECT_EQ(c.model_dir, "models/default");
  EXPECT_EQ(c.host, "127.0.0.1");
  EXPECT_EQ(c.port, 50051);
  EXPECT_EQ(c.metrics_port, 9100);
  EXPECT_EQ(c.batching, BatchingMode::kLengthAware);
  EXPECT_EQ(c.max_batch_size, 32);
  EXPECT_EQ(c.max_batch_tokens, 8192);
  EXPECT_EQ(c.max_queue_delay_us(), 2000);
  EXPECT_EQ(c.max_queue_sequences, 4096);
  EXPECT_EQ(c.max_sequences_per_request, 1024);
  EXPECT_EQ(c.max_request_bytes, 16777216);
  EXPECT_EQ(c.intra_op_threads, 2);
  EXPECT_EQ(c.inter_op_threads, 1);
  EXPECT_EQ(c.graph_optimization_level, GraphOptLevel::kAll);
  EXPECT_EQ(c.precision, Precision::kFp32);
  EXPECT_EQ(c.device, Device::kCpu);
  EXPECT_EQ(c.drain_grace_seconds, 30);
}

TEST(Config, BothFlagForms) {
  const Config c = Parse({"--port", "0", "--max-batch-size=8", "--batching", "fifo", "--max-queue-delay-ms=0.5"});
  EXPECT_EQ(c.port, 0);
  EXPECT_EQ(c.max_batch_size, 8);
  EXPECT_EQ(c.batching, BatchingMode::kFifo);
  EXPECT_EQ(c.max_queue_delay_us(), 500);
}

TEST(Config, BadValuesQuoteTheValue) {
  EXPECT_EQ(ErrorOf({"--max-batch-size", "0"}), "--max-batch-size: must be >= 1, got 0");
  EXPECT_EQ(ErrorOf({"--port", "abc"}), "--port: not an integer, got 'abc'");
  EXPECT_EQ(ErrorOf({"--port", "70000"}), "--port: must be <= 65535, got 70000");
  EXPECT_EQ(ErrorOf({"--device", "tpu"}), "--device: must be one of cpu, cuda, got 'tpu'");
  EXPECT_EQ(ErrorOf({"--max-queue-delay-ms", "-1"}), "--max-queue-delay-ms: must be >= 0, got -1");
  EXPECT_EQ(ErrorOf({"--bogus", "1"}), "unknown flag '--bogus' (see --help)");
  EXPECT_EQ(ErrorOf({"--model"}), "--model: missing value");
}

}  // namespace
}  // namespace rmscore
