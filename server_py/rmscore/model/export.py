"""`rmscore export`: a Hugging Face reward checkpoint -> a model repository every runtime loads.

The repository is written aside and renamed into place only after the parity
gate passed, so a failed export never leaves a half-written `models/NAME/`.
"""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
import random
import shutil
import time
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from rmscore.model import default_model, precision
from rmscore.model.repository import FORMAT_VERSION, MANIFEST
from rmscore.model.modeling import ModelLoadError, ModelSpec, RewardModule, inspect_checkpoint, load_hf_model
from rmscore.model.ort_eval import ort_session, parity

OPSET = 17
FP32_TOLERANCE = 1e-5
GOLDEN_RANDOM_LENGTHS = (1, 2, 3, 17, 64, 128, 255, 511)


class ExportError(RuntimeError):
    pass


class Steps:
    """Prints numbered steps with their durations: export is long enough to need it."""

    def __init__(self, total: int):
        self.total, self.n, self.t0 = total, 0, time.perf_counter()

    @contextmanager
    def step(self, what: str):
        self.n += 1
        t = time.perf_counter()
        print(f"[{self.n}/{self.total}] {what} ...", flush=True)
        yield
        print(f"      done in {time.perf_counter() - t:.1f} s", flush=True)

    def elapsed(self) -> float:
        return time.perf_counter() - self.t0


def _one_line(e: BaseException) -> str:
    text = " ".join(str(e).split()) or type(e).__name__
    return text if len(text) <= 300 else text[:297] + "..."


def read_checkpoint(hf_dir: pathlib.Path) -> tuple[ModelSpec, object]:
    """The spec and the model, or ExportError with one line that quotes the bad path or value: a
    user's checkpoint fails in many ways (bad JSON, missing keys, unreadable or corrupt weights), and a
    traceback from deep inside json, transformers or safetensors says none of them plainly."""
    cfg_path = hf_dir / "config.json"
    if cfg_path.is_file():  # when absent, inspect_checkpoint says so
        try:
            cfg = json.loads(cfg_path.read_bytes())
        except OSError as e:
            raise ExportError(f"--model: cannot read {str(cfg_path)!r}: {e.strerror}") from e
        except ValueError as e:  # JSONDecodeError and UnicodeDecodeError alike
            raise ExportError(f"--model: {str(cfg_path)!r} is not valid JSON: {_one_line(e)}") from e
        if not isinstance(cfg, dict):
            raise ExportError(f"--model: {str(cfg_path)!r} must hold a JSON object, got {type(cfg).__name__}")
    try:
        spec = inspect_checkpoint(hf_dir)
    except ModelLoadError:
        raise
    except KeyError as e:
        raise ExportError(f"--model: {str(cfg_path)!r} has no {e.args[0]!r} key") from e
    except (TypeError, ValueError) as e:
        raise ExportError(f"--model: {str(cfg_path)!r} holds a bad value: {_one_line(e)}") from e
    import transformers

    # from_pretrained builds the class of `model_type` whatever `architectures` says: a name that is
    # no transformers class would be written into the manifest though another class was exported.
    if not hasattr(transformers, spec.architecture):
        raise ExportError(f"--model: architecture {spec.architecture!r} in {str(cfg_path)!r} is not a class in "
                          f"transformers {transformers.__version__}")
    try:
        model = load_hf_model(hf_dir)
    except Exception as e:  # noqa: BLE001 - OSError, safetensors' and torch's own errors: all mean "cannot load"
        raise ExportError(f"--model: cannot load the checkpoint in {str(hf_dir)!r}: {_one_line(e)}") from e
    loaded = type(model).__name__
    if loaded != spec.architecture:
        raise ExportError(f"--model: architecture {spec.architecture!r} in {str(cfg_path)!r} does not match the "
                          f"class its model_type loads, {loaded!r}")
    return spec, model


def golden_inputs(hf_dir: pathlib.Path, spec: ModelSpec) -> list[list[int]]:
    """Varied lengths: real prompt/response pairs, then random ids up to the maximum."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(hf_dir / "tokenizer.json"))
    tok.no_padding()
    tok.no_truncation()
    seqs = [tok.encode(p, r).ids[:spec.max_sequence_length]
            for p, r in default_model.calibration_pairs()[::5]]
    rng = random.Random(7)
    lengths = [n for n in GOLDEN_RANDOM_LENGTHS if n < spec.max_sequence_length] + [spec.max_sequence_length]
    seqs += [[rng.randrange(spec.vocab_size) for _ in range(n)] for n in lengths]
    return seqs


def eager_scores(module: RewardModule, seqs: list[list[int]]) -> list[float]:
    """Each sequence alone, unpadded: the reference every runtime is held to."""
    out = []
    with torch.inference_mode():
        for s in seqs:
            ids = torch.tensor([s], dtype=torch.int64)
            out.append(float(module(ids, torch.ones_like(ids))[0]))
    return out


def export_onnx(module: RewardModule, spec: ModelSpec, path: pathlib.Path) -> None:
    ids = torch.randint(0, spec.vocab_size, (2, 16), dtype=torch.int64)
    mask = torch.ones_like(ids)
    torch.onnx.export(
        module, (ids, mask), str(path), dynamo=False, opset_version=OPSET,
        input_names=["input_ids", "attention_mask"], output_names=["scores"],
        dynamic_axes={"input_ids": {0: "batch", 1: "sequence"},
                      "attention_mask": {0: "batch", 1: "sequence"}, "scores": {0: "batch"}})


def fuse_encoder(path: pathlib.Path, spec: ModelSpec) -> bool:
    """ORT's transformer fusion gave the fastest fp32 encoder graph here (docs/machine.md)."""
    if spec.family != "encoder":
        return False
    from onnxruntime.transformers.optimizer import optimize_model

    opt = optimize_model(str(path), model_type="bert", num_heads=spec.num_attention_heads,
                         hidden_size=spec.hidden_size, opt_level=1)
    opt.save_model_to_file(str(path))
    fused = opt.get_fused_operator_statistics()
    print("      fused: " + ", ".join(f"{k} {v}" for k, v in fused.items() if v))
    return True


def _checked_output(models_root: pathlib.Path, name: str) -> pathlib.Path:
    if not name or "/" in name or name.startswith("."):
        raise ExportError(f"--name: {name!r} is not a plain directory name")
    try:
        models_root.mkdir(parents=True, exist_ok=True)
        tmp = models_root / f".{name}.partial-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
    except OSError as e:
        raise ExportError(f"--output: cannot write under {str(models_root)!r}: {e.strerror}") from e
    return tmp


def _publish(tmp: pathlib.Path, final: pathlib.Path) -> None:
    old = final.with_name(f".{final.name}.old-{os.getpid()}")
    if final.exists():
        final.rename(old)
    tmp.rename(final)
    shutil.rmtree(old, ignore_errors=True)


@dataclass(frozen=True)
class Reduced:
    """Which reduced-precision graphs to write beside fp32, and the gate each must pass."""
    int8: bool = False
    int8_recipe: str = precision.DEFAULT_INT8_RECIPE
    gate: precision.Gate = precision.Gate()

    def __post_init__(self) -> None:
        if self.int8_recipe not in precision.INT8_RECIPES:
            raise ExportError(f"--int8-recipe: must be one of {precision.INT8_RECIPES}, got {self.int8_recipe!r}")


def export(model_dir: str | None, name: str, models_root: str = "models", reduced: Reduced = Reduced()) -> pathlib.Path:
    steps = Steps(6 + reduced.int8)
    root = pathlib.Path(models_root)
    tmp = _checked_output(root, name)
    try:
        manifest = _export_into(tmp, model_dir, name, steps)
        manifest["export_seconds"] = round(steps.elapsed(), 1)
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
        if reduced.int8:
            with steps.step(f"quantizing to int8 ({reduced.int8_recipe}); the ranking gate"):
                precision.add_int8(tmp, reduced.int8_recipe, reduced.gate)
        _publish(tmp, root / name)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    fp = manifest["parity"]["fp32"]["max_abs_diff"]
    print(f"exported {name} ({manifest['architecture']}, version {manifest['version']}) to {root / name} "
          f"in {steps.elapsed():.1f} s; fp32 parity {fp:.2e}", flush=True)
    return root / name


def _export_into(out: pathlib.Path, model_dir: str | None, name: str, steps: Steps) -> dict:
    import onnxruntime as ort

    hf_out = out / "hf"
    head = None
    with steps.step("reading the checkpoint" if model_dir else "building the default MiniLM reward model"):
        if model_dir:
            spec, hf_model = read_checkpoint(pathlib.Path(model_dir))
            hf_model.save_pretrained(str(hf_out))
            shutil.copy(pathlib.Path(model_dir) / "tokenizer.json", hf_out / "tokenizer.json")
            for extra in ("tokenizer_config.json", "special_tokens_map.json"):
                if (pathlib.Path(model_dir) / extra).exists():
                    shutil.copy(pathlib.Path(model_dir) / extra, hf_out / extra)
        else:
            hf_out.mkdir()
            head = default_model.build_default_checkpoint(hf_out)
            spec = inspect_checkpoint(hf_out)
            hf_model = load_hf_model(hf_out)
        try:
            _save_plain_tokenizer(hf_out / "tokenizer.json", out / "tokenizer.json")
        except Exception as e:  # noqa: BLE001 - tokenizers raises a bare Exception for a malformed file
            src = pathlib.Path(model_dir) / "tokenizer.json" if model_dir else hf_out / "tokenizer.json"
            raise ExportError(f"--model: {str(src)!r} is not a Hugging Face tokenizer file: {_one_line(e)}") from e
        module = RewardModule(hf_model, spec).eval()
    with steps.step("scoring golden inputs with PyTorch eager fp32"):
        seqs = golden_inputs(hf_out, spec)
        golden = eager_scores(module, seqs)
    with steps.step("exporting the ONNX graph (TorchScript exporter, opset %d)" % OPSET):
        export_onnx(module, spec, out / "model.onnx")
    with steps.step("fusing transformer ops"):
        fused = fuse_encoder(out / "model.onnx", spec)
    with steps.step("parity gate: ONNX Runtime vs eager"):
        fp32 = parity(ort_session(out / "model.onnx"), seqs, golden, spec.pad_token_id)
        fp32["tolerance"] = FP32_TOLERANCE
        print(f"      fp32 max abs diff {fp32['max_abs_diff']:.2e} (tolerance {FP32_TOLERANCE:.0e})")
        if fp32["max_abs_diff"] > FP32_TOLERANCE:
            raise ExportError(f"parity gate: ONNX Runtime differs from PyTorch eager by {fp32['max_abs_diff']:.3e}, "
                              f"{fp32['max_abs_diff'] / FP32_TOLERANCE:.1f}x the tolerance {FP32_TOLERANCE:.0e}; "
                              "nothing was written")
    graphs = {"fp32": "model.onnx"}
    report = {"fp32": _strip(fp32)}
    with steps.step("writing the manifest"):
        version = "sha256:" + hashlib.sha256((out / "model.onnx").read_bytes()).hexdigest()[:16]
        return {
            "format_version": FORMAT_VERSION, "name": name, "version": version,
            "architecture": spec.architecture, "family": spec.family, "pooling": spec.pooling,
            "max_sequence_length": spec.max_sequence_length, "pad_token_id": spec.pad_token_id,
            "vocab_size": spec.vocab_size, "inputs": ["input_ids", "attention_mask"], "output": "scores",
            "opset": OPSET, "onnxruntime_version": ort.__version__, "torch_version": torch.__version__,
            "fused": fused, "graphs": graphs,
            "tokenizer": {"file": "tokenizer.json", "text_format": "pair"},
            "golden": [{"input_ids": s, "score": g} for s, g in zip(seqs, golden)],
            "parity": report, "head": head,
        }


def _save_plain_tokenizer(src: pathlib.Path, dst: pathlib.Path) -> None:
    """The repository's tokenizer encodes one sequence as the model scores it: no padding or
    truncation baked in (MiniLM's file pads to 128), so every client tokenizes identically."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(src))
    tok.no_padding()
    tok.no_truncation()
    tok.save(str(dst))


def _strip(p: dict) -> dict:
    return {k: v for k, v in p.items() if k != "alone"}


def main(args) -> int:
    try:
        gate = precision.Gate(args.gate_spearman, args.gate_pairwise)
        export(args.model, args.name, args.output, Reduced(args.int8, args.int8_recipe, gate))
    except ValueError as e:  # Gate's own validation
        print(f"rmscore export: error: {e}", flush=True)
        return 2
    except (ModelLoadError, ExportError, precision.GateError) as e:
        print(f"rmscore export: error: {e}", flush=True)
        return 2
    return 0
