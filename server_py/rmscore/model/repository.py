"""The model repository (`models/NAME/`) and its manifest, as every runtime reads it."""

from __future__ import annotations

import json
import pathlib
from dataclasses import dataclass

FORMAT_VERSION = 1
MANIFEST = "manifest.json"
REQUIRED_KEYS = ("format_version", "name", "version", "architecture", "family", "pooling",
                 "max_sequence_length", "pad_token_id", "vocab_size", "inputs", "output", "opset",
                 "onnxruntime_version", "torch_version", "graphs", "tokenizer", "golden", "parity")


class RepoError(ValueError):
    pass


@dataclass(frozen=True)
class ModelRepo:
    path: pathlib.Path
    manifest: dict

    @property
    def name(self) -> str:
        return self.manifest["name"]

    @property
    def version(self) -> str:
        return self.manifest["version"]

    @property
    def max_sequence_length(self) -> int:
        return int(self.manifest["max_sequence_length"])

    @property
    def pad_token_id(self) -> int:
        return int(self.manifest["pad_token_id"])

    @property
    def vocab_size(self) -> int:
        return int(self.manifest["vocab_size"])

    def graph_path(self, precision: str) -> pathlib.Path:
        graphs = self.manifest["graphs"]
        if precision not in graphs:
            raise RepoError(f"--precision: {precision!r} has no graph in {self.path} "
                            f"(has {sorted(graphs)}; export with --int8 for int8)")
        return self.path / graphs[precision]

    @property
    def hf_dir(self) -> pathlib.Path:
        return self.path / "hf"

    @property
    def tokenizer_path(self) -> pathlib.Path:
        return self.path / self.manifest["tokenizer"]["file"]

    def golden(self) -> tuple[list[list[int]], list[float]]:
        g = self.manifest["golden"]
        return [x["input_ids"] for x in g], [float(x["score"]) for x in g]


def load_repo(path: str | pathlib.Path) -> ModelRepo:
    path = pathlib.Path(path)
    mf = path / MANIFEST
    if not mf.is_file():
        raise RepoError(f"--model: {str(path)!r} has no {MANIFEST}; create it with `rmscore export`")
    manifest = json.loads(mf.read_text())
    missing = [k for k in REQUIRED_KEYS if k not in manifest]
    if missing:
        raise RepoError(f"--model: {mf} lacks keys {missing}")
    if manifest["format_version"] != FORMAT_VERSION:
        raise RepoError(f"--model: {mf} has format_version {manifest['format_version']!r}, "
                        f"this rmscore reads {FORMAT_VERSION}")
    return ModelRepo(path, manifest)
