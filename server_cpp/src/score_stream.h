// The ScoreStream reactor (score_stream.cc): one per call, raw bytes in and out.
#pragma once

#include <grpcpp/server_context.h>
#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/server_callback.h>

namespace rmscore {

class RewardModelService;

// A new reactor for one ScoreStream call; it deletes itself in OnDone.
grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* NewScoreStreamCall(RewardModelService* svc,
                                                                                 grpc::CallbackServerContext* ctx);

}  // namespace rmscore
