"""Generates the Python gRPC stubs from the one proto; not part of the package.

The client's stubs are rmscore_client.v1, the server's rmscore.v1 (each distribution owns what it
sends or serves). Called by the client's build (setup.py: every wheel and sdist carries the stubs),
the server's (the checkout's setup.py) and the checkout's set-up (scripts/gen_proto.sh, for the
editable installs). protoc names the stubs' own import after the proto path (`from rmscore.v1
import reward_pb2`); it is rewritten to the package the stubs live in. The proto package, so every
service and message name on the wire, stays `rmscore.v1`, and both sets register the same file,
`rmscore/v1/reward.proto`, byte for byte: in one process (a server importing the client's chat
renderer, a test) protobuf's pool takes an identical file twice and both give the same classes.

    python client/gen_stubs.py [PROTO_ROOT] [OUT_DIR] [PACKAGE]
"""

from __future__ import annotations

import pathlib
import shutil
import sys
import tempfile

PROTO = pathlib.Path("rmscore/v1/reward.proto")
HERE = pathlib.Path(__file__).resolve().parent


def generate(proto_root: pathlib.Path, out_dir: pathlib.Path, package: str = "rmscore_client.v1") -> None:
    from grpc_tools import protoc  # a build requirement of the client (grpcio-tools)

    if not (proto_root / PROTO).is_file():
        raise FileNotFoundError(f"no {PROTO} under {proto_root}")
    with tempfile.TemporaryDirectory() as tmp:
        # grpc_tools' own include dir (google/protobuf/*.proto) comes after ours.
        include = pathlib.Path(protoc.__file__).parent / "_proto"
        args = ["protoc", f"-I{proto_root}", f"-I{include}", f"--python_out={tmp}", f"--pyi_out={tmp}",
                f"--grpc_python_out={tmp}", str(proto_root / PROTO)]
        if protoc.main(args) != 0:
            raise RuntimeError(f"protoc failed on {proto_root / PROTO}")
        gen = pathlib.Path(tmp) / PROTO.parent
        grpc_file = gen / "reward_pb2_grpc.py"
        grpc_file.write_text(grpc_file.read_text().replace("from rmscore.v1 import ", f"from {package} import "))
        out_dir.mkdir(parents=True, exist_ok=True)
        for f in gen.glob("reward_pb2*"):
            shutil.copy(f, out_dir / f.name)
    (out_dir / "__init__.py").write_text('"""Generated from proto/rmscore/v1/reward.proto by client/gen_stubs.py."""\n')


def proto_root() -> pathlib.Path:
    """The checkout's proto/ beside client/, or the copy an sdist carries inside it."""
    for root in (HERE.parent / "proto", HERE / "proto"):
        if (root / PROTO).is_file():
            return root
    raise FileNotFoundError(f"{PROTO} is neither in {HERE.parent / 'proto'} nor in {HERE / 'proto'}")


if __name__ == "__main__":
    root = pathlib.Path(sys.argv[1]) if len(sys.argv) > 1 else proto_root()
    out = pathlib.Path(sys.argv[2]) if len(sys.argv) > 2 else HERE / "rmscore_client" / "v1"
    generate(root, out, sys.argv[3] if len(sys.argv) > 3 else "rmscore_client.v1")
