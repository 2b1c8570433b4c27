#include "service.h"

#include <deque>
#include <mutex>
#include <unordered_map>

namespace rmscore {
namespace {

double MsSince(Clock::time_point t) { return std::chrono::duration<double, std::milli>(Clock::now() - t).count(); }

void FillTimings(const JobResult& r, v1::Timings* t) {
  t->set_total_ms(r.total_ms);
  t->set_inference_ms(r.inference_ms);
  t->set_queue_ms(r.total_ms - r.inference_ms);
}

// One Score call. Lives until OnDone; finished exactly once, either at once
// (refused) or from the batcher's completion.
class ScoreCall final : public grpc::ServerUnaryReactor {
 public:
  ScoreCall(RewardModelService* svc, grpc::CallbackServerContext* ctx, const v1::ScoreRequest* req,
            v1::ScoreResponse* resp)
      : svc_(svc), resp_(resp) {
    grpc::Status s = svc_->ReadyStatus();
    std::vector<SeqView> views;
    if (s.ok()) s = ValidateScoreRequest(*req, svc_->limits(), &views);
    if (s.ok()) {
      // The views point into *req, which gRPC keeps until OnDone, after Finish.
      job_ = std::make_shared<Job>(std::move(views), SteadyDeadline(*ctx), nullptr,
                                   [this](JobResult&& r) { Scored(std::move(r)); });
      s = svc_->batcher()->Submit(job_);
    }
    if (!s.ok()) Answer(s);
  }

  void OnCancel() override {
    if (job_) svc_->batcher()->Cancel(job_);
  }
  void OnDone() override { delete this; }

 private:
  void Scored(JobResult&& r) {
    if (r.status.ok()) {
      resp_->mutable_scores()->Add(r.scores.begin(), r.scores.end());
      resp_->set_model_version(svc_->model_version());
      FillTimings(r, resp_->mutable_timings());
    }
    Answer(r.status);
  }
  void Answer(const grpc::Status& s) {
    svc_->metrics()->RequestAnswered(s.error_code(), MsSince(start_) / 1e3);
    Finish(s);  // last touch of `this`: OnDone may run at once on another thread
  }

  RewardModelService* const svc_;
  v1::ScoreResponse* const resp_;
  const Clock::time_point start_ = Clock::now();
  std::shared_ptr<Job> job_;
};

// One ScoreStream call. Reads one item at a time and submits it; answers are
// written in completion order through a queue with one write in flight.
// Finishes when the client has half-closed (or cancelled), every accepted
// item is answered and the write queue is empty.
class StreamCall final : public grpc::ServerBidiReactor<v1::ScoreStreamRequest, v1::ScoreStreamResponse> {
 public:
  StreamCall(RewardModelService* svc, grpc::CallbackServerContext* ctx)
      : svc_(svc), deadline_(SteadyDeadline(*ctx)) {
    StartRead(&incoming_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {  // half-close or cancellation: no more items
      {
        std::lock_guard<std::mutex> lk(mu_);
        reads_done_ = true;
      }
      MaybeFinish();
      return;
    }
    auto item = std::make_shared<v1::ScoreStreamRequest>();
    item->Swap(&incoming_);
    Handle(item);
    StartRead(&incoming_);
  }

  void OnWriteDone(bool ok) override {
    const v1::ScoreStreamResponse* next = nullptr;
    {
      std::lock_guard<std::mutex> lk(mu_);
      writes_.pop_front();
      if (!ok) broken_ = true;  // the client is gone: drop the rest
      if (broken_) writes_.clear();
      if (!writes_.empty()) {
        next = &writes_.front();
      } else {
        writing_ = false;
      }
    }
    if (next) {
      StartWrite(next);
    } else {
      MaybeFinish();
    }
  }

  void OnCancel() override {
    std::vector<std::shared_ptr<Job>> jobs;
    {
      std::lock_guard<std::mutex> lk(mu_);
      cancelled_ = true;
      for (auto& [_, job] : outstanding_) jobs.push_back(job);
    }
    for (auto& job : jobs) svc_->batcher()->Cancel(job);
  }

  void OnDone() override { delete this; }

 private:
  void Handle(const std::shared_ptr<v1::ScoreStreamRequest>& item) {
    const Clock::time_point start = Clock::now();
    grpc::Status s = svc_->ReadyStatus();
    SeqView view;
    if (s.ok()) s = ValidateStreamItem(*item, svc_->limits(), &view);
    if (s.ok()) {
      auto job = std::make_shared<Job>(
          std::vector<SeqView>{view}, deadline_, item,
          [this, item, start](JobResult&& r) { Scored(*item, start, std::move(r)); });
      {
        std::lock_guard<std::mutex> lk(mu_);
        outstanding_.emplace(item.get(), job);
      }
      s = svc_->batcher()->Submit(job);
      if (s.ok()) return;
      std::lock_guard<std::mutex> lk(mu_);
      outstanding_.erase(item.get());
    }
    v1::ScoreStreamResponse resp;
    resp.set_id(item->id());
    resp.mutable_error()->set_code(int(s.error_code()));
    resp.mutable_error()->set_message(s.error_message());
    resp.set_model_version(svc_->model_version());
    Respond(std::move(resp), s.error_code(), start);
  }

  // Runs on a batcher thread.
  void Scored(const v1::ScoreStreamRequest& item, Clock::time_point start, JobResult&& r) {
    v1::ScoreStreamResponse resp;
    resp.set_id(item.id());
    if (r.status.ok()) {
      resp.set_score(r.scores.at(0));
    } else {
      resp.mutable_error()->set_code(int(r.status.error_code()));
      resp.mutable_error()->set_message(r.status.error_message());
    }
    resp.set_model_version(svc_->model_version());
    FillTimings(r, resp.mutable_timings());
    Respond(std::move(resp), r.status.error_code(), start, &item);
  }

  // Queues an answer (writing it at once when no write is in flight); when
  // `done_item` is set, that item stops being outstanding in the same step,
  // so the call cannot finish between the two.
  void Respond(v1::ScoreStreamResponse&& resp, grpc::StatusCode code, Clock::time_point start,
               const v1::ScoreStreamRequest* done_item = nullptr) {
    svc_->metrics()->RequestAnswered(code, MsSince(start) / 1e3);
    const v1::ScoreStreamResponse* next = nullptr;
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (done_item) outstanding_.erase(done_item);
      if (!broken_ && !cancelled_) {
        writes_.push_back(std::move(resp));
        if (!writing_) {
          writing_ = true;
          next = &writes_.front();
        }
      }
    }
    if (next) {
      StartWrite(next);
    } else {
      MaybeFinish();
    }
  }

  void MaybeFinish() {
    grpc::Status status;
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (finished_ || !reads_done_ || !outstanding_.empty() || writing_) return;
      finished_ = true;
      if (cancelled_) status = grpc::Status(grpc::StatusCode::CANCELLED, "cancelled");
    }
    Finish(status);  // last touch of `this`
  }

  RewardModelService* const svc_;
  const std::optional<Clock::time_point> deadline_;
  v1::ScoreStreamRequest incoming_;

  std::mutex mu_;
  std::deque<v1::ScoreStreamResponse> writes_;  // front is in flight while writing_
  // Accepted items not yet answered, by their request message.
  std::unordered_map<const v1::ScoreStreamRequest*, std::shared_ptr<Job>> outstanding_;
  bool writing_ = false, reads_done_ = false, cancelled_ = false, broken_ = false, finished_ = false;
};

}  // namespace

std::optional<Clock::time_point> SteadyDeadline(const grpc::CallbackServerContext& ctx) {
  const auto deadline = ctx.deadline();
  const auto now = std::chrono::system_clock::now();
  // No deadline reads as a time centuries away.
  if (deadline - now > std::chrono::hours(24 * 365)) return std::nullopt;
  return Clock::now() + std::chrono::duration_cast<Clock::duration>(deadline - now);
}

RewardModelService::RewardModelService(const Config& cfg, const Manifest& manifest, std::string tokenizer_json,
                                       Metrics* metrics)
    : cfg_(cfg),
      manifest_(manifest),
      tokenizer_json_(std::move(tokenizer_json)),
      metrics_(metrics),
      limits_{manifest.vocab_size, manifest.max_sequence_length, cfg.max_sequences_per_request} {}

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

grpc::ServerUnaryReactor* RewardModelService::Score(grpc::CallbackServerContext* ctx, const v1::ScoreRequest* req,
                                                    v1::ScoreResponse* resp) {
  return new ScoreCall(this, ctx, req, resp);
}

grpc::ServerBidiReactor<v1::ScoreStreamRequest, v1::ScoreStreamResponse>* RewardModelService::ScoreStream(
    grpc::CallbackServerContext* ctx) {
  return new StreamCall(this, ctx);
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
  auto* reactor = ctx->DefaultReactor();
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

}  // namespace rmscore
