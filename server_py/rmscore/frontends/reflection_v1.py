"""gRPC server reflection under `grpc.reflection.v1` as well as `v1alpha`
(docs/hardening.md, "Transport attacks (Python)").

grpcio-reflection (1.85) ships only v1alpha, and current tools (grpcurl >= 1.9, Postman, grpcui) ask
v1 first. The two protocols differ only in their package name: the messages are the same fields
with the same numbers, so the bytes on the wire are the same. So v1 is served by v1alpha's own
servicer under the v1 method name, and v1's file descriptor (v1alpha's, renamed) is added to the
default pool so that reflection can describe v1 itself too.
"""

from __future__ import annotations

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool
from grpc_reflection.v1alpha import reflection, reflection_pb2

V1ALPHA, V1 = "grpc.reflection.v1alpha", "grpc.reflection.v1"
SERVICE_NAME = f"{V1}.ServerReflection"
V1_FILE = "grpc/reflection/v1/reflection.proto"


def _renamed(name: str) -> str:
    return name.replace(f".{V1ALPHA}.", f".{V1}.") if name.startswith(f".{V1ALPHA}.") else name


def add_v1_descriptor(pool: descriptor_pool.DescriptorPool | None = None) -> None:
    """Put grpc/reflection/v1/reflection.proto into `pool` (default: the default pool), once."""
    pool = pool or descriptor_pool.Default()
    try:
        pool.FindFileByName(V1_FILE)
        return
    except KeyError:
        pass
    fdp = descriptor_pb2.FileDescriptorProto()
    reflection_pb2.DESCRIPTOR.CopyToProto(fdp)
    fdp.name, fdp.package = V1_FILE, V1
    fdp.ClearField("options")  # java/go package names of v1alpha: not ours to claim for v1
    for message in fdp.message_type:  # the reflection messages have no nested types
        for f in message.field:
            if f.HasField("type_name"):  # setting it, even to "", would mark a scalar field as a message
                f.type_name = _renamed(f.type_name)
    for service in fdp.service:
        for method in service.method:
            method.input_type, method.output_type = _renamed(method.input_type), _renamed(method.output_type)
    pool.Add(fdp)


def enable(service_names, server: grpc.aio.Server) -> None:
    """Reflection v1alpha and v1 on `server`, both listing `service_names` and themselves."""
    add_v1_descriptor()
    names = (*service_names, reflection.SERVICE_NAME, SERVICE_NAME)
    servicer = reflection.aio.ReflectionServicer(names)
    reflection.enable_server_reflection(names, server)
    handler = grpc.stream_stream_rpc_method_handler(
        servicer.ServerReflectionInfo,
        request_deserializer=reflection_pb2.ServerReflectionRequest.FromString,
        response_serializer=reflection_pb2.ServerReflectionResponse.SerializeToString)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE_NAME,
                                                                          {"ServerReflectionInfo": handler}),))
