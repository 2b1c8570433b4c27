"""The client's requirements as a training environment meets them (issue 28, Installability).

1. Resolution: `rmscore-client` (the wheel built from this checkout's client/) resolves together
   with the whole requirement set of TRL, OpenRLHF and verl, exactly as the registry publishes it,
   without changing any of their pins: pip's own resolver, `pip install --dry-run --report`, from
   PyPI's metadata. Nothing is installed. Where the index serves each wheel's metadata file
   (PEP 658, as pypi.org does) pip reads only that, so torch and the CUDA wheels cost a few
   kilobytes each; an index without it (a mirror) makes pip fetch whole wheels, about 3 GB per
   framework, which is why this part keeps no cache (--no-cache-dir): nothing that size lands in
   .cache/.
   - OpenRLHF 0.11.2 pins `flash-attn==2.8.3`, which PyPI has only as an sdist whose setup.py
     imports torch without declaring it as a build requirement. Its metadata is prepared without
     build isolation, with this venv's CPU torch and FLASH_ATTENTION_SKIP_CUDA_BUILD=TRUE (nothing
     is compiled); every other requirement of OpenRLHF is resolved as published.
   - The machine's pip configuration (a constraint file, local find-links) is left out, so that
     only the framework's and the client's requirements steer the resolver; PIP_INDEX_URL, if set,
     still chooses the index.
2. The stubs' range: the gencode in rmscore_client.v1 checks its runtime at import (protobuf's
   ValidateProtobufRuntimeVersion: runtime >= the protoc that generated it, same major; grpc's
   GRPC_GENERATED_VERSION: grpcio >= the grpcio-tools that generated it). The range in
   client/pyproject.toml is exactly that, and both ends are installed into fresh virtual
   environments (no torch) where the stubs are imported and a Score call makes a round trip
   through an in-process grpc.aio server, and the HTTP client one through an aiohttp.web server (aiohttp
   at its floor, then its newest). Just below the floor the import must fail, so the floor
   is not lower than what the stubs accept.

Needs PyPI, as test_client_install.py does. The small installs (the client's build requirements,
grpcio, protobuf, aiohttp) are cached in .cache/pip-requirements (git ignores .cache/). The whole
module takes about a minute (three resolutions of 11 to 21 s, three fresh environments of 2 to 4 s).
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import zipfile

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = pathlib.Path(__file__).resolve().parents[2]
CACHE = ROOT / ".cache" / "pip-requirements"

# The newest release of each framework's line named in issue 28 (checked on PyPI 2026-12-05).
FRAMEWORKS = ["trl==1.16.0", "openrlhf==0.11.2", "verl==0.9.1"]


def pip_env(**extra) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("PIP_CONSTRAINT", "PIP_FIND_LINKS", "PIP_EXTRA_INDEX_URL", "PIP_REQUIREMENT")}
    env.update(PIP_CONFIG_FILE=os.devnull, PIP_CACHE_DIR=str(CACHE), PIP_DISABLE_PIP_VERSION_CHECK="1", **extra)
    return env


def pip(*args, python=sys.executable, env=None, check=True, timeout=600) -> subprocess.CompletedProcess:
    p = subprocess.run([str(python), "-m", "pip", *args], capture_output=True, text=True, timeout=timeout,
                       env=env or pip_env())
    if check:
        assert p.returncode == 0, f"pip {' '.join(map(str, args))} failed:\n{p.stdout[-3000:]}\n{p.stderr[-4000:]}"
    return p


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> pathlib.Path:
    """The client's wheel, built once from a clean copy of client/ and proto/ (the stubs are generated
    by the build, with the grpcio-tools its build-system pins)."""
    src = tmp_path_factory.mktemp("checkout")
    files = subprocess.run(["git", "ls-files", "client", "proto"], cwd=ROOT, capture_output=True, text=True,
                           check=True).stdout.split()
    for name in files:
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / name, src / name)
    out = tmp_path_factory.mktemp("dist")
    pip("wheel", "--no-deps", "-q", "-w", str(out), str(src / "client"))
    (whl,) = out.glob("rmscore_client-*.whl")
    return whl


def wheel_requires(whl: pathlib.Path) -> dict[str, Requirement]:
    with zipfile.ZipFile(whl) as z:
        meta = next(z.read(n).decode() for n in z.namelist() if n.endswith(".dist-info/METADATA"))
    reqs = [Requirement(line.split(":", 1)[1].strip()) for line in meta.splitlines() if line.startswith("Requires-Dist:")]
    return {canonicalize_name(r.name): r for r in reqs if r.marker is None}


def generated_versions(whl: pathlib.Path) -> tuple[Version, Version]:
    """(protobuf gencode version, grpcio-tools version) the wheel's stubs were generated with."""
    with zipfile.ZipFile(whl) as z:
        pb2 = z.read("rmscore_client/v1/reward_pb2.py").decode()
        grpc_py = z.read("rmscore_client/v1/reward_pb2_grpc.py").decode()
    m = re.search(r"ValidateProtobufRuntimeVersion\(\s*_runtime_version\.Domain\.PUBLIC,\s*(\d+),\s*(\d+),\s*(\d+),", pb2)
    assert m, "the protobuf gencode no longer checks its runtime version: read it again"
    g = re.search(r"GRPC_GENERATED_VERSION = '([^']+)'", grpc_py)
    assert g, "the grpc gencode no longer names GRPC_GENERATED_VERSION: read it again"
    return Version(".".join(m.groups())), Version(g.group(1))


# ---------------------------------------------------------------------------------------------
# 1. Resolution next to each framework's requirement set


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_client_resolves_next_to_framework(wheel, framework, tmp_path):
    extra_env, args = {}, []
    if framework.startswith("openrlhf"):
        import importlib.util
        assert importlib.util.find_spec("torch"), "flash-attn's metadata needs torch in this venv (see docstring)"
        extra_env["FLASH_ATTENTION_SKIP_CUDA_BUILD"] = "TRUE"
        args.append("--no-build-isolation")
    report = tmp_path / "report.json"
    pip("install", "--dry-run", "--ignore-installed", "--no-cache-dir", "-q", "--report", str(report), *args,
        str(wheel), framework, env=pip_env(**extra_env))
    installed = {canonicalize_name(i["metadata"]["name"]): i for i in json.loads(report.read_text())["install"]}
    version = {name: Version(i["metadata"]["version"]) for name, i in installed.items()}

    name, pinned = framework.split("==")
    assert version[canonicalize_name(name)] == Version(pinned)
    assert "rmscore-client" in version
    # Every requirement the framework itself declares (no extras) holds in the set it resolved to:
    # its pins are what it asked for, not moved to suit the client.
    own = installed[canonicalize_name(name)]["metadata"].get("requires_dist", [])
    for line in own:
        req = Requirement(line)
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        got = version.get(canonicalize_name(req.name))
        assert got is not None, f"{framework} requires {req} and it is not in the resolution"
        assert req.specifier.contains(got, prereleases=True), f"{framework} requires {req}, resolved {got}"
    # And the client's own ranges hold too.
    for dep, req in wheel_requires(wheel).items():
        assert req.specifier.contains(version[dep], prereleases=True), (dep, req, version[dep])
    print(f"{framework} ({len(version)} packages): " + ", ".join(
        f"{d} {version[d]}" for d in ("grpcio", "grpcio-health-checking", "protobuf", "aiohttp") if d in version))


# ---------------------------------------------------------------------------------------------
# 2. The range the generated stubs accept, at both ends

ROUND_TRIP = r"""
import asyncio, sys
import grpc, google.protobuf
from rmscore_client.v1 import reward_pb2, reward_pb2_grpc
import rmscore_client  # the package itself imports with this runtime too

class Model(reward_pb2_grpc.RewardModelServicer):
    async def Score(self, request, context):
        return reward_pb2.ScoreResponse(scores=[0.25] * len(request.sequences), model_version="fixed")

async def main():
    server = grpc.aio.server()
    reward_pb2_grpc.add_RewardModelServicer_to_server(Model(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = reward_pb2_grpc.RewardModelStub(channel)
            seq = reward_pb2.Sequence(tokens=reward_pb2.TokenIds(ids=[1, 2, 3]))
            reply = await stub.Score(reward_pb2.ScoreRequest(sequences=[seq, seq]), timeout=30)
    finally:
        await server.stop(None)
    assert list(reply.scores) == [0.25, 0.25] and reply.model_version == "fixed", reply
    await http_round_trip()
    print(grpc.__version__, google.protobuf.__version__)

async def http_round_trip():
    # The HTTP client over this aiohttp: an answer, then a refusal mapped to the contract's error.
    import socket
    from aiohttp import web
    from rmscore_client import AsyncHttpRewardClient, InvalidInput

    async def score(request):
        seqs = (await request.json())["sequences"]
        if not seqs[0]["tokens"]:
            return web.json_response({"error": {"code": "INVALID_ARGUMENT", "message": "empty"}}, status=422)
        return web.json_response({"scores": [0.5] * len(seqs), "model_version": "fixed", "timings": {}})

    app = web.Application()
    app.router.add_post("/rmscore/v1/score", score)
    runner = web.AppRunner(app)
    await runner.setup()
    sock = socket.create_server(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    await web.SockSite(runner, sock).start()
    try:
        async with AsyncHttpRewardClient(f"http://127.0.0.1:{port}", chunk_size=1, timeout_s=30) as client:
            assert (await client.score_ids([[1, 2], [3]])).scores == [0.5, 0.5]
            try:
                await client.score_ids([[]])
            except InvalidInput as e:
                assert "empty" in str(e), e
            else:
                raise AssertionError("a 422 was not raised as InvalidInput")
    finally:
        await runner.cleanup()

asyncio.run(main())
"""


def fresh_venv(path: pathlib.Path) -> pathlib.Path:
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True, timeout=120)
    return path / "bin" / "python"


def install_into(python: pathlib.Path, *args) -> None:
    # pip runs from this venv and installs into the fresh one (--python): no pip bootstrap per venv.
    pip("--python", str(python), "install", "-q", *args)


def stub_ends(whl: pathlib.Path) -> dict[str, dict[str, str]]:
    """The lowest and the highest release each of grpcio, grpcio-health-checking, protobuf and aiohttp
    may be at under the wheel's declared ranges (the highest: what pip picks from the registry today)."""
    reqs = wheel_requires(whl)
    low = {}
    for dep in ("grpcio", "grpcio-health-checking", "protobuf", "aiohttp"):
        floor = [s.version for s in reqs[dep].specifier if s.operator == ">="]
        assert len(floor) == 1, f"{dep} needs one lower bound, has {reqs[dep]}"
        low[dep] = floor[0]
    return {"lowest": low, "highest": {}}


def test_stated_range_is_what_the_stubs_accept(wheel):
    """The floor of protobuf and grpcio is the version that generated the stubs (a lower one fails
    their import check), and the ceiling is the next major release."""
    gen_protobuf, gen_grpc = generated_versions(wheel)
    reqs = wheel_requires(wheel)
    assert reqs["protobuf"].specifier == SpecifierSet(f">={gen_protobuf},<{gen_protobuf.major + 1}"), reqs["protobuf"]
    assert reqs["grpcio"].specifier == SpecifierSet(f">={gen_grpc},<{gen_grpc.major + 1}"), reqs["grpcio"]
    assert reqs["grpcio-health-checking"].specifier == SpecifierSet(f">={gen_grpc},<{gen_grpc.major + 1}")


@pytest.mark.parametrize("end", ["lowest", "highest"])
def test_stubs_round_trip_at_each_end_of_the_range(wheel, end, tmp_path):
    python = fresh_venv(tmp_path / "env")
    pins = [f"{dep}=={v}" for dep, v in stub_ends(wheel)[end].items()]
    install_into(python, str(wheel), *pins)
    frozen = pip("--python", str(python), "list", "--format=json").stdout
    have = {canonicalize_name(p["name"]): p["version"] for p in json.loads(frozen)}
    assert "torch" not in have
    reqs = wheel_requires(wheel)
    if end == "lowest":
        for pin in pins:
            dep, v = pin.split("==")
            assert Version(have[dep]) == Version(v), (pin, have[dep])
    else:
        # Nothing pinned: pip took the newest release the ranges allow; it must be the newest the
        # index has below the ceiling (so this end moves as the registry does).
        for dep in ("grpcio", "protobuf"):
            newest = pip("index", "versions", dep).stdout
            versions = [Version(v) for v in re.search(r"Available versions: (.*)", newest).group(1).split(", ")]
            allowed = [v for v in versions if reqs[dep].specifier.contains(v)]
            assert Version(have[dep]) == max(allowed), (dep, have[dep], max(allowed))
    p = subprocess.run([str(python), "-c", ROUND_TRIP], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.split() == [have["grpcio"], have["protobuf"]]
    print(f"{end}: grpcio {have['grpcio']}, protobuf {have['protobuf']}, "
          f"grpcio-health-checking {have['grpcio-health-checking']}, aiohttp {have['aiohttp']}")


def test_stubs_refuse_a_runtime_below_the_floor(wheel, tmp_path):
    """One release below each floor: the stubs' own import checks refuse it, so the floor stated is
    not lower than the stubs accept (pip would refuse the combination; --no-deps forces it here)."""
    gen_protobuf, gen_grpc = generated_versions(wheel)

    def below(dep: str, floor: Version) -> str:
        out = pip("index", "versions", dep).stdout
        versions = [Version(v) for v in re.search(r"Available versions: (.*)", out).group(1).split(", ")]
        return str(max(v for v in versions if v < floor and not v.is_prerelease))

    python = fresh_venv(tmp_path / "env")
    old_pb, old_grpc = below("protobuf", gen_protobuf), below("grpcio", gen_grpc)
    install_into(python, f"protobuf=={old_pb}", f"grpcio=={old_grpc}", "aiohttp")
    install_into(python, "--no-deps", str(wheel))
    probe = "import sys, importlib\ntry:\n    importlib.import_module(sys.argv[1])\nexcept Exception as e:\n" \
            "    print(type(e).__name__, e)\nelse:\n    print('imported')\n"
    pb = subprocess.run([str(python), "-c", probe, "rmscore_client.v1.reward_pb2"], capture_output=True, text=True,
                        timeout=60, cwd=tmp_path)
    assert pb.stdout.startswith("VersionError") and f"runtime {old_pb}" in pb.stdout, pb.stdout + pb.stderr
    # reward_pb2_grpc imports reward_pb2 first; with the protobuf check off, grpc's own check is what fails.
    env = dict(os.environ, TEMPORARILY_DISABLE_PROTOBUF_VERSION_CHECK="true")
    g = subprocess.run([str(python), "-c", probe, "rmscore_client.v1.reward_pb2_grpc"], capture_output=True,
                       text=True, timeout=60, cwd=tmp_path, env=env)
    assert g.stdout.startswith("RuntimeError") and f"grpcio>={gen_grpc}" in g.stdout, g.stdout + g.stderr
