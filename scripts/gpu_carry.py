#!/usr/bin/env python3
"""What the GPU check (tools/rmscore_tools/bench/gpu_check.py) needs on a bare, offline GPU machine, in under 64 MiB (docs/gpu.md).

The lent machine has its own Python with torch, numpy and onnxruntime(-gpu), no network, and
receives this working tree plus carried ignored paths, 64 MiB in all. The default model
repository alone is ~200 MB (fp32 weights in hf/, model.onnx and model.int8.onnx), so:

  pack (here, in .venv):  build/gpu-carry/
    weights.fp16.safetensors  the hf weights rounded to fp16 (45 MB, the bulk)
    model.tar.xz              config, tokenizers, manifest, and model.graph.onnx: the fused
                              ONNX graph whose initializers point into model.onnx.data, with
                              recipe.json saying how to rebuild each from the hf weights
                              (same tensor, its transpose, or Q|K|V concatenated)
    site.tar.xz               the Python packages the device lacks (transformers with only
                              its bert and auto models, tokenizers, grpcio, fastapi, ...),
                              extracted from pinned wheels for one CPython version
    stubs/, server_stubs/     the generated rmscore_client.v1 and rmscore.v1 gRPC stubs (ignored in git)
  unpack (on the device): build/gpu-run/{site,model}
    upcasts the weights to fp32, rebuilds model.onnx.data from them, and recomputes the
    golden eager-fp32 CPU scores on those weights, so every runtime is compared on the
    same (fp16-rounded) weights; the int8 graph is not carried.

    .venv/bin/python scripts/gpu_carry.py pack [--python-version 3.12]
    python3 scripts/gpu_carry.py unpack          # scripts/gpu_run.sh does this, then the check
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import pathlib
import shutil
import subprocess
import sys
import tarfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
LIMIT_BYTES = 64 * 2**20
DATA_FILE = "model.onnx.data"
# Import names on the device beyond torch/numpy/onnxruntime, as distribution names in requirements.lock.
PACKAGES = [
    # eager / compile backends
    "transformers", "safetensors", "huggingface_hub", "tokenizers", "regex", "PyYAML", "tqdm",
    "packaging", "filelock", "fsspec", "typing_extensions",
    "httpx2", "httpcore2", "truststore",  # huggingface_hub 2 imports these at load, even offline
    # the Python servers, and rmscore_tools.launch's health checks
    "grpcio", "grpcio-health-checking", "grpcio-reflection", "protobuf", "prometheus_client",
    "httpx", "httpcore", "h11", "anyio", "idna", "certifi",
    # the HTTP server
    "fastapi", "starlette", "pydantic", "pydantic_core", "uvicorn", "click", "annotated-types",
    "typing-inspection", "annotated-doc", "opentelemetry-api",  # fastapi imports it at load
]
# The generated gRPC stubs (ignored in git, so not in the device's copy of the tree): the carry's
# folder for each, and where it goes in the checkout.
STUBS = {"stubs": "client/rmscore_client/v1", "server_stubs": "server_py/rmscore/v1"}
HF_FILES = ["config.json", "special_tokens_map.json", "tokenizer_config.json", "vocab.txt", "tokenizer.json"]


def say(msg: str) -> None:
    print(f"[gpu_carry] {msg}", flush=True)


def locked_versions() -> dict[str, str]:
    out = {}
    for line in (ROOT / "requirements.lock").read_text().splitlines():
        if "==" in line and not line.startswith("#"):
            name, version = line.split("==", 1)
            out[name.lower().replace("_", "-")] = version.strip()
    return out


# --- pack ----------------------------------------------------------------------------------

def download_wheels(dest: pathlib.Path, python_version: str) -> list[pathlib.Path]:
    versions = locked_versions()
    dest.mkdir(parents=True, exist_ok=True)
    specs = [f"{p}=={versions[p.lower().replace('_', '-')]}" for p in PACKAGES]
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary", ":all:", "-d", str(dest),
           "--python-version", python_version, "--platform", "manylinux2014_x86_64",
           "--platform", "manylinux_2_17_x86_64", "--platform", "manylinux_2_28_x86_64", *specs]
    say(f"wheels: pip download --no-deps for CPython {python_version} into {dest}")
    r = subprocess.run(cmd, capture_output=True, text=True)
    # Without the warnings this machine's pip.conf prints for every absent local index.
    sys.stderr.write("".join(ln for ln in (r.stdout + r.stderr).splitlines(True)
                             if not ln.startswith("WARNING: Location ")))
    if r.returncode:
        raise SystemExit(f"gpu_carry: pip download failed ({r.returncode})")
    return sorted(dest.glob("*.whl"))


def keep(name: str) -> bool:
    """transformers is 60 MB unpacked, 51 MB of it model families this repository never loads."""
    parts = name.split("/")
    if "__pycache__" in parts:
        return False
    if parts[:2] == ["transformers", "models"] and len(parts) > 3:
        return parts[2] in ("auto", "bert")
    return True


def pack_site(wheels: list[pathlib.Path], out: pathlib.Path) -> None:
    import zipfile

    with tarfile.open(out, "w:xz", preset=6) as tar:
        for whl in wheels:
            with zipfile.ZipFile(whl) as z:
                for info in z.infolist():
                    if info.is_dir() or not keep(info.filename):
                        continue
                    data = z.read(info)
                    ti = tarfile.TarInfo(info.filename)
                    ti.size, ti.mode = len(data), 0o755 if info.filename.endswith(".so") else 0o644
                    tar.addfile(ti, io.BytesIO(data))


def recipe_for(model_onnx: pathlib.Path, weights: dict) -> tuple[object, list[dict]]:
    """Point every initializer of the fused graph at model.onnx.data and say how to rebuild it."""
    import numpy as np
    import onnx
    from onnx import external_data_helper, numpy_helper

    m = onnx.load(str(model_onnx))
    candidates = []  # (recipe source, array)
    for k, v in weights.items():
        candidates.append(({"keys": [k], "transpose": False, "axis": 0}, v))
        if v.ndim == 2:
            candidates.append(({"keys": [k], "transpose": True, "axis": 0}, v.T))
    for k in weights:
        if k.endswith("attention.self.query.weight") or k.endswith("attention.self.query.bias"):
            keys = [k, k.replace(".query.", ".key."), k.replace(".query.", ".value.")]
            t = k.endswith("weight")
            arr = np.concatenate([weights[x].T if t else weights[x] for x in keys], axis=1 if t else 0)
            candidates.append(({"keys": keys, "transpose": t, "axis": 1 if t else 0}, arr))
    recipe, offset = [], 0
    for t in m.graph.initializer:
        a = numpy_helper.to_array(t)
        src = next((s for s, c in candidates if c.shape == a.shape and c.dtype == a.dtype and np.array_equal(c, a)),
                   None)
        if src is None:
            if a.nbytes > 65536:
                raise SystemExit(f"gpu_carry: initializer {t.name} {a.shape} matches no hf weight; cannot carry it")
            src = {"raw": base64.b64encode(a.tobytes()).decode()}
        offset = (offset + 63) // 64 * 64
        recipe.append({"name": t.name, "dtype": a.dtype.name, "shape": list(a.shape), "offset": offset,
                       "length": a.nbytes, **src})
        external_data_helper.set_external_data(t, DATA_FILE, offset, a.nbytes)
        t.ClearField("raw_data")
        for f in ("float_data", "int64_data", "int32_data", "double_data"):
            t.ClearField(f)
        t.data_location = onnx.TensorProto.EXTERNAL
        offset += a.nbytes
    return m, recipe


def pack(a) -> int:
    import numpy as np
    from safetensors.numpy import load_file, save_file

    t0 = time.monotonic()
    out, model = pathlib.Path(a.out), pathlib.Path(a.model)
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    weights = load_file(str(model / "hf" / "model.safetensors"))
    save_file({k: v.astype(np.float16) if v.dtype == np.float32 else v for k, v in weights.items()},
              str(out / "weights.fp16.safetensors"))
    graph, recipe = recipe_for(model / "model.onnx", weights)
    rebuilt = build_data(recipe, weights)  # the recipe must give back the exact fp32 initializers
    from onnx import numpy_helper
    import onnx

    for t in onnx.load(str(model / "model.onnx")).graph.initializer:
        r = next(x for x in recipe if x["name"] == t.name)
        assert rebuilt[r["offset"]:r["offset"] + r["length"]] == numpy_helper.to_array(t).tobytes(), t.name
    manifest = json.loads((model / "manifest.json").read_text())
    with tarfile.open(out / "model.tar.xz", "w:xz") as tar:
        for name in HF_FILES:
            tar.add(model / "hf" / name, f"hf/{name}")
        tar.add(model / "tokenizer.json", "tokenizer.json")
        for name, data in (("model.graph.onnx", graph.SerializeToString()),
                           ("recipe.json", json.dumps(recipe).encode()),
                           ("manifest.json", json.dumps(manifest, indent=1).encode())):
            ti = tarfile.TarInfo(name)
            ti.size = len(data)
            tar.addfile(ti, io.BytesIO(data))
    wheels = download_wheels(ROOT / ".cache" / f"gpu-wheels-py{a.python_version}", a.python_version)
    say(f"site: {len(wheels)} wheels -> site.tar.xz (transformers trimmed to its bert and auto models)")
    pack_site(wheels, out / "site.tar.xz")
    for name, stubs in STUBS.items():
        shutil.copytree(ROOT / stubs, out / name, ignore=shutil.ignore_patterns("__pycache__"))
    (out / "carry.json").write_text(json.dumps({
        "python": a.python_version, "packages": [w.name for w in wheels], "model": str(model),
        "model_version": manifest["version"], "packed": time.strftime("%Y-%m-%d %H:%M:%S")}, indent=1))
    carry = sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
    tree = working_tree_bytes()
    for f in sorted(out.iterdir()):
        if f.is_file():
            say(f"  {f.name}: {f.stat().st_size / 1e6:.1f} MB")
    say(f"carry {carry / 2**20:.1f} MiB + working tree {tree / 2**20:.1f} MiB = {(carry + tree) / 2**20:.1f} MiB "
        f"of {LIMIT_BYTES // 2**20} MiB, packed in {time.monotonic() - t0:.0f} s")
    if carry + tree > LIMIT_BYTES:
        say("ERROR: over the 64 MiB a device run may carry")
        return 1
    return 0


def working_tree_bytes() -> int:
    """What the device tool copies besides the carry: tracked and untracked, not ignored, files."""
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                           capture_output=True, check=True).stdout.split(b"\0")
    return sum((ROOT / f.decode()).stat().st_size for f in files if f and (ROOT / f.decode()).is_file())


# --- unpack --------------------------------------------------------------------------------

def build_data(recipe: list[dict], weights: dict) -> bytes:
    import numpy as np

    buf = bytearray(max(r["offset"] + r["length"] for r in recipe))
    for r in recipe:
        if "raw" in r:
            data = base64.b64decode(r["raw"])
        else:
            parts = [weights[k].astype(np.float32) for k in r["keys"]]
            parts = [p.T if r["transpose"] else p for p in parts]
            data = np.ascontiguousarray(np.concatenate(parts, axis=r["axis"]), dtype=r["dtype"]).tobytes()
        assert len(data) == r["length"], r["name"]
        buf[r["offset"]:r["offset"] + r["length"]] = data
    return bytes(buf)


def golden_scores(hf_dir: pathlib.Path, seqs: list[list[int]]) -> list[float]:
    """As `rmscore export` scores them: PyTorch eager fp32 on the CPU, each sequence alone."""
    import torch

    from rmscore.model.modeling import RewardModule, inspect_checkpoint, load_hf_model

    module = RewardModule(load_hf_model(hf_dir), inspect_checkpoint(hf_dir)).eval()
    with torch.inference_mode():
        return [float(module(torch.tensor([s]), torch.ones(1, len(s), dtype=torch.int64))[0]) for s in seqs]


def _extract(archive: pathlib.Path, dest: pathlib.Path) -> None:
    with tarfile.open(archive) as tar:
        tar.extractall(dest, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))


def unpack(a) -> int:
    t0 = time.monotonic()
    carry, into = pathlib.Path(a.carry), pathlib.Path(a.into)
    if not (carry / "carry.json").is_file():
        print(f"gpu_carry: {carry} holds no carry; make it with `.venv/bin/python scripts/gpu_carry.py pack` and "
              "carry that path", file=sys.stderr)
        return 2
    info = json.loads((carry / "carry.json").read_text())
    here = f"{sys.version_info.major}.{sys.version_info.minor}"
    if info["python"] != here:
        print(f"gpu_carry: the carry's packages are for CPython {info['python']}, this is {here} "
              f"({sys.executable}); pack with --python-version {here}", file=sys.stderr)
        return 2
    shutil.rmtree(into, ignore_errors=True)
    site, model = into / "site", into / "model"
    _extract(carry / "site.tar.xz", site)
    sys.path[:0] = [str(site), str(ROOT / "server_py"), str(ROOT / "client")]
    for name, stubs in STUBS.items():
        if not (ROOT / stubs / "reward_pb2.py").exists():
            shutil.copytree(carry / name, ROOT / stubs, dirs_exist_ok=True)
    _extract(carry / "model.tar.xz", model)
    import numpy as np
    from safetensors.numpy import load_file, save_file

    weights = {k: v.astype(np.float32) if v.dtype == np.float16 else v
               for k, v in load_file(str(carry / "weights.fp16.safetensors")).items()}
    save_file(weights, str(model / "hf" / "model.safetensors"), metadata={"format": "pt"})
    recipe = json.loads((model / "recipe.json").read_text())
    (model / DATA_FILE).write_bytes(build_data(recipe, weights))
    (model / "model.graph.onnx").rename(model / "model.onnx")
    manifest = json.loads((model / "manifest.json").read_text())
    seqs = [g["input_ids"] for g in manifest["golden"]]
    scores = golden_scores(model / "hf", seqs)
    manifest["golden"] = [{"input_ids": s, "score": g} for s, g in zip(seqs, scores)]
    manifest["graphs"] = {"fp32": "model.onnx"}
    manifest["parity"] = {k: v for k, v in manifest["parity"].items() if k == "fp32"}
    manifest["version"] += "-fp16w"  # not the exported model's weights: rounded to fp16 for the carry
    (model / "manifest.json").write_text(json.dumps(manifest, indent=1))
    say(f"unpacked into {into} in {time.monotonic() - t0:.0f} s: site-packages for CPython {here}, model "
        f"{manifest['version']} (fp16-rounded weights in fp32, goldens recomputed with eager fp32 on the CPU)")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("pack")
    p.add_argument("--model", default=str(ROOT / "models/default"))
    p.add_argument("--out", default=str(ROOT / "build/gpu-carry"))
    p.add_argument("--python-version", default=f"{sys.version_info.major}.{sys.version_info.minor}",
                   help="the device's CPython (compiled wheels are per version); default this one's")
    u = sub.add_parser("unpack")
    u.add_argument("--carry", default=str(ROOT / "build/gpu-carry"))
    u.add_argument("--into", default=str(ROOT / "build/gpu-run"))
    a = ap.parse_args()
    return pack(a) if a.cmd == "pack" else unpack(a)


if __name__ == "__main__":
    sys.exit(main())
