// The rmscore.v1.RewardModel service on gRPC's callback API. No reaction
// ever blocks: Score calls and stream items are handed to the Batcher and
// finished from its completion callbacks.
//
// Score and ScoreStream are raw methods (grpc::ByteBuffer in and out) that
// parse requests themselves: grpcpp's generated deserialization would answer
// bytes that do not parse with UNIMPLEMENTED and no message, and end a stream
// at such an item as if the client had half-closed, where the contract says
// INVALID_ARGUMENT "request: malformed <Type>: ...".
#pragma once

#include <atomic>
#include <map>
#include <memory>
#include <string>
#include <string_view>

#include <grpcpp/security/server_credentials.h>
#include <grpcpp/support/byte_buffer.h>

#include "admission.h"
#include "batcher.h"
#include "config.h"
#include "manifest.h"
#include "metrics.h"
#include "rmscore/v1/reward.grpc.pb.h"
#include "validation.h"

namespace rmscore {

// A ScoreStream's window: two batches' worth, enough to keep the model's batches full, and at most a
// quarter of the queue, so one stream never holds more of it than that.
int StreamWindow(const Config& cfg);

// Only GetModelInfo keeps grpcpp's typed callback method.
using RewardModelBase = v1::RewardModel::WithRawCallbackMethod_Score<
    v1::RewardModel::WithRawCallbackMethod_ScoreStream<v1::RewardModel::WithCallbackMethod_GetModelInfo<
        v1::RewardModel::Service>>>;

// ModelInfo.chat_template and special_tokens from a model repository (read as the Python servers do).
std::string ReadChatTemplate(const std::string& model_dir);
std::map<std::string, std::string> ReadSpecialTokens(const std::string& model_dir);

class RewardModelService final : public RewardModelBase {
 public:
  RewardModelService(const Config& cfg, const Manifest& manifest, std::string tokenizer_json, Metrics* metrics);

  // Starts answering Score calls through `batcher` (which outlives every call).
  void StartServing(Batcher* batcher);
  // From now on scoring calls are refused with UNAVAILABLE "not ready: draining".
  void StartDraining();

  grpc::ServerUnaryReactor* Score(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* req,
                                  grpc::ByteBuffer* resp) override;
  grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* ScoreStream(grpc::CallbackServerContext* ctx) override;
  grpc::ServerUnaryReactor* GetModelInfo(grpc::CallbackServerContext* ctx, const v1::GetModelInfoRequest* req,
                                         v1::ModelInfo* resp) override;

  // Used by the reactors (service.cc).
  grpc::Status ReadyStatus() const;
  // ReadyStatus, then the batcher's WorkRefusal for `caller` (the call's connection, ctx->peer(): every
  // call and stream on it is one caller, served in turn with the others; admission.h): what a call gets
  // before its sequences are read (validation errors come second on a loaded server, as in Python's
  // check_admission).
  grpc::Status AdmissionStatus(std::optional<Clock::time_point> deadline, const std::string& caller) const;
  Batcher* batcher() const { return batcher_.load(); }
  Metrics* metrics() const { return metrics_; }
  const Limits& limits() const { return limits_; }
  // Bytes of accepted requests held until answered (--max-queued-request-bytes).
  HeldBytes* held_bytes() { return &held_bytes_; }
  const std::string& model_version() const { return manifest_.version; }
  // The most items one ScoreStream has read and not yet answered on the wire (score_stream.cc).
  int stream_window() const { return StreamWindow(cfg_); }

 private:
  enum State { kWarmingUp, kServing, kDraining };
  const Config& cfg_;
  const Manifest& manifest_;
  const std::string tokenizer_json_;
  // ModelInfo.chat_template and special_tokens: read from the model repository's hf/ once, here.
  const std::string chat_template_;
  const std::map<std::string, std::string> special_tokens_;
  Metrics* const metrics_;
  const Limits limits_;
  HeldBytes held_bytes_;
  std::atomic<int> state_{kWarmingUp};
  std::atomic<Batcher*> batcher_{nullptr};
};

// Parses a raw request into *msg; INVALID_ARGUMENT "request: malformed
// <Type>: the bytes do not parse as protobuf" when it does not parse. Empties
// *bytes either way.
grpc::Status ParseRequest(grpc::ByteBuffer* bytes, google::protobuf::Message* msg);
// Serializes an answer for a raw method (sharing no memory with msg); fails
// only for a message past protobuf's 2 GiB.
grpc::Status SerializeAnswer(const google::protobuf::Message& msg, grpc::ByteBuffer* out);

// The rest of Result's timings: queue time is what inference did not take.
void FillTimings(const Result& r, v1::Timings* t);
inline double MsSince(Clock::time_point t) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
}

// The refusal of a call without the right token (docs/contract.md), the same in every server.
inline constexpr const char* kUnauthenticatedMessage = "missing or invalid bearer token";

// The listening port's credentials: TLS when cfg has a certificate, and when
// cfg has a token, `authorization: Bearer <token>` required on every call
// (reflection included) except grpc.health.v1.Health, refused UNAUTHENTICATED.
std::shared_ptr<grpc::ServerCredentials> ServerCredentialsFor(const Config& cfg, Metrics* metrics);

// Whether an authorization header value is "Bearer <token>", in time that
// does not depend on where the two first differ.
bool BearerMatches(std::string_view header_value, std::string_view token);

// The call's deadline on the steady clock; nullopt when the client set none (or one over a year away).
std::optional<Clock::time_point> SteadyDeadline(const grpc::CallbackServerContext& ctx);

}  // namespace rmscore
