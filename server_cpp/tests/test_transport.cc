// The transport-level defences that need no server (docs/hardening.md, "Transport attacks (C++)"):
// reflection v1's answers, the ScoreStream window and the stream limit. The attacks themselves run
// against the real server in tests/integration/test_transport_cpp.py and
// tests/conformance/test_grpcurl.py.
#include <google/protobuf/descriptor.pb.h>
#include <gtest/gtest.h>
#include <malloc.h>

#include <cstdlib>

#include "reflection_v1.h"
#include "service.h"
#include "transport.h"

namespace rmscore {
namespace {

using grpc::reflection::v1::ServerReflectionRequest;

std::vector<std::string> FileNames(const grpc::reflection::v1::ServerReflectionResponse& resp) {
  std::vector<std::string> names;
  for (const auto& bytes : resp.file_descriptor_response().file_descriptor_proto()) {
    google::protobuf::FileDescriptorProto file;
    EXPECT_TRUE(file.ParseFromString(bytes));
    names.push_back(file.name());
  }
  return names;
}

TEST(ReflectionV1, ServesTheHealthServiceItNames) {
  // gRPC's health service serializes by hand: its descriptor is ours to link in, or
  // grpcurl cannot call the health service that reflection names.
  ReflectionV1 reflection({"grpc.health.v1.Health"});
  ServerReflectionRequest req;
  req.set_file_containing_symbol("grpc.health.v1.Health");
  EXPECT_EQ(FileNames(reflection.Answer(req)), std::vector<std::string>{"grpc/health/v1/health.proto"});
  req.set_list_services("");
  const auto listed = reflection.Answer(req).list_services_response();
  ASSERT_EQ(listed.service_size(), 1);
  EXPECT_EQ(listed.service(0).name(), "grpc.health.v1.Health");
}

TEST(ReflectionV1, AnswersTheServiceProtoAndEchoesTheRequest) {
  ReflectionV1 reflection({});
  ServerReflectionRequest req;
  req.set_host("h");
  req.set_file_containing_symbol("rmscore.v1.RewardModel.Score");
  const auto resp = reflection.Answer(req);
  EXPECT_EQ(FileNames(resp), std::vector<std::string>{"rmscore/v1/reward.proto"});
  EXPECT_EQ(resp.valid_host(), "h");
  EXPECT_EQ(resp.original_request().file_containing_symbol(), "rmscore.v1.RewardModel.Score");
}

TEST(ReflectionV1, UnknownNamesAreNotFound) {
  ReflectionV1 reflection({});
  ServerReflectionRequest req;
  req.set_file_by_filename("no/such.proto");
  EXPECT_EQ(reflection.Answer(req).error_response().error_code(), int(grpc::StatusCode::NOT_FOUND));
  req.set_file_containing_symbol("no.Such");
  EXPECT_EQ(reflection.Answer(req).error_response().error_message(), "Symbol not found.");
  req.set_all_extension_numbers_of_type("no.Such");
  EXPECT_EQ(reflection.Answer(req).error_response().error_message(), "Type not found.");
}

Config ParseArgs(const std::vector<std::string>& args) {
  bool help = false;
  return ParseConfig(args, &help);
}

TEST(Transport, StreamWindowAndStreamLimitAreTheSharedFlags) {
  Config cfg = ParseArgs({"--max-stream-items-in-flight", "7", "--max-concurrent-streams", "250"});
  EXPECT_EQ(StreamWindow(cfg), 7);
  EXPECT_EQ(MaxConcurrentStreams(cfg), 250);
  Config defaults;  // the Python servers' defaults
  EXPECT_EQ(StreamWindow(defaults), 32);
  EXPECT_EQ(MaxConcurrentStreams(defaults), 100);
}

TEST(Transport, TheHttpBodyFlagsAreCheckedAsInPython) {
  EXPECT_THROW(ParseArgs({"--body-timeout-seconds", "0"}), ConfigError);
  try {
    ParseArgs({"--max-request-bytes", "2048", "--max-buffered-request-bytes", "1024"});
    FAIL() << "a buffer cap below one request was accepted";
  } catch (const ConfigError& e) {
    EXPECT_STREQ(e.what(), "--max-buffered-request-bytes: must be >= --max-request-bytes (2048), got 1024");
  }
}

// In a child process (pinning is for good), which exits with how many more blocks glibc has mmapped
// once a 2 MiB buffer is held, after an 8 MiB one was freed: glibc's own default then serves the
// 2 MiB from the heap, where the trimmer cannot give its pages back while small allocations sit beside it.
[[noreturn]] void ExitWithNewMmappedBlocks(bool pin) {
  if (pin && !PinMmapThreshold()) std::_Exit(100);
  void* volatile freed = malloc(size_t{8} << 20);  // volatile: the compiler may drop a malloc/free pair
  free(freed);
  const size_t before = mallinfo2().hblks;
  void* volatile held = malloc(size_t{2} << 20);
  const size_t after = mallinfo2().hblks;
  free(held);
  std::_Exit(int(after - before));
}

#if defined(__SANITIZE_ADDRESS__)
#define SKIP_UNDER_ASAN() GTEST_SKIP() << "AddressSanitizer's allocator replaces glibc's: no threshold to pin"
#else
#define SKIP_UNDER_ASAN() (void)0
#endif

TEST(MmapThreshold, PinnedALargeBufferIsMmappedEvenAfterABiggerOneWasFreed) {
  SKIP_UNDER_ASAN();
  // A fresh process: one forked from this one could serve the 2 MiB from what earlier tests freed.
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  unsetenv("MALLOC_MMAP_THRESHOLD_");
  EXPECT_EXIT(ExitWithNewMmappedBlocks(false), testing::ExitedWithCode(0), "");
  EXPECT_EXIT(ExitWithNewMmappedBlocks(true), testing::ExitedWithCode(1), "");
}

TEST(MmapThreshold, AnOperatorsThresholdIsLeftAsItIs) {
  SKIP_UNDER_ASAN();
  setenv("MALLOC_MMAP_THRESHOLD_", "16777216", 1);  // glibc read it at start; pinning must decline
  EXPECT_FALSE(PinMmapThreshold());
  unsetenv("MALLOC_MMAP_THRESHOLD_");
}

}  // namespace
}  // namespace rmscore
