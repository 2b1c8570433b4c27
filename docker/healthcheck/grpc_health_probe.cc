// grpc_health_probe: exits 0 when a gRPC server answers grpc.health.v1 Check
// with SERVING for every service asked, 1 otherwise (NOT_SERVING, unreachable,
// timeout). The C++ server's image has no Python, so its container health check
// is this small program, built in the image's build stage by
// docker/healthcheck/build.sh against the same Debian gRPC the server uses;
// nothing is downloaded.
//
//   grpc_health_probe [HOST:PORT [SERVICE]...] [--service NAME]... [--timeout SECONDS]
//   (defaults: 127.0.0.1:50051, service "", 2 s)
//
// The rmscore servers answer "" for readiness and "liveness" for a batcher that
// makes progress (docs/contract.md). A container health check that must see
// both names them both: `--service "" --service liveness`, or after the target,
// `127.0.0.1:50051 "" liveness`. `-service NAME` and `-service=NAME` (the upstream
// grpc-health-probe's spelling) work too.
#include <chrono>
#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "health.grpc.pb.h"

namespace {

// "--service" for "-service", "--service=x" split into "--service" and "x".
std::string Flag(const std::string& arg, std::string* inline_value, bool* has_inline) {
  std::string flag = arg.rfind("--", 0) == 0 ? arg : "-" + arg;
  const size_t eq = flag.find('=');
  *has_inline = eq != std::string::npos;
  if (*has_inline) {
    *inline_value = flag.substr(eq + 1);
    flag = flag.substr(0, eq);
  }
  return flag;
}

// One Check; true when it answers SERVING. Says what it got either way.
bool Serving(grpc::health::v1::Health::Stub& stub, const std::string& target, const std::string& service,
             double timeout_s) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() +
                   std::chrono::milliseconds(static_cast<long>(timeout_s * 1000)));
  grpc::health::v1::HealthCheckRequest request;
  request.set_service(service);
  grpc::health::v1::HealthCheckResponse response;
  const grpc::Status status = stub.Check(&ctx, request, &response);
  const std::string who = target + (service.empty() ? "" : " service \"" + service + "\"");
  if (!status.ok()) {
    std::cerr << who << ": health check failed: " << status.error_code() << " " << status.error_message() << "\n";
    return false;
  }
  std::cout << who << ": " << grpc::health::v1::HealthCheckResponse::ServingStatus_Name(response.status()) << "\n";
  return response.status() == grpc::health::v1::HealthCheckResponse::SERVING;
}

}  // namespace

int main(int argc, char** argv) {
  std::string target = "127.0.0.1:50051";
  bool have_target = false;
  std::vector<std::string> services;
  double timeout_s = 2.0;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    std::string value;
    bool has_inline = false;
    const std::string flag = arg.size() > 1 && arg[0] == '-' ? Flag(arg, &value, &has_inline) : arg;
    if ((flag == "--service" || flag == "--timeout") && (has_inline || i + 1 < argc)) {
      if (!has_inline) value = argv[++i];
      if (flag == "--service") {
        services.push_back(value);
      } else {
        timeout_s = std::atof(value.c_str());
      }
    } else if (arg == "-h" || arg == "--help") {
      std::cout << "usage: grpc_health_probe [HOST:PORT [SERVICE]...] [--service NAME]... [--timeout SECONDS]\n"
                   "  exit 0 when every service named (default: \"\") answers SERVING\n";
      return 0;
    } else if (arg.empty() || arg[0] != '-') {
      // The first word is the target, any after it are services ("" included).
      if (!have_target && !arg.empty()) {
        target = arg;
        have_target = true;
      } else {
        services.push_back(arg);
      }
    } else {
      std::cerr << "grpc_health_probe: unknown argument '" << arg << "'\n";
      return 2;
    }
  }
  if (services.empty()) services.push_back("");
  auto channel = grpc::CreateChannel(target, grpc::InsecureChannelCredentials());
  auto stub = grpc::health::v1::Health::NewStub(channel);
  for (const std::string& service : services) {
    if (!Serving(*stub, target, service, timeout_s)) return 1;
  }
  return 0;
}
