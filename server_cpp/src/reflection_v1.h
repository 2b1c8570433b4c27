// grpc.reflection.v1, next to the v1alpha that gRPC 1.51's reflection plugin serves: the same
// requests and answers (the two protos differ only in their package), looked up in protobuf's
// generated descriptor pool as the plugin does, so both versions describe the same services.
#pragma once

#include <string>
#include <vector>

#include "grpc/reflection/v1/reflection.grpc.pb.h"

namespace rmscore {

class ReflectionV1 final : public grpc::reflection::v1::ServerReflection::CallbackService {
 public:
  // `services`: the full names list_services answers (the server's services, health and
  // reflection included).
  explicit ReflectionV1(std::vector<std::string> services);

  grpc::ServerBidiReactor<grpc::reflection::v1::ServerReflectionRequest,
                          grpc::reflection::v1::ServerReflectionResponse>*
  ServerReflectionInfo(grpc::CallbackServerContext* ctx) override;

  // One request's answer (exposed for the tests).
  grpc::reflection::v1::ServerReflectionResponse Answer(const grpc::reflection::v1::ServerReflectionRequest& req) const;

 private:
  const std::vector<std::string> services_;
};

}  // namespace rmscore
