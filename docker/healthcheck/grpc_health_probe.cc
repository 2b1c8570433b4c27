// grpc_health_probe: exits 0 when a gRPC server answers grpc.health.v1 Check
// with SERVING, 1 otherwise (NOT_SERVING, unreachable, timeout). The C++
// server's image has no Python, so its container health check is this small
// program, built in the image's build stage by docker/healthcheck/build.sh
// against the same Debian gRPC the server uses; nothing is downloaded.
//
//   grpc_health_probe [HOST:PORT] [--service NAME] [--timeout SECONDS]
//   (defaults: 127.0.0.1:50051, service "", 2 s)
#include <chrono>
#include <cstdlib>
#include <iostream>
#include <string>

#include <grpcpp/grpcpp.h>

#include "health.grpc.pb.h"

int main(int argc, char** argv) {
  std::string target = "127.0.0.1:50051";
  std::string service;
  double timeout_s = 2.0;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if ((arg == "--service" || arg == "--timeout") && i + 1 < argc) {
      const std::string value = argv[++i];
      if (arg == "--service") {
        service = value;
      } else {
        timeout_s = std::atof(value.c_str());
      }
    } else if (arg == "-h" || arg == "--help") {
      std::cout << "usage: grpc_health_probe [HOST:PORT] [--service NAME] [--timeout SECONDS]\n";
      return 0;
    } else if (!arg.empty() && arg[0] != '-') {
      target = arg;
    } else {
      std::cerr << "grpc_health_probe: unknown argument '" << arg << "'\n";
      return 2;
    }
  }
  auto channel = grpc::CreateChannel(target, grpc::InsecureChannelCredentials());
  auto stub = grpc::health::v1::Health::NewStub(channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() +
                   std::chrono::milliseconds(static_cast<long>(timeout_s * 1000)));
  grpc::health::v1::HealthCheckRequest request;
  request.set_service(service);
  grpc::health::v1::HealthCheckResponse response;
  const grpc::Status status = stub->Check(&ctx, request, &response);
  if (!status.ok()) {
    std::cerr << target << ": health check failed: " << status.error_code() << " " << status.error_message() << "\n";
    return 1;
  }
  const auto name = grpc::health::v1::HealthCheckResponse::ServingStatus_Name(response.status());
  std::cout << target << ": " << name << "\n";
  return response.status() == grpc::health::v1::HealthCheckResponse::SERVING ? 0 : 1;
}
