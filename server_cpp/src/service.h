// The rmscore.v1.RewardModel service on gRPC's callback API. No reaction
// ever blocks: Score calls and stream items are handed to the Batcher and
// finished from its completion callbacks.
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <string_view>

#include <grpcpp/security/server_credentials.h>

#include "batcher.h"
#include "config.h"
#include "manifest.h"
#include "metrics.h"
#include "rmscore/v1/reward.grpc.pb.h"
#include "validation.h"

namespace rmscore {

class RewardModelService final : public v1::RewardModel::CallbackService {
 public:
  RewardModelService(const Config& cfg, const Manifest& manifest, std::string tokenizer_json, Metrics* metrics);

  // Starts answering Score calls through `batcher` (which outlives every call).
  void StartServing(Batcher* batcher);
  // From now on scoring calls are refused with UNAVAILABLE "not ready: draining".
  void StartDraining();

  grpc::ServerUnaryReactor* Score(grpc::CallbackServerContext* ctx, const v1::ScoreRequest* req,
                                  v1::ScoreResponse* resp) override;
  grpc::ServerBidiReactor<v1::ScoreStreamRequest, v1::ScoreStreamResponse>* ScoreStream(
      grpc::CallbackServerContext* ctx) override;
  grpc::ServerUnaryReactor* GetModelInfo(grpc::CallbackServerContext* ctx, const v1::GetModelInfoRequest* req,
                                         v1::ModelInfo* resp) override;

  // Used by the reactors (service.cc).
  grpc::Status ReadyStatus() const;
  Batcher* batcher() const { return batcher_.load(); }
  Metrics* metrics() const { return metrics_; }
  const Limits& limits() const { return limits_; }
  const std::string& model_version() const { return manifest_.version; }

 private:
  enum State { kWarmingUp, kServing, kDraining };
  const Config& cfg_;
  const Manifest& manifest_;
  const std::string tokenizer_json_;
  Metrics* const metrics_;
  const Limits limits_;
  std::atomic<int> state_{kWarmingUp};
  std::atomic<Batcher*> batcher_{nullptr};
};

// The refusal of a call without the right token (docs/contract.md), the same in every server.
inline constexpr const char* kUnauthenticatedMessage = "missing or invalid bearer token";

// The listening port's credentials: TLS when cfg has a certificate, and when
// cfg has a token, `authorization: Bearer <token>` required on every call
// (reflection included) except grpc.health.v1.Health, refused UNAUTHENTICATED.
std::shared_ptr<grpc::ServerCredentials> ServerCredentialsFor(const Config& cfg, Metrics* metrics);

// Whether an authorization header value is "Bearer <token>", in time that
// does not depend on where the two first differ.
bool BearerMatches(std::string_view header_value, std::string_view token);

// The call's deadline on the steady clock; nullopt when the client set none.
std::optional<Clock::time_point> SteadyDeadline(const grpc::CallbackServerContext& ctx);

}  // namespace rmscore
