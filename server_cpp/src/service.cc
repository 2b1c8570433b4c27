#include "service.h"

#include <cctype>
#include <grpc/grpc_security.h>
#include <grpc/support/time.h>
#include <grpcpp/support/proto_buffer_reader.h>
#include <grpcpp/support/proto_buffer_writer.h>

#include <algorithm>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <sstream>

#include "score_stream.h"

namespace rmscore {
namespace {

int64_t IdCount(const v1::ScoreRequest& req) {
  int64_t n = 0;
  for (const auto& seq : req.sequences()) n += seq.tokens().ids_size();
  return n;
}

// One Score call. Lives until OnDone; finished exactly once, either at once
// (refused) or from the batcher's completion.
class ScoreCall final : public grpc::ServerUnaryReactor {
 public:
  ScoreCall(RewardModelService* svc, grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* bytes,
            grpc::ByteBuffer* resp)
      : svc_(svc), resp_(resp) {
    // A copy shares the bytes (reference-counted slices); parsing empties it, not gRPC's.
    grpc::ByteBuffer request_bytes(*bytes);
    // Whether the bytes parse comes first, as in the Python servers: readiness cannot mend them.
    grpc::Status s = ParseRequest(&request_bytes, &req_);
    // The caller is the connection: its calls and streams take one caller's turns (batcher.h).
    const std::string caller = ctx->peer();
    if (s.ok()) s = svc_->AdmissionStatus(SteadyDeadline(*ctx), caller);
    // Its bytes count until this call is deleted (OnDone), which frees req_ (docs/contract.md's order).
    if (s.ok()) s = svc_->held_bytes()->Acquire(RequestBytes(IdCount(req_)), &held_);
    std::vector<SeqView> views;
    if (s.ok()) s = ValidateScoreRequest(req_, svc_->limits(), &views);
    if (s.ok()) {
      // The views point into req_, which lives until OnDone, after Finish.
      job_ = std::make_shared<Job>(std::move(views), SteadyDeadline(*ctx), nullptr,
                                   [this](Result&& r) { Scored(std::move(r)); }, caller);
      s = svc_->batcher()->Submit(job_);
    }
    if (!s.ok()) Answer(s);
  }

  void OnCancel() override {
    // Cancel answers the job here, so Finish may run inside this reaction; gRPC holds the call
    // until a reaction returns, so OnDone cannot delete `this` before then.
    if (job_) svc_->batcher()->Cancel(job_);  // last touch of `this`
  }
  void OnDone() override { delete this; }

 private:
  void Scored(Result&& r) {
    if (r.status.ok()) {
      v1::ScoreResponse resp;
      resp.mutable_scores()->Add(r.scores.begin(), r.scores.end());
      resp.set_model_version(svc_->model_version());
      FillTimings(r, resp.mutable_timings());
      const grpc::Status serialized = SerializeAnswer(resp, resp_);  // fails only past 2 GiB
      if (!serialized.ok()) r.status = serialized;
    }
    Answer(r.status);
  }
  void Answer(const grpc::Status& s) {
    svc_->metrics()->RequestAnswered(s.error_code(), MsSince(start_) / 1e3);
    Finish(s);  // last touch of `this`: OnDone may run at once on another thread
  }

  RewardModelService* const svc_;
  grpc::ByteBuffer* const resp_;
  const Clock::time_point start_ = Clock::now();
  std::shared_ptr<HeldBytes::Lease> held_;  // declared before req_: given back after req_ is freed
  v1::ScoreRequest req_;
  std::shared_ptr<Job> job_;
};

// The token check runs in gRPC core's server auth filter, before any service
// sees the call, so it covers reflection too. gRPC 1.51's C++ API only takes
// an AuthMetadataProcessor on TLS credentials (InsecureServerCredentials
// asserts), so the port is added with C-core credentials, where plaintext
// credentials take a processor as well: one check for both.
struct TokenCheck {
  std::string token;
  Metrics* metrics;
};

std::string_view View(const grpc_slice& s) {
  return {reinterpret_cast<const char*>(GRPC_SLICE_START_PTR(s)), GRPC_SLICE_LENGTH(s)};
}

void CheckToken(void* state, grpc_auth_context*, const grpc_metadata* md, size_t num_md,
                grpc_process_auth_metadata_done_cb done, void* user_data) {
  const auto* check = static_cast<const TokenCheck*>(state);
  std::string_view path, authorization;
  int authorizations = 0;
  for (size_t i = 0; i < num_md; ++i) {
    const std::string_view key = View(md[i].key);
    if (key == ":path") path = View(md[i].value);
    if (key == "authorization") authorization = View(md[i].value), ++authorizations;
  }
  // Health stays open: Kubernetes probes and load balancers send no token. Two authorization headers
  // are refused: which one counts would otherwise differ between servers (Python's bearer_matches).
  const bool exempt = path.rfind("/grpc.health.v1.Health/", 0) == 0;
  if (exempt || (authorizations == 1 && BearerMatches(authorization, check->token))) {
    done(user_data, nullptr, 0, nullptr, 0, GRPC_STATUS_OK, nullptr);
    return;
  }
  check->metrics->RequestAnswered(grpc::StatusCode::UNAUTHENTICATED, 0);
  done(user_data, nullptr, 0, nullptr, 0, GRPC_STATUS_UNAUTHENTICATED, kUnauthenticatedMessage);
}

class CoreCredentials final : public grpc::ServerCredentials {
 public:
  explicit CoreCredentials(grpc_server_credentials* creds) : creds_(creds) {}
  ~CoreCredentials() override { grpc_server_credentials_release(creds_); }
  void SetAuthMetadataProcessor(const std::shared_ptr<grpc::AuthMetadataProcessor>&) override {
    throw std::logic_error("CoreCredentials: set the processor on the C credentials");
  }

 private:
  int AddPortToServer(const std::string& addr, grpc_server* server) override {
    return grpc_server_add_http2_port(server, addr.c_str(), creds_);
  }
  grpc_server_credentials* const creds_;
};

std::string ReadPem(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::string data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (!in && !in.eof()) throw std::runtime_error("cannot read " + path);
  return data;
}

}  // namespace

grpc::Status ParseRequest(grpc::ByteBuffer* bytes, google::protobuf::Message* msg) {
  // The same parser grpcpp's typed methods use; only the refusal differs.
  if (grpc::GenericDeserialize<grpc::ProtoBufferReader, google::protobuf::Message>(bytes, msg).ok()) {
    return grpc::Status::OK;
  }
  return {grpc::StatusCode::INVALID_ARGUMENT,
          "request: malformed " + msg->GetDescriptor()->name() + ": the bytes do not parse as protobuf"};
}

grpc::Status SerializeAnswer(const google::protobuf::Message& msg, grpc::ByteBuffer* out) {
  bool own_buffer = false;
  return grpc::GenericSerialize<grpc::ProtoBufferWriter, google::protobuf::Message>(msg, out, &own_buffer);
}

void FillTimings(const Result& r, v1::Timings* t) {
  t->set_total_ms(r.total_ms);
  t->set_inference_ms(r.inference_ms);
  t->set_queue_ms(r.total_ms - r.inference_ms);
}

bool BearerMatches(std::string_view header_value, std::string_view token) {
  constexpr std::string_view kScheme = "bearer ";  // the scheme in any case (RFC 7235); the token exactly
  // Always walk the whole expected value, whatever the header holds.
  const size_t want = kScheme.size() + token.size();
  unsigned char diff = header_value.size() == want ? 0 : 1;
  for (size_t i = 0; i < want; ++i) {
    const char expected = i < kScheme.size() ? kScheme[i] : token[i - kScheme.size()];
    char got = i < header_value.size() ? header_value[i] : 0;
    if (i < kScheme.size()) got = static_cast<char>(std::tolower(static_cast<unsigned char>(got)));
    diff |= static_cast<unsigned char>(expected ^ got);
  }
  return diff == 0;
}

std::shared_ptr<grpc::ServerCredentials> ServerCredentialsFor(const Config& cfg, Metrics* metrics) {
  if (!cfg.tls() && cfg.auth_token.empty()) return grpc::InsecureServerCredentials();
  grpc_server_credentials* creds = nullptr;
  if (cfg.tls()) {
    const std::string key = ReadPem(cfg.tls_key_file), cert = ReadPem(cfg.tls_cert_file);
    grpc_ssl_pem_key_cert_pair pair{key.c_str(), cert.c_str()};
    creds = grpc_ssl_server_credentials_create_ex(nullptr, &pair, 1, GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE,
                                                  nullptr);
    if (creds == nullptr) throw std::runtime_error("cannot use --tls-cert-file / --tls-key-file as a TLS key pair");
  } else {
    creds = grpc_insecure_server_credentials_create();
  }
  if (!cfg.auth_token.empty()) {
    grpc_auth_metadata_processor processor{};
    processor.process = CheckToken;
    processor.destroy = [](void* state) { delete static_cast<TokenCheck*>(state); };
    processor.state = new TokenCheck{cfg.auth_token, metrics};
    grpc_server_credentials_set_auth_metadata_processor(creds, processor);
  }
  return std::make_shared<CoreCredentials>(creds);
}

int StreamWindow(const Config& cfg) { return cfg.max_stream_items_in_flight; }

std::optional<Clock::time_point> SteadyDeadline(const grpc::CallbackServerContext& ctx) {
  // gRPC's own timespec, not ctx.deadline(): grpcpp converts that to system_clock nanoseconds, which
  // overflow past year 2262, so a far `grpc-timeout` (99999999H is the most its 8 digits say) came
  // back as a time in the past and the call was refused as expired.
  const gpr_timespec deadline = ctx.raw_deadline();
  if (gpr_time_cmp(deadline, gpr_inf_future(deadline.clock_type)) == 0) return std::nullopt;
  const gpr_timespec left = gpr_time_sub(deadline, gpr_now(deadline.clock_type));
  // No deadline, or one more than a year away: no practical deadline.
  if (left.tv_sec > int64_t(365) * 24 * 3600) return std::nullopt;
  return Clock::now() + std::chrono::seconds(left.tv_sec) + std::chrono::nanoseconds(left.tv_nsec);
}

namespace {

std::optional<std::string> ReadFileIfThere(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::nullopt;
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

nlohmann::json ReadJson(const std::string& path) {
  const auto text = ReadFileIfThere(path);
  if (!text) return nlohmann::json::object();
  auto j = nlohmann::json::parse(*text, nullptr, /*allow_exceptions=*/false);
  return j.is_object() ? j : nlohmann::json::object();
}

}  // namespace

// The model repository's own chat template, as the Python servers read it (rmscore_client.chat
// read_pretrained): hf/chat_template.jinja, else hf/tokenizer_config.json's chat_template (a string,
// or the "default" of named templates); "" when there is none.
std::string ReadChatTemplate(const std::string& model_dir) {
  if (auto jinja = ReadFileIfThere(model_dir + "/hf/chat_template.jinja")) return *jinja;
  const nlohmann::json cfg = ReadJson(model_dir + "/hf/tokenizer_config.json");
  auto it = cfg.find("chat_template");
  if (it == cfg.end()) return "";
  if (it->is_string()) return it->get<std::string>();
  if (it->is_array()) {
    for (const auto& t : *it) {
      if (t.is_object() && t.value("name", nlohmann::json()) == "default" && t.contains("template") &&
          t["template"].is_string())
        return t["template"].get<std::string>();
    }
  }
  return "";
}

// The tokenizer's named special tokens (transformers' SPECIAL_TOKENS_ATTRIBUTES) as text:
// hf/tokenizer_config.json's, then hf/special_tokens_map.json's for those it lacks; a token is a
// string or an AddedToken object's "content".
std::map<std::string, std::string> ReadSpecialTokens(const std::string& model_dir) {
  static const char* const kNames[] = {"bos_token", "eos_token", "unk_token", "sep_token",
                                       "pad_token", "cls_token", "mask_token"};
  std::map<std::string, std::string> out;
  for (const char* file : {"/hf/tokenizer_config.json", "/hf/special_tokens_map.json"}) {
    const nlohmann::json j = ReadJson(model_dir + file);
    for (const char* name : kNames) {
      if (out.count(name) != 0) continue;
      auto it = j.find(name);
      if (it == j.end()) continue;
      if (it->is_string()) {
        out[name] = it->get<std::string>();
      } else if (it->is_object() && it->contains("content") && (*it)["content"].is_string()) {
        out[name] = (*it)["content"].get<std::string>();
      }
    }
  }
  return out;
}

RewardModelService::RewardModelService(const Config& cfg, const Manifest& manifest, std::string tokenizer_json,
                                       Metrics* metrics)
    : cfg_(cfg),
      manifest_(manifest),
      tokenizer_json_(std::move(tokenizer_json)),
      chat_template_(ReadChatTemplate(cfg.model_dir)),
      special_tokens_(ReadSpecialTokens(cfg.model_dir)),
      metrics_(metrics),
      limits_{manifest.vocab_size, manifest.max_sequence_length, cfg.max_sequences_per_request},
      held_bytes_(cfg.max_queued_request_bytes) {
  // The metrics outlive the service (main.cc), so every lease given back updates a live gauge.
  if (metrics_ != nullptr) held_bytes_.OnChange([m = metrics_](int64_t held) { m->SetQueuedRequestBytes(held); });
}

void RewardModelService::StartServing(Batcher* batcher) {
  batcher_.store(batcher);
  state_.store(kServing);
}

void RewardModelService::StartDraining() { state_.store(kDraining); }

grpc::Status RewardModelService::ReadyStatus() const {
  switch (state_.load()) {
    case kServing: return grpc::Status::OK;
    case kWarmingUp: return {grpc::StatusCode::UNAVAILABLE, "not ready: warming up"};
    default: return {grpc::StatusCode::UNAVAILABLE, "not ready: draining"};
  }
}

grpc::Status RewardModelService::AdmissionStatus(std::optional<Clock::time_point> deadline,
                                                 const std::string& caller) const {
  grpc::Status s = ReadyStatus();
  return s.ok() ? batcher()->WorkRefusal(deadline, caller) : s;
}

grpc::ServerUnaryReactor* RewardModelService::Score(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* req,
                                                    grpc::ByteBuffer* resp) {
  return new ScoreCall(this, ctx, req, resp);
}

grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* RewardModelService::ScoreStream(
    grpc::CallbackServerContext* ctx) {
  return NewScoreStreamCall(this, ctx);
}

grpc::ServerUnaryReactor* RewardModelService::GetModelInfo(grpc::CallbackServerContext* ctx,
                                                           const v1::GetModelInfoRequest*, v1::ModelInfo* info) {
  info->set_name(manifest_.name);
  info->set_version(manifest_.version);
  info->set_architecture(manifest_.architecture);
  info->set_family(manifest_.family);
  info->set_pooling(manifest_.pooling);
  info->set_max_sequence_length(int32_t(manifest_.max_sequence_length));
  info->set_pad_token_id(manifest_.pad_token_id);
  info->set_vocab_size(manifest_.vocab_size);
  info->set_max_sequences_per_request(cfg_.max_sequences_per_request);
  info->set_tokenizer_json(tokenizer_json_);
  info->set_text_format(manifest_.text_format);
  info->set_accepts_text(false);
  info->set_server("cpp-grpc");
  info->set_backend("onnxruntime");
  info->set_device(ToString(cfg_.device));
  info->set_precision(ToString(cfg_.precision));
  const Manifest::Ranking r = manifest_.RankingFor(cfg_.precision);
  info->set_ranking_spearman(r.spearman);
  info->set_ranking_pairwise_agreement(r.pairwise_agreement);
  info->set_ranking_max_abs_diff(r.max_abs_diff);
  info->set_chat_template(chat_template_);
  info->mutable_special_tokens()->insert(special_tokens_.begin(), special_tokens_.end());
  auto* reactor = ctx->DefaultReactor();
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

}  // namespace rmscore
