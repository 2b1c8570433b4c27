#include "reflection_v1.h"

#include <google/protobuf/descriptor.h>
#include <google/protobuf/descriptor.pb.h>

#include <unordered_set>

#include "grpc/health/v1/health.pb.h"

namespace rmscore {
namespace {

namespace pb = google::protobuf;
using grpc::reflection::v1::ServerReflectionRequest;
using grpc::reflection::v1::ServerReflectionResponse;

// The file and every file it imports, each once, as serialized FileDescriptorProtos.
void AddFileAndDeps(const pb::FileDescriptor* file, std::unordered_set<std::string>* seen,
                    grpc::reflection::v1::FileDescriptorResponse* out) {
  if (!seen->insert(file->name()).second) return;
  pb::FileDescriptorProto proto;
  file->CopyTo(&proto);
  proto.SerializeToString(out->add_file_descriptor_proto());
  for (int i = 0; i < file->dependency_count(); ++i) AddFileAndDeps(file->dependency(i), seen, out);
}

void SetError(grpc::StatusCode code, const std::string& message, ServerReflectionResponse* resp) {
  resp->mutable_error_response()->set_error_code(int(code));
  resp->mutable_error_response()->set_error_message(message);
}

// The file that answers a file_by_filename / file_containing_symbol / file_containing_extension
// request, or nullptr with the error set (the messages are gRPC's v1alpha ones).
const pb::FileDescriptor* FileFor(const ServerReflectionRequest& req, ServerReflectionResponse* resp) {
  const pb::DescriptorPool* pool = pb::DescriptorPool::generated_pool();
  switch (req.message_request_case()) {
    case ServerReflectionRequest::kFileByFilename:
      if (const auto* f = pool->FindFileByName(req.file_by_filename())) return f;
      SetError(grpc::StatusCode::NOT_FOUND, "File not found.", resp);
      return nullptr;
    case ServerReflectionRequest::kFileContainingSymbol:
      if (const auto* f = pool->FindFileContainingSymbol(req.file_containing_symbol())) return f;
      SetError(grpc::StatusCode::NOT_FOUND, "Symbol not found.", resp);
      return nullptr;
    default: {
      const auto& ext = req.file_containing_extension();
      const pb::Descriptor* type = pool->FindMessageTypeByName(ext.containing_type());
      if (type == nullptr) {
        SetError(grpc::StatusCode::NOT_FOUND, "Type not found.", resp);
        return nullptr;
      }
      if (const auto* field = pool->FindExtensionByNumber(type, ext.extension_number())) return field->file();
      SetError(grpc::StatusCode::NOT_FOUND, "Extension not found.", resp);
      return nullptr;
    }
  }
}

void AllExtensionNumbers(const std::string& type_name, ServerReflectionResponse* resp) {
  const pb::DescriptorPool* pool = pb::DescriptorPool::generated_pool();
  const pb::Descriptor* type = pool->FindMessageTypeByName(type_name);
  if (type == nullptr) {
    SetError(grpc::StatusCode::NOT_FOUND, "Type not found.", resp);
    return;
  }
  std::vector<const pb::FieldDescriptor*> extensions;
  pool->FindAllExtensions(type, &extensions);
  auto* out = resp->mutable_all_extension_numbers_response();
  out->set_base_type_name(type->full_name());
  for (const auto* e : extensions) out->add_extension_number(e->number());
}

// One reflection stream: one request read, answered, then the next; a single operation at a time,
// so the reactor needs no lock.
class ReflectionStream final
    : public grpc::ServerBidiReactor<ServerReflectionRequest, ServerReflectionResponse> {
 public:
  explicit ReflectionStream(const ReflectionV1* service) : service_(service) { StartRead(&req_); }

  void OnReadDone(bool ok) override {
    if (!ok) {  // the client half-closed (or is gone)
      Finish(grpc::Status::OK);
      return;
    }
    resp_ = service_->Answer(req_);
    StartWrite(&resp_);
  }
  void OnWriteDone(bool ok) override {
    if (ok) {
      StartRead(&req_);
    } else {
      Finish(grpc::Status(grpc::StatusCode::CANCELLED, "the client is gone"));
    }
  }
  void OnDone() override { delete this; }

 private:
  const ReflectionV1* const service_;
  ServerReflectionRequest req_;
  ServerReflectionResponse resp_;
};

}  // namespace

ReflectionV1::ReflectionV1(std::vector<std::string> services) : services_(std::move(services)) {
  // Names a symbol of health.pb.cc, so the linker keeps it (and its descriptor) in the binary.
  (void)grpc::health::v1::HealthCheckRequest::descriptor();
}

grpc::ServerBidiReactor<ServerReflectionRequest, ServerReflectionResponse>* ReflectionV1::ServerReflectionInfo(
    grpc::CallbackServerContext*) {
  return new ReflectionStream(this);
}

ServerReflectionResponse ReflectionV1::Answer(const ServerReflectionRequest& req) const {
  ServerReflectionResponse resp;
  resp.set_valid_host(req.host());
  *resp.mutable_original_request() = req;
  switch (req.message_request_case()) {
    case ServerReflectionRequest::kListServices:
      for (const auto& name : services_) resp.mutable_list_services_response()->add_service()->set_name(name);
      break;
    case ServerReflectionRequest::kFileByFilename:
    case ServerReflectionRequest::kFileContainingSymbol:
    case ServerReflectionRequest::kFileContainingExtension:
      if (const pb::FileDescriptor* file = FileFor(req, &resp)) {
        std::unordered_set<std::string> seen;
        AddFileAndDeps(file, &seen, resp.mutable_file_descriptor_response());
      }
      break;
    case ServerReflectionRequest::kAllExtensionNumbersOfType:
      AllExtensionNumbers(req.all_extension_numbers_of_type(), &resp);
      break;
    default:
      SetError(grpc::StatusCode::UNIMPLEMENTED, "The request is not implemented.", &resp);
  }
  return resp;
}

}  // namespace rmscore
