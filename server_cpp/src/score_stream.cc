#include "score_stream.h"

#include <grpcpp/alarm.h>

#include <algorithm>
#include <deque>
#include <memory>
#include <mutex>
#include <unordered_map>

#include "service.h"

namespace rmscore {
namespace {

// gRPC cancels a call when its deadline passes, and an answer written then never reaches the client: the
// items still owed are answered this long before it (a tenth of the call's time, at most 250 ms), each
// DEADLINE_EXCEEDED with this message, so a client can tell every item scored from every item not.
// Python's frontends/grpc_server.py holds the same bound and words.
constexpr auto kAnswerMarginMax = std::chrono::milliseconds(250);
constexpr const char* kStreamDeadlineMessage = "deadline exceeded before scoring: the stream's deadline is near";

std::optional<Clock::time_point> AnswerBy(std::optional<Clock::time_point> deadline) {
  if (!deadline) return std::nullopt;
  const auto left = std::max(Clock::duration::zero(), *deadline - Clock::now());
  return *deadline - std::min<Clock::duration>(kAnswerMarginMax, left / 10);
}

// One ScoreStream call. Reads one item at a time and submits it; answers are
// written in completion order through a queue with one write in flight.
// Flow control: while `window` items are read but their answers not yet
// written (scoring, or waiting for a client that does not read), no next read
// starts, so HTTP/2 flow control stops the client's writes instead of the
// server queueing answers it cannot send, and one stream holds at most
// `window` sequences of the shared queue.
// Finishes when the client has half-closed (or cancelled), every accepted
// item is answered and the write queue is empty. An item that does not parse
// has no id to answer it by, so it ends the call: reading stops, accepted
// items are cancelled and their answers dropped, and the call finishes with
// INVALID_ARGUMENT once the answers already queued are written.
class StreamCall final : public grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  StreamCall(RewardModelService* svc, grpc::CallbackServerContext* ctx)
      : svc_(svc), deadline_(AnswerBy(SteadyDeadline(*ctx))), caller_(ctx->peer()),
        window_(size_t(svc->stream_window())) {
    if (deadline_) {
      guard_ = std::make_shared<AlarmGuard>();
      guard_->call = this;
      const auto left = std::chrono::duration_cast<std::chrono::nanoseconds>(*deadline_ - Clock::now());
      const gpr_timespec at = gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC),
                                           gpr_time_from_nanos(std::max<int64_t>(0, left.count()), GPR_TIMESPAN));
      // The alarm may fire (or be cancelled, ok = false) after this call is gone: it reaches the call
      // only through the guard, which OnDone empties before `this` is deleted.
      alarm_.Set(at, [guard = guard_](bool ok) {
        if (ok) AnswerByPassed(*guard);
      });
    }
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
    const Clock::time_point start = Clock::now();
    auto item = std::make_shared<v1::ScoreStreamRequest>();
    const grpc::Status parsed = ParseRequest(&incoming_, item.get());
    if (!parsed.ok()) {
      EndMalformed(parsed, start);
      return;
    }
    Handle(item, start);
    bool read_more = false, finish_now = false;
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (cancelled_) {  // OnCancel ran meanwhile: no read is pending, none will start
        reads_done_ = finish_now = true;
      } else if (UnsentLocked() < window_) {
        read_more = true;
      } else {
        read_paused_ = true;  // OnWriteDone (or Respond) starts the next read
      }
    }
    if (read_more) StartRead(&incoming_);
    if (finish_now) MaybeFinish();
  }

  void OnWriteDone(bool ok) override {
    const grpc::ByteBuffer* next = nullptr;
    bool resume = false;
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
      resume = ResumeReadLocked();
    }
    // A read pending keeps reads_done_ false, so the call cannot finish (nor `this` go) before it ends.
    if (resume) StartRead(&incoming_);
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
      // A paused stream has no read pending, so no OnReadDone(false) will say the reads are over.
      if (read_paused_) reads_done_ = true;
      for (auto& [_, job] : outstanding_) jobs.push_back(job);
    }
    // Each Cancel answers its item here (Scored -> Respond), and the last may Finish the call;
    // gRPC holds the call until a reaction returns, so `this` stays valid through the loop.
    for (auto& job : jobs) svc_->batcher()->Cancel(job);
    MaybeFinish();  // with nothing outstanding no Respond finishes it; a no-op once finished
  }

  void OnDone() override {
    if (guard_) {
      std::lock_guard<std::mutex> lk(guard_->mu);  // an alarm callback that holds it is done with `this` after
      guard_->call = nullptr;
    }
    delete this;  // ~Alarm cancels an alarm that has not fired
  }

 private:
  struct AlarmGuard {
    std::mutex mu;
    StreamCall* call = nullptr;  // null once the call is done
  };

  // On gRPC's alarm thread, at deadline_: every item not answered yet is answered DEADLINE_EXCEEDED now
  // (queued or in a running batch, whose score is then ignored), while the call can still carry it.
  static void AnswerByPassed(AlarmGuard& guard) {
    StreamCall* call;
    std::vector<std::shared_ptr<Job>> jobs;
    {
      std::lock_guard<std::mutex> g(guard.mu);
      call = guard.call;
      if (!call) return;
      std::lock_guard<std::mutex> lk(call->mu_);
      if (call->finished_) return;
      call->alarm_answering_ = true;  // the call cannot finish, so `call` stays, until this is cleared
      for (auto& [_, job] : call->outstanding_) jobs.push_back(job);
    }
    const grpc::Status late(grpc::StatusCode::DEADLINE_EXCEEDED, kStreamDeadlineMessage);
    // Dropped sequences count as "cancelled", as in Python, where the item's task is cancelled for its call.
    for (auto& job : jobs) call->svc_->batcher()->Fail(job, late, "cancelled");  // each answers through Respond
    grpc::Status status;
    bool finish;
    {
      std::lock_guard<std::mutex> lk(call->mu_);
      call->alarm_answering_ = false;
      finish = call->FinishableLocked(&status);
    }
    if (finish) call->Finish(status);  // last touch of `call`
  }

  void Handle(const std::shared_ptr<v1::ScoreStreamRequest>& item, Clock::time_point start) {
    // Past deadline_ (the answer-by time, a margin before the call's deadline) an item gets what the alarm
    // gave the items it found, before anything else is checked, as in Python: the admission check would
    // pass it on an idle server, and validation then answer an invalid one INVALID_ARGUMENT.
    grpc::Status s = deadline_ && Clock::now() >= *deadline_
                         ? grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, kStreamDeadlineMessage)
                         : svc_->AdmissionStatus(deadline_, caller_);
    // The item's bytes count until its job and answer callback, which hold it, are gone.
    std::shared_ptr<HeldBytes::Lease> held;
    if (s.ok()) s = svc_->held_bytes()->Acquire(RequestBytes(item->sequence().tokens().ids_size()), &held);
    SeqView view;
    if (s.ok()) s = ValidateStreamItem(*item, svc_->limits(), &view);
    if (s.ok()) {
      auto job = std::make_shared<Job>(
          std::vector<SeqView>{view}, deadline_, item,
          [this, item, start, held](Result&& r) { Scored(*item, start, std::move(r)); }, caller_);
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
    Respond(resp, s.error_code(), start);
  }

  // The item just read does not parse: no more reads, and the call's status is `why`.
  void EndMalformed(const grpc::Status& why, Clock::time_point start) {
    svc_->metrics()->RequestAnswered(why.error_code(), MsSince(start) / 1e3);
    std::vector<std::shared_ptr<Job>> jobs;
    {
      std::lock_guard<std::mutex> lk(mu_);
      reads_done_ = true;
      end_status_ = why;
      for (auto& [_, job] : outstanding_) jobs.push_back(job);
    }
    // Inside a reaction: `this` stays valid even if a Cancel's answer finishes the call.
    for (auto& job : jobs) svc_->batcher()->Cancel(job);
    MaybeFinish();  // last touch of `this`
  }

  // Runs on the batcher thread, or inside a reaction when Batcher::Cancel answers the item.
  void Scored(const v1::ScoreStreamRequest& item, Clock::time_point start, Result&& r) {
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
    Respond(resp, r.status.error_code(), start, &item);
  }

  // Queues an answer (writing it at once when no write is in flight); when
  // `done_item` is set, that item stops being outstanding in the same step,
  // so the call cannot finish between the two.
  void Respond(const v1::ScoreStreamResponse& resp, grpc::StatusCode code, Clock::time_point start,
               const v1::ScoreStreamRequest* done_item = nullptr) {
    svc_->metrics()->RequestAnswered(code, MsSince(start) / 1e3);
    grpc::ByteBuffer bytes;
    const grpc::Status serialized = SerializeAnswer(resp, &bytes);  // outside the lock: it copies the answer
    const grpc::ByteBuffer* next = nullptr;
    grpc::Status status;
    bool finish = false, resume = false;
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (done_item) outstanding_.erase(done_item);
      if (!serialized.ok() && end_status_.ok()) end_status_ = serialized;  // an answer it cannot send ends the call
      if (!broken_ && !cancelled_ && end_status_.ok()) {
        writes_.emplace_back();
        writes_.back().Swap(&bytes);
        if (!writing_) {
          writing_ = true;
          next = &writes_.front();
        }
      }
      // Decided under the same lock as the erase: this may run on the batcher thread, and once
      // the lock is let go a reaction may finish the call and gRPC may delete `this`.
      if (!next) finish = FinishableLocked(&status);
      resume = ResumeReadLocked();  // an answer that left without a write frees room too
    }
    if (resume) StartRead(&incoming_);  // the pending read keeps the call (reads_done_ is false)
    if (next) {
      StartWrite(next);  // writing_ is set: the call cannot finish before OnWriteDone
    } else if (finish) {
      Finish(status);  // last touch of `this`
    }
  }

  // Precondition: mu_ held. Items read whose answers are not written yet: scoring, or queued to write.
  size_t UnsentLocked() const { return outstanding_.size() + writes_.size(); }

  // Precondition: mu_ held. True (and unpaused) when a paused stream has room to read again; the
  // caller then starts the read, after letting go of mu_.
  bool ResumeReadLocked() {
    if (!read_paused_ || reads_done_ || cancelled_ || UnsentLocked() >= window_) return false;
    read_paused_ = false;
    return true;
  }

  // For reactions only (gRPC runs them before OnDone, so `this` is alive on entry).
  void MaybeFinish() {
    grpc::Status status;
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (!FinishableLocked(&status)) return;
    }
    Finish(status);  // last touch of `this`
  }

  // Precondition: mu_ held. True (once) when every item is answered and written and the reads are
  // done; `*status` is then the call's status.
  bool FinishableLocked(grpc::Status* status) {
    if (finished_ || !reads_done_ || !outstanding_.empty() || writing_ || alarm_answering_) return false;
    finished_ = true;
    if (!end_status_.ok()) {
      *status = end_status_;
    } else if (cancelled_) {
      *status = grpc::Status(grpc::StatusCode::CANCELLED, "cancelled");
    }
    return true;
  }

  RewardModelService* const svc_;
  // The call's deadline less the answer margin (AnswerBy): admission, the items' jobs and the alarm use it.
  const std::optional<Clock::time_point> deadline_;
  std::shared_ptr<AlarmGuard> guard_;  // set with a deadline
  grpc::Alarm alarm_;
  // A stream is its connection's caller, as its calls are: its items take that caller's turns (batcher.h).
  const std::string caller_;
  const size_t window_;  // the most items read and not yet answered on the wire
  grpc::ByteBuffer incoming_;

  std::mutex mu_;
  std::deque<grpc::ByteBuffer> writes_;  // front is in flight while writing_
  // Accepted items not yet answered, by their request message.
  std::unordered_map<const v1::ScoreStreamRequest*, std::shared_ptr<Job>> outstanding_;
  grpc::Status end_status_;  // not OK once an item did not parse (or an answer did not serialize)
  bool writing_ = false, reads_done_ = false, cancelled_ = false, broken_ = false, finished_ = false;
  bool read_paused_ = false;  // no read pending: the window is full
  bool alarm_answering_ = false;  // AnswerByPassed is answering items: the call must not finish yet
};

}  // namespace

grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* NewScoreStreamCall(RewardModelService* svc,
                                                                                 grpc::CallbackServerContext* ctx) {
  return new StreamCall(svc, ctx);
}

}  // namespace rmscore
