#!/usr/bin/env python3
"""Pins every external container image the deployment uses to its registry digest, in place.

The images are named in two kinds of places, and each becomes `name:tag@sha256:<digest>`:
- the Dockerfiles' `ARG BASE_IMAGE=...` (the one base each image builds and runs on), which
  `FROM ${BASE_IMAGE}` reads, so a digest there pins both stages;
- docker-compose.yml: the `BASE_IMAGE` build arguments of the GPU variants and the `image:` of
  every service that is pulled, not built (Prometheus, Grafana).
The tag stays next to the digest for the reader; the digest wins when both are given. A digest is
that of the tag's manifest list (the index), so one pin serves every platform.

Digests must be read from a registry, so this runs where one is reachable (none is on the machines
this project is developed on: docs/deploy.md says the shipped files are not pinned yet, and why).
It asks the first tool it finds: `docker buildx imagetools inspect`, `crane digest`, or
`skopeo inspect --raw` (hashed); RMSCORE_DIGEST_RESOLVER names another command, called with the
reference, that prints `sha256:...` (tests/deploy/test_deploy.py uses that to prove the wiring).

  scripts/pin_image_digests.py            # resolve and rewrite (re-resolves pinned ones too)
  scripts/pin_image_digests.py --list     # what would be pinned, and whether it is; no registry
  scripts/pin_image_digests.py --check    # exit 1 while any reference has no digest
"""

from __future__ import annotations

import argparse
import hashlib
import os
import pathlib
import re
import shlex
import shutil
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
# (file glob, pattern whose group 1 is the reference); locally built images (rmscore-*) are not pulled
PLACES = [
    ("docker/*.Dockerfile", re.compile(r"^ARG BASE_IMAGE=(\S+)\s*$", re.M)),
    # the default of `${RMSCORE_BASE_IMAGE:-ref}` (scripts/build_images.sh overrides it) or a plain ref
    ("docker-compose.yml", re.compile(r"^\s+BASE_IMAGE:\s*(?:\$\{\w+:-)?([^\s}]+)\}?\s*$", re.M)),
    ("docker-compose.yml", re.compile(r"^\s+image:\s*(?!rmscore-)(\S+)\s*$", re.M)),
]


def references(root: pathlib.Path) -> list[tuple[pathlib.Path, str]]:
    out = []
    for glob, pattern in PLACES:
        for path in sorted(root.glob(glob)):
            out += [(path, m.group(1)) for m in pattern.finditer(path.read_text())]
    return out


def split(ref: str) -> tuple[str, str | None]:
    name, _, digest = ref.partition("@")
    return name, digest or None


def resolve(name: str) -> str:
    custom = os.environ.get("RMSCORE_DIGEST_RESOLVER")
    if custom:
        cmd = [*shlex.split(custom), name]
    elif shutil.which("docker") and subprocess.run(["docker", "buildx", "version"], capture_output=True).returncode == 0:
        cmd = ["docker", "buildx", "imagetools", "inspect", name, "--format", "{{json .Manifest.Digest}}"]
    elif shutil.which("crane"):
        cmd = ["crane", "digest", name]
    elif shutil.which("skopeo"):
        raw = subprocess.run(["skopeo", "inspect", "--raw", f"docker://{name}"], capture_output=True, check=True).stdout
        return "sha256:" + hashlib.sha256(raw).hexdigest()
    else:
        sys.exit("no resolver: install docker buildx, crane or skopeo, or set RMSCORE_DIGEST_RESOLVER")
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    m = DIGEST.search(out)
    if not m:
        sys.exit(f"{' '.join(cmd)}: no sha256 digest in {out!r}")
    return m.group(0)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", type=pathlib.Path, default=ROOT, help="repository root (default: this one)")
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--list", action="store_true", help="print file, reference and digest state; change nothing")
    mode.add_argument("--check", action="store_true", help="exit 1 if any reference is unpinned")
    args = ap.parse_args()
    refs = references(args.root)
    if args.list or args.check:
        unpinned = [(p, r) for p, r in refs if not split(r)[1]]
        for p, r in refs:
            print(f"{p.relative_to(args.root)}\t{r}\t{'pinned' if split(r)[1] else 'UNPINNED'}")
        return 1 if args.check and unpinned else 0
    digests: dict[str, str] = {}
    for path, ref in refs:
        name, _ = split(ref)
        if name not in digests:
            digests[name] = resolve(name)
    for path in sorted({p for p, _ in refs}):
        text = path.read_text()
        for glob, pattern in PLACES:
            if path.match(glob) or path.name == glob:
                text = pattern.sub(lambda m: m.group(0).replace(
                    m.group(1), f"{split(m.group(1))[0]}@{digests[split(m.group(1))[0]]}"), text)
        path.write_text(text)
    for name, d in sorted(digests.items()):
        print(f"{name}@{d}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
