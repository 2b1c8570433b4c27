// Flag parsing: the contract's defaults, and bad values refused quoting them.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <optional>

#include "config.h"
#include "service.h"

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
  EXPECT_EQ(c.batching, BatchingMode::kCostAware);
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
  EXPECT_EQ(c.warmup_rounds, 1);
  EXPECT_EQ(c.max_connection_age_ms(), 300000);
  EXPECT_EQ(c.max_connection_age_grace_ms(), 30000);
  EXPECT_FALSE(c.tls());
  EXPECT_EQ(c.auth_token, "");
}

TEST(Config, BothFlagForms) {
  const Config c = Parse({"--port", "0", "--max-batch-size=8", "--batching", "fifo", "--max-queue-delay-ms=0.5"});
  EXPECT_EQ(c.port, 0);
  EXPECT_EQ(c.max_batch_size, 8);
  EXPECT_EQ(c.batching, BatchingMode::kFifo);
  EXPECT_EQ(c.max_queue_delay_us(), 500);
  EXPECT_EQ(Parse({"--warmup-rounds", "40"}).warmup_rounds, 40);
}

TEST(Config, BadValuesQuoteTheValue) {
  EXPECT_EQ(ErrorOf({"--max-batch-size", "0"}), "--max-batch-size: must be >= 1, got 0");
  EXPECT_EQ(ErrorOf({"--port", "abc"}), "--port: not an integer, got 'abc'");
  EXPECT_EQ(ErrorOf({"--port", "70000"}), "--port: must be <= 65535, got 70000");
  EXPECT_EQ(ErrorOf({"--device", "tpu"}), "--device: must be one of cpu, cuda, got 'tpu'");
  EXPECT_EQ(ErrorOf({"--max-queue-delay-ms", "-1"}), "--max-queue-delay-ms: must be >= 0, got -1");
  EXPECT_EQ(ErrorOf({"--warmup-rounds", "0"}), "--warmup-rounds: must be >= 1, got 0");
  EXPECT_EQ(ErrorOf({"--bogus", "1"}), "unknown flag '--bogus' (see --help)");
  EXPECT_EQ(ErrorOf({"--model"}), "--model: missing value");
}

// The same rules and messages as the Python servers (tests/conformance/test_flags.py holds both).
TEST(Config, CostFlags) {
  const Config d = Parse({});
  EXPECT_EQ(d.cost_profile, "");
  EXPECT_EQ(d.cost_profile_seconds, 10.0);
  const Config c = Parse({"--batching", "cost_aware", "--cost-profile", "/tmp/p.json", "--cost-profile-seconds=2.5"});
  EXPECT_EQ(c.batching, BatchingMode::kCostAware);
  EXPECT_EQ(c.cost_profile, "/tmp/p.json");
  EXPECT_EQ(c.cost_profile_seconds, 2.5);
  EXPECT_EQ(Parse({"--cost-profile", "here.json"}).cost_profile, "here.json");
  EXPECT_EQ(ErrorOf({"--cost-profile-seconds", "0"}), "--cost-profile-seconds: must be > 0, got 0");
  EXPECT_EQ(ErrorOf({"--cost-profile", "/no/such/dir/p.json"}),
            "--cost-profile: must be a file in an existing directory, got '/no/such/dir/p.json'");
  EXPECT_EQ(ErrorOf({"--batching", "best"}), "--batching: must be one of cost_aware, fifo, length_aware, got 'best'");
  EXPECT_EQ(Parse({"--cost-profile-dir", "/var/cache/x"}).cost_profile_dir, "/var/cache/x");
  EXPECT_EQ(Parse({"--cost-profile-dir", "none"}).cost_profile_dir, "");
  EXPECT_EQ(ErrorOf({"--cost-profile-dir", "/proc/cpuinfo"}),
            "--cost-profile-dir: must be a directory (created when missing) or none, got '/proc/cpuinfo'");
}

TEST(Config, TheCostProfileCacheFollowsTheEnvironment) {
  // cost_profile.default_dir's precedence; the variables are put back as they were.
  std::map<std::string, std::optional<std::string>> saved;
  for (const char* name : {"RMSCORE_CACHE_DIR", "XDG_CACHE_HOME"}) {
    const char* v = std::getenv(name);
    saved[name] = v ? std::optional<std::string>(v) : std::nullopt;
  }
  setenv("RMSCORE_CACHE_DIR", "/c", 1);
  setenv("XDG_CACHE_HOME", "/x", 1);
  EXPECT_EQ(Parse({}).cost_profile_dir, "/c/cost-profiles");
  unsetenv("RMSCORE_CACHE_DIR");
  EXPECT_EQ(DefaultCostProfileDir(), "/x/rmscore/cost-profiles");
  for (const auto& [name, v] : saved) {
    if (v) setenv(name.c_str(), v->c_str(), 1); else unsetenv(name.c_str());
  }
}

TEST(Config, ModelWorkers) {
  EXPECT_EQ(Parse({}).model_workers, kElasticWorkers);
  EXPECT_EQ(Parse({"--model-workers", "elastic"}).model_workers, kElasticWorkers);
  EXPECT_EQ(Parse({"--model-workers", "auto"}).model_workers, kAutoWorkers);
  EXPECT_EQ(Parse({"--model-workers", "2", "--intra-op-threads", "4"}).model_workers, 2);
  EXPECT_EQ(ErrorOf({"--model-workers", "0"}), "--model-workers: must be 'elastic', 'auto' or an integer >= 1, got '0'");
  EXPECT_EQ(ErrorOf({"--model-workers", "two"}), "--model-workers: must be 'elastic', 'auto' or an integer >= 1, got 'two'");
  EXPECT_EQ(ErrorOf({"--model-workers", "4"}),
            "--model-workers: each worker needs an intra-op thread: must be <= --intra-op-threads (2), got 4");
}

TEST(Config, DrainGraceMustBePositive) {
  EXPECT_EQ(ErrorOf({"--drain-grace-seconds", "0"}), "--drain-grace-seconds: must be > 0, got 0");
  EXPECT_EQ(ErrorOf({"--drain-grace-seconds=-2"}), "--drain-grace-seconds: must be > 0, got -2");
  EXPECT_EQ(Parse({"--drain-grace-seconds", "0.5"}).drain_grace_seconds, 0.5);
}

TEST(Config, MaxConnectionAgeMustBePositiveAndFitGrpcsMilliseconds) {
  EXPECT_EQ(ErrorOf({"--max-connection-age-seconds", "0"}),
            "--max-connection-age-seconds: must be > 0 and <= 2147483, got 0");
  EXPECT_EQ(ErrorOf({"--max-connection-age-seconds=2147484"}),
            "--max-connection-age-seconds: must be > 0 and <= 2147483, got 2147484");
  EXPECT_EQ(ErrorOf({"--max-connection-age-grace-seconds", "-1"}),
            "--max-connection-age-grace-seconds: must be >= 0 and <= 2147483, got -1");
  EXPECT_EQ(ErrorOf({"--max-connection-age-seconds", "x"}), "--max-connection-age-seconds: not a number, got 'x'");
  const Config c = Parse({"--max-connection-age-seconds", "0.0001", "--max-connection-age-grace-seconds", "0"});
  EXPECT_EQ(c.max_connection_age_ms(), 1);
  EXPECT_EQ(c.max_connection_age_grace_ms(), 0);
}

TEST(Config, PerRequestLimitMustFitTheQueue) {
  EXPECT_EQ(ErrorOf({"--max-queue-sequences", "100", "--max-sequences-per-request", "101"}),
            "--max-sequences-per-request: must be <= --max-queue-sequences (100), got 101");
  // Checked once every flag is read, whatever their order.
  EXPECT_EQ(ErrorOf({"--max-sequences-per-request=2000", "--max-queue-sequences=1999"}),
            "--max-sequences-per-request: must be <= --max-queue-sequences (1999), got 2000");
  EXPECT_EQ(Parse({"--max-queue-sequences", "100", "--max-sequences-per-request", "100"}).max_sequences_per_request,
            100);
}

TEST(Config, ShutdownReserveIsThreeSecondsAtMostAndHalfTheGraceAtLeast) {
  EXPECT_EQ(Parse({}).shutdown_reserve_s(), 3.0);
  EXPECT_EQ(Parse({"--drain-grace-seconds", "4"}).shutdown_reserve_s(), 2.0);
  EXPECT_EQ(Parse({"--drain-grace-seconds", "6"}).shutdown_reserve_s(), 3.0);
}

// Files for the access-control flags, removed when the test ends.
class AccessFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/rmscore-config-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override {
    for (const auto& f : files_) std::remove(f.c_str());
    rmdir(dir_.c_str());
  }
  std::string File(const std::string& name, const std::string& content) {
    const std::string path = dir_ + "/" + name;
    std::ofstream(path) << content;
    files_.push_back(path);
    return path;
  }
  std::string dir_;
  std::vector<std::string> files_;
};

TEST_F(AccessFiles, TokenIsReadAndStripped) {
  const std::string token = File("token", "  s3cret-Token_1\n");
  const std::string cert = File("cert.pem", "PEM"), key = File("key.pem", "PEM");
  const Config c = Parse({"--auth-token-file", token, "--tls-cert-file", cert, "--tls-key-file=" + key});
  EXPECT_EQ(c.auth_token, "s3cret-Token_1");
  EXPECT_TRUE(c.tls());
  EXPECT_EQ(c.tls_cert_file, cert);
  EXPECT_EQ(c.tls_key_file, key);
}

// The same messages as the Python servers (tests/conformance/test_flags.py holds both to them).
TEST_F(AccessFiles, BadAccessFlagsQuoteThePath) {
  const std::string cert = File("cert.pem", "PEM"), key = File("key.pem", "PEM");
  const std::string blank = File("blank", " \n\t\n"), spaced = File("spaced", "two words\n");
  const std::string missing = dir_ + "/missing";
  EXPECT_EQ(ErrorOf({"--tls-cert-file", cert}),
            "--tls-cert-file: needs --tls-key-file too (TLS takes both or neither), got '" + cert + "'");
  EXPECT_EQ(ErrorOf({"--tls-key-file", key}),
            "--tls-key-file: needs --tls-cert-file too (TLS takes both or neither), got '" + key + "'");
  EXPECT_EQ(ErrorOf({"--tls-cert-file", missing, "--tls-key-file", key}),
            "--tls-cert-file: cannot read the file, got '" + missing + "'");
  EXPECT_EQ(ErrorOf({"--tls-cert-file", cert, "--tls-key-file", dir_}),
            "--tls-key-file: cannot read the file, got '" + dir_ + "'");
  EXPECT_EQ(ErrorOf({"--auth-token-file", missing}), "--auth-token-file: cannot read the file, got '" + missing + "'");
  EXPECT_EQ(ErrorOf({"--auth-token-file", blank}), "--auth-token-file: the file holds no token, got '" + blank + "'");
  EXPECT_EQ(ErrorOf({"--auth-token-file", spaced}),
            "--auth-token-file: the token must be printable ASCII without spaces, got '" + spaced + "'");
  EXPECT_EQ(ErrorOf({"--auth-token-file="}), "--auth-token-file: must not be empty");
}

TEST(Bearer, OnlyTheExactValueMatches) {
  EXPECT_TRUE(BearerMatches("Bearer abc", "abc"));
  EXPECT_TRUE(BearerMatches("bearer abc", "abc"));  // the scheme in any case (RFC 7235)
  EXPECT_TRUE(BearerMatches("BEARER abc", "abc"));
  EXPECT_FALSE(BearerMatches("Bearer ABC", "abc"));  // the token exactly
  EXPECT_FALSE(BearerMatches("", "abc"));
  EXPECT_FALSE(BearerMatches("Bearer ", "abc"));
  EXPECT_FALSE(BearerMatches("Bearer ab", "abc"));
  EXPECT_FALSE(BearerMatches("Bearer abcd", "abc"));
  EXPECT_FALSE(BearerMatches("Bearer abd", "abc"));
  EXPECT_FALSE(BearerMatches("abc", "abc"));
  EXPECT_FALSE(BearerMatches("Basic abc", "abc"));
  EXPECT_FALSE(BearerMatches(std::string_view("Bearer abc\0", 11), "abc"));
}

TEST(Config, HttpOnlyFlagsAreRefusedInPyGrpcsWords) {
  EXPECT_EQ(ErrorOf({"--chat-template", "model"}),
            "--chat-template: applies to the HTTP server's framework routes only; add --transport http, got 'model'");
  EXPECT_EQ(ErrorOf({"--strip-string=</s>"}),
            "--strip-string: applies to the HTTP server's framework routes only; add --transport http, got ('</s>',)");
}

// ModelInfo.chat_template and special_tokens, read as rmscore_client.chat.read_pretrained reads them.
TEST(ModelInfo, ChatTemplateAndSpecialTokensFromTheRepository) {
  char tmpl[] = "/tmp/rmscore-chat-XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl, hf = dir + "/hf";
  ASSERT_EQ(mkdir(hf.c_str(), 0700), 0);
  auto write = [&](const std::string& name, const std::string& text) { std::ofstream(hf + "/" + name) << text; };
  EXPECT_EQ(ReadChatTemplate(dir), "");  // no tokenizer_config.json at all
  EXPECT_TRUE(ReadSpecialTokens(dir).empty());
  write("tokenizer_config.json", R"({"cls_token": "[CLS]", "sep_token": {"content": "[SEP]"}, "bos_token": null,
    "chat_template": [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D"}]})");
  write("special_tokens_map.json", R"({"sep_token": "ignored", "unk_token": "[UNK]"})");
  EXPECT_EQ(ReadChatTemplate(dir), "D");
  const std::map<std::string, std::string> want{{"cls_token", "[CLS]"}, {"sep_token", "[SEP]"}, {"unk_token", "[UNK]"}};
  EXPECT_EQ(ReadSpecialTokens(dir), want);
  write("chat_template.jinja", "J\n");
  EXPECT_EQ(ReadChatTemplate(dir), "J\n");  // the .jinja file first, as transformers
  for (const char* f : {"tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja"})
    std::remove((hf + "/" + f).c_str());
  rmdir(hf.c_str());
  rmdir(dir.c_str());
}

}  // namespace
}  // namespace rmscore
