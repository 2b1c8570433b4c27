"""The Grafana dashboards and Prometheus rules against real servers and a real Prometheus.

Grafana itself cannot be installed here, so its dashboards are checked the way
Grafana would use them: every panel's PromQL (template variables substituted)
goes through Prometheus's HTTP API, and a panel whose query returns no data
fails. The Prometheus is started by this module on 127.0.0.1 (ephemeral port,
temporary TSDB) with the committed docker/prometheus/prometheus.yml, its
compose DNS targets rewritten to local servers, a 1 s scrape interval and the
committed rules.yml loaded. The servers are the real ones (tests/servers.py):
py-grpc-onnxruntime, py-http-onnxruntime and cpp-grpc when it is built, and
a second py-grpc-onnxruntime labelled device="cuda" at scrape, standing in for
the GPU service (GPU_STANDIN); a short, bounded load with a few invalid
requests gives every panel data, error panels included.

The static checks at the top (panel datasources, known metric and rule names)
run without Prometheus; the live ones skip only when `prometheus` is not
installed (scripts/setup.sh installs it).
"""

from __future__ import annotations

import copy
import json
import math
import pathlib
import random
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import grpc
import httpx
import pytest
import yaml

import servers

ROOT = pathlib.Path(__file__).resolve().parents[2]
PROM_DIR = ROOT / "docker" / "prometheus"
PROM_CONFIG = PROM_DIR / "prometheus.yml"
RULES = PROM_DIR / "rules.yml"
ALERTS = PROM_DIR / "alerts.yml"
ALERT_TESTS = PROM_DIR / "alerts_test.yml"
GRAFANA = ROOT / "docker" / "grafana"
DASHBOARDS = sorted((GRAFANA / "dashboards").glob("*.json"))
DATASOURCES = GRAFANA / "provisioning" / "datasources" / "prometheus.yml"
METRICS = json.loads((ROOT / "server_py" / "rmscore" / "core" / "metrics.json").read_text())

# test server kind -> the compose service that runs it (docker-compose.yml)
SERVICE_OF_KIND = {
    "py-grpc-onnxruntime": "py-grpc-onnxruntime",
    "py-http-onnxruntime": "py-http",
    "cpp-grpc": "cpp-grpc",
}
# Grafana's built-in variables, as Grafana would fill them for a 30 min view at 1 s scrapes
GRAFANA_BUILTINS = {"$__rate_interval": "1m", "$__interval": "15s", "$__range": "30m"}
LOAD_SECONDS = 6.0
# The GPU-labelled series: there is no GPU here, and a server started with --device cuda fails
# at start rather than fall back to the CPU. So a second, real py-grpc-onnxruntime server stands in
# for compose's `py-grpc-onnxruntime-gpu` service: the committed config scrapes it under that
# service name, and a metric relabelling sets the one label --device cuda would have set
# (device="cuda"). Everything else in its series is its own: what the panels must keep apart from
# its CPU twin is real data of a real server.
GPU_STANDIN = ("py-grpc-onnxruntime", "py-grpc-onnxruntime-gpu")
GPU_RELABEL = {"source_labels": ["service", "device"], "regex": f"{GPU_STANDIN[1]};cpu",
               "target_label": "device", "replacement": "cuda"}
# The stand-in's requests are its twin's (same seeds) with every sequence this much longer, so its
# latency is really higher; the p95 panels must differ by the ratio the clients measure. Twice as
# long: on two shared cores queueing behind the other servers compresses the ratio (1.4x longer
# measured only 1.19x slower under load), and the check needs a difference of at least 20 %.
GPU_STANDIN_SCALE = 2.0
MAX_REQUESTS_PER_SERVER = 150
TRICKLE_MAX = 600  # 5 min at 2/s: more than the checks take


# ---------------------------------------------------------------------------
# reading the committed files


def load_rules(path: pathlib.Path = RULES) -> list[dict]:
    return [r for g in yaml.safe_load(path.read_text())["groups"] for r in g["rules"]]


def load_alerts() -> list[dict]:
    return load_rules(ALERTS)


def iter_panels(panels: list[dict]):
    for p in panels:
        yield p
        yield from iter_panels(p.get("panels", []))  # rows (collapsed ones hold their panels)


def panel_queries() -> list[tuple[str, dict, str, str]]:
    """(dashboard file, dashboard, panel title / refId, expr) for every query target of every panel."""
    out = []
    for path in DASHBOARDS:
        d = json.loads(path.read_text())
        for p in iter_panels(d["panels"]):
            for t in p.get("targets", []):
                out.append((path.name, d, f"{p['title']} / {t['refId']}", t["expr"]))
    return out


def known_metric_names() -> set[str]:
    names = {"up"} | {m["name"] for m in METRICS["process_metrics"]}
    for m in METRICS["metrics"]:
        n = m["name"]
        names.add(n)
        if m["type"] == "histogram":
            names |= {n + "_bucket", n + "_sum", n + "_count"}
    return names


def metric_names_in(expr: str) -> set[str]:
    """The series names an expression reads: rmscore_* metrics and level:metric:op rule names."""
    expr = re.sub(r'"[^"]*"', '""', expr)  # label values are not names
    return set(re.findall(r"\b(?:rmscore_\w+|\w+:[\w:]+)", expr)) - {"le"}


# ---------------------------------------------------------------------------
# static checks (no Prometheus needed)


def test_dashboards_use_the_provisioned_datasource():
    uid = yaml.safe_load(DATASOURCES.read_text())["datasources"][0]["uid"]
    assert len(DASHBOARDS) >= 2, "expected the per-server and the comparison dashboard"
    uids = set()
    for path in DASHBOARDS:
        d = json.loads(path.read_text())
        assert d["uid"] not in uids, f"{path.name}: duplicate dashboard uid {d['uid']}"
        uids.add(d["uid"])
        ids = [p["id"] for p in iter_panels(d["panels"])]
        assert len(ids) == len(set(ids)), f"{path.name}: duplicate panel ids"
        for p in iter_panels(d["panels"]):
            if p["type"] == "row":
                continue
            assert p["datasource"]["uid"] == uid, f"{path.name} / {p['title']}: datasource {p['datasource']}"
            assert p.get("targets"), f"{path.name} / {p['title']}: no query"
            for t in p["targets"]:
                assert t["datasource"]["uid"] == uid and t["expr"].strip(), f"{path.name} / {p['title']} / {t['refId']}"
        for v in d["templating"]["list"]:
            assert v["datasource"]["uid"] == uid, f"{path.name}: variable {v['name']}"


def test_queries_and_rules_read_only_known_series():
    recorded = {r["record"] for r in load_rules()}
    known = known_metric_names()
    for name, _, where, expr in panel_queries():
        unknown = metric_names_in(expr) - known - recorded
        assert not unknown, f"{name} / {where}: {sorted(unknown)} is neither in metrics.json nor recorded in rules.yml"
    for r in load_rules():
        unknown = metric_names_in(r["expr"]) - known - recorded
        assert not unknown, f"rule {r['record']}: unknown series {sorted(unknown)}"
        # a rule must keep server, backend and device, or the dashboards cannot tell the servers apart
        # (a GPU server would merge into the CPU series of the same kind)
        assert "by (server, backend, device" in r["expr"], f"rule {r['record']} drops server/backend/device: {r['expr']}"


def test_every_recording_rule_is_shown_somewhere():
    shown = set().union(*(metric_names_in(e) for *_, e in panel_queries()))
    unused = {r["record"] for r in load_rules()} - shown
    assert not unused, f"recorded but on no dashboard: {sorted(unused)}"


def promtool(*args: str) -> subprocess.CompletedProcess:
    if shutil.which("promtool") is None:
        pytest.skip("promtool is not installed (scripts/setup.sh installs the prometheus package)")
    return subprocess.run(["promtool", *args], capture_output=True, text=True, cwd=PROM_DIR, timeout=120)


def test_rules_pass_promtool():
    r = promtool("check", "rules", str(RULES), str(ALERTS))
    assert r.returncode == 0, r.stdout + r.stderr


# -- alerts ----------------------------------------------------------------------


# What names the thing an alert is about, and how its summary must say it: a server kind by server and
# device, a replica by instance (and pod on Kubernetes), a Deployment by namespace and name, a compose
# service by name.
IDENTIFYING_LABELS = ("server", "device", "instance", "pod", "namespace", "deployment", "service")


def fired_labels(alertname: str) -> set[str]:
    """Every label the alert carries in some firing case of alerts_test.yml."""
    spec = yaml.safe_load(ALERT_TESTS.read_text())
    return {k for group in spec["tests"] for case in group.get("alert_rule_test", [])
            if case["alertname"] == alertname for a in case["exp_alerts"] for k in a["exp_labels"]}


def test_alerts_read_known_series_and_keep_the_server():
    recorded = {r["record"] for r in load_rules()}
    known = known_metric_names()
    alerts = load_alerts()
    assert alerts and all("alert" in r and "record" not in r for r in alerts), "alerts.yml holds alerting rules only"
    for r in alerts:
        unknown = metric_names_in(r["expr"]) - known - recorded
        assert not unknown, f"alert {r['alert']}: unknown series {sorted(unknown)}"
        assert r["labels"]["severity"] in ("warning", "critical"), f"{r['alert']}: severity {r['labels']['severity']!r}"
        assert {"summary", "description", "runbook_url"} <= set(r["annotations"]), f"{r['alert']}: summary, description, runbook_url"
        # a page must say what is in trouble: every identifying label the alert carries is in its summary
        summary = r["annotations"]["summary"]
        carried = fired_labels(r["alert"]) & set(IDENTIFYING_LABELS)
        if "server" in carried:
            carried.discard("service")  # the server kind says it; the scrape's service name adds nothing
        for label in carried:
            assert re.search(r"\$labels\." + label + r"\b", summary), f"{r['alert']}: {label} not in summary {summary!r}"
        if "server" in carried:
            assert {"device", "backend"} <= fired_labels(r["alert"]), f"{r['alert']}: server without backend/device"


def test_alerts_fire_on_bad_series_and_stay_silent_on_healthy_ones():
    """promtool runs alerts_test.yml; each alert needs a case where it fires and one where it must not."""
    r = promtool("test", "rules", ALERT_TESTS.name)
    assert r.returncode == 0, r.stdout + r.stderr
    spec = yaml.safe_load(ALERT_TESTS.read_text())
    assert sorted(spec["rule_files"]) == sorted([RULES.name, ALERTS.name])
    fires, silent = set(), set()
    for group in spec["tests"]:
        for case in group.get("alert_rule_test", []):
            (fires if case["exp_alerts"] else silent).add(case["alertname"])
    names = {a["alert"] for a in load_alerts()}
    assert not names - fires, f"alerts never shown to fire: {sorted(names - fires)}"
    assert not names - silent, f"alerts never shown to stay silent: {sorted(names - silent)}"
    assert not (fires | silent) - names, f"tests of unknown alerts: {sorted((fires | silent) - names)}"


def test_queue_alert_is_80_percent_of_each_replicas_own_limit():
    """The alert divides the depth by the capacity gauge every server exports (so a replica run with another
    --max-queue-sequences is judged by its own), not by a number that follows the default, and keeps the
    replica's pod and namespace (a one-to-one match `on` labels keeps only those)."""
    (alert,) = [a for a in load_alerts() if a["alert"] == "RmscoreQueueNearLimit"]
    expr = alert["expr"].strip()
    m = re.fullmatch(r"max by \(server, backend, device, namespace, pod, instance\) \(rmscore_queue_depth / on \(([a-z, ]+)\) "
                     r"rmscore_queue_capacity_sequences\) > 0\.8", expr)
    assert m, expr
    assert {"instance", "job", "namespace", "pod", "server", "backend", "device"} <= set(m.group(1).split(", ")), expr
    assert not re.search(r"\d{3,}", expr), f"a fixed queue size in {expr}"


def panel_units(panel: dict) -> dict[str, str]:
    """refId -> the unit Grafana draws that query's series in (per-query overrides win over the default)."""
    fc = panel.get("fieldConfig", {})
    units = {t["refId"]: fc.get("defaults", {}).get("unit") for t in panel.get("targets", [])}
    for o in fc.get("overrides", []):
        if o["matcher"]["id"] == "byFrameRefID":
            for prop in o["properties"]:
                if prop["id"] == "unit":
                    units[o["matcher"]["options"]] = prop["value"]
    return units


def test_panel_units_match_what_the_query_counts():
    expected = {"rmscore_sequences_scored": "suffix: seq/s", "rmscore_sequences_dropped": "suffix: seq/s",
                "rmscore_requests:": "reqps", "rmscore_batches:": "suffix: batch/s"}
    seen = set()
    for path in DASHBOARDS:
        for p in iter_panels(json.loads(path.read_text())["panels"]):
            units = panel_units(p)
            for t in p.get("targets", []):
                for what, unit in expected.items():
                    if what in t["expr"] and ("code" not in t["expr"] or unit == "reqps"):
                        seen.add(what)
                        assert units[t["refId"]] == unit, f"{path.name} / {p['title']} / {t['refId']}: unit {units[t['refId']]!r}, want {unit!r}"
    assert seen == set(expected), f"no panel shows {sorted(set(expected) - seen)}"


def test_dashboards_show_drops_mean_latency_and_targets_of_any_job():
    exprs = [e for *_, e in panel_queries()]
    assert any("rmscore_sequences_dropped" in e for e in exprs), "rmscore_sequences_dropped_total is on no panel"
    compare = [t["expr"] for p in iter_panels(json.loads((GRAFANA / "dashboards" / "rmscore-compare.json").read_text())["panels"])
               for t in p.get("targets", [])]
    assert "server_backend:rmscore_request_latency_seconds:mean_rate1m" in compare, "no mean latency on the comparison"
    # scrape jobs are named differently by compose, annotation scraping and ServiceMonitors
    bound = [e for e in exprs if re.search(r"\bjob\s*=", e)]
    assert not bound, f"queries bound to a scrape job name: {bound}"


# ---------------------------------------------------------------------------
# the live stack: servers + Prometheus


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def local_prometheus_config(committed: dict, targets: dict[str, str], self_address: str, rule_files: list[str]) -> dict:
    """The committed config with its compose targets replaced by local ones.

    `targets` maps a compose service name to a local host:port. Every job keeps
    its name and relabelling; DNS discovery becomes static targets carrying the
    `service` label that the relabelling would have set, and a static target
    named after a compose service (job rmscore-expected) is that service's local
    server. Services with no local server are dropped; a local server whose
    service the committed config does not scrape is an error.
    """
    cfg = copy.deepcopy(committed)
    cfg["global"].update(scrape_interval="1s", scrape_timeout="1s", evaluation_interval="1s")
    assert len(cfg["rule_files"]) == len(rule_files), f"prometheus.yml loads {cfg['rule_files']}"
    cfg["rule_files"] = rule_files
    covered = set()
    for job in cfg["scrape_configs"]:
        job.pop("scrape_interval", None)  # the global 1 s
        job.pop("scrape_timeout", None)
        for sc in job.get("static_configs", []):
            service = sc.get("labels", {}).get("service")
            if service is not None:
                sc["targets"] = [targets[service]] if service in targets else []
            else:
                sc["targets"] = [self_address if t.startswith("localhost:9090") else t for t in sc["targets"]]
        if "static_configs" in job:
            job["static_configs"] = [sc for sc in job["static_configs"] if sc["targets"]]
        static = []
        for sd in job.pop("dns_sd_configs", []):
            for name in sd["names"]:
                if name in targets:
                    static.append({"targets": [targets[name]], "labels": {"service": name}})
                    covered.add(name)
        if static:
            job.setdefault("static_configs", []).extend(static)
        if not job.get("static_configs"):
            job["static_configs"] = [{"targets": []}]
    missing = set(targets) - covered
    assert not missing, f"prometheus.yml scrapes no compose service named {sorted(missing)}"
    return cfg


class Prometheus:
    def __init__(self, config: dict, workdir: pathlib.Path, port: int):
        self.url = f"http://127.0.0.1:{port}"
        self.config_path = workdir / "prometheus.yml"
        self.config_path.write_text(yaml.safe_dump(config, sort_keys=False))
        self.log_path = workdir / "prometheus.log"
        self._log = open(self.log_path, "w")
        self.proc = subprocess.Popen(
            ["prometheus", f"--config.file={self.config_path}", f"--storage.tsdb.path={workdir / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{port}", "--storage.tsdb.retention.time=1h",
             "--log.level=warn"],
            stdout=self._log, stderr=subprocess.STDOUT)

    def wait_ready(self, timeout_s: float = 60) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"prometheus exited {self.proc.returncode}:\n{self.log()}")
            try:
                if httpx.get(self.url + "/-/ready", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"prometheus not ready:\n{self.log()}")

    def api(self, path: str, **params) -> dict:
        r = httpx.get(self.url + "/api/v1/" + path, params=params, timeout=10)
        body = r.json()
        assert body.get("status") == "success", f"{path} {params}: {body}"
        return body["data"]

    def query(self, expr: str) -> list[dict]:
        data = self.api("query", query=expr)
        assert data["resultType"] == "vector", f"{expr}: {data['resultType']}"
        return data["result"]

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()


def finite(result: list[dict]) -> list[dict]:
    return [s for s in result if math.isfinite(float(s["value"][1]))]


# -- load ----------------------------------------------------------------------


def random_tokens(rng: random.Random, scale: float = 1.0) -> list[int]:
    n = round(rng.choice([8, 16, 24, 48, 96, 160]) * scale)
    return [101] + [rng.randrange(1000, 30000) for _ in range(n - 2)] + [102]


def drive(server: servers.RunningServer, seed: int, stop: threading.Event | None = None, *,
          scale: float = 1.0, latencies: list[tuple[float, float]] | None = None) -> dict[str, int]:
    """A few seconds of small concurrent requests, then a few invalid ones; bounded in count and time.

    With `stop`, it then keeps a trickle going (one request every 0.5 s, an invalid
    one every 5 s) until `stop` is set, so the 1 m rate windows stay filled while
    the checks run, however slow the machine; at most TRICKLE_MAX requests.
    `scale` multiplies every sequence's length (the same seed gives the same
    requests, longer); `latencies` collects (end time.time(), seconds) of every call.
    """
    from rmscore_client.v1 import reward_pb2 as pb
    from rmscore_client.v1 import reward_pb2_grpc as pbg

    counts = {"ok": 0, "invalid": 0}
    lock = threading.Lock()
    sent = iter(range(MAX_REQUESTS_PER_SERVER))
    deadline = time.monotonic() + LOAD_SECONDS

    if server.transport == "grpc":
        channel = grpc.insecure_channel(server.target)
        stub = pbg.RewardModelStub(channel)

        def send(seqs: list[list[int]]) -> bool:
            req = pb.ScoreRequest(sequences=[pb.Sequence(tokens=pb.TokenIds(ids=s)) for s in seqs])
            try:
                stub.Score(req, timeout=30)
                return True
            except grpc.RpcError as e:
                assert e.code() == grpc.StatusCode.INVALID_ARGUMENT, e
                return False
    else:
        http = httpx.Client(base_url=server.base_url, timeout=30)

        def send(seqs: list[list[int]]) -> bool:
            r = http.post("/rmscore/v1/score", json={"sequences": [{"tokens": s} for s in seqs]})
            assert r.status_code in (200, 422), r.text
            return r.status_code == 200

    def call(seqs: list[list[int]]) -> bool:
        t0 = time.perf_counter()
        ok = send(seqs)
        if latencies is not None:
            latencies.append((time.time(), time.perf_counter() - t0))
        return ok

    def worker(wid: int) -> None:
        rng = random.Random(seed * 100 + wid)
        while time.monotonic() < deadline and next(sent, None) is not None:
            ok = call([random_tokens(rng, scale) for _ in range(rng.randint(1, 4))])
            with lock:
                counts["ok"] += ok
            time.sleep(rng.uniform(0.005, 0.03))

    try:
        with ThreadPoolExecutor(4) as pool:
            list(pool.map(worker, range(4)))
        # invalid requests, so the error panels have data: empty request, id out of range
        for bad in ([], [[101, 30522, 102]], [], [[101, 99999, 102]]):
            assert not call(bad)
            counts["invalid"] += 1
        rng = random.Random(seed)
        for i in range(TRICKLE_MAX):
            if stop is None or stop.wait(0.5):
                break
            if i % 10 == 9:
                call([])
            else:
                call([random_tokens(rng, scale)])
    finally:
        channel.close() if server.transport == "grpc" else http.close()
    return counts


@pytest.fixture(scope="module")
def stack():
    if shutil.which("prometheus") is None:
        pytest.skip("prometheus is not installed (scripts/setup.sh installs the Debian package)")
    available = set(servers.available_kinds())
    kinds = [k for k in SERVICE_OF_KIND if k in available]
    assert kinds, f"no server kind to run (RMSCORE_TEST_KINDS={available})"
    started: list[servers.RunningServer] = []
    prom = stop = None
    work = pathlib.Path(tempfile.mkdtemp(prefix="rmscore-prometheus-"))
    try:
        servers.start_all(kinds + [GPU_STANDIN[0]], started)
        standin = started[-1]

        port = free_port()
        targets = {SERVICE_OF_KIND[s.kind]: f"127.0.0.1:{s.metrics_port}" for s in started[:-1]}
        targets[GPU_STANDIN[1]] = f"127.0.0.1:{standin.metrics_port}"
        config = local_prometheus_config(yaml.safe_load(PROM_CONFIG.read_text()), targets,
                                         f"127.0.0.1:{port}", [str(RULES), str(ALERTS)])
        (job,) = [j for j in config["scrape_configs"] if j["job_name"] == "rmscore"]
        job.setdefault("metric_relabel_configs", []).append(GPU_RELABEL)
        prom = Prometheus(config, work, port)
        prom.wait_ready()
        # load only once every server has been scraped, so rates see the increase
        wait_for(lambda: len([t for t in prom.api("targets")["activeTargets"]
                              if t["labels"]["job"] == "rmscore" and t["health"] == "up"]) == len(started),
                 "every server scraped", prom)
        stop = threading.Event()
        loader = ThreadPoolExecutor(len(started))
        # the CPU twin and the stand-in get the same seed; their latencies are recorded
        twin = next(s for s in started if s.kind == GPU_STANDIN[0])
        latencies = {"cpu": [], "cuda": []}
        futures = {s.kind: loader.submit(drive, s, i, stop) for i, s in enumerate(started[:-1]) if s is not twin}
        futures[twin.kind] = loader.submit(drive, twin, 99, stop, latencies=latencies["cpu"])
        futures[GPU_STANDIN[1]] = loader.submit(drive, standin, 99, stop, scale=GPU_STANDIN_SCALE,
                                                latencies=latencies["cuda"])
        time.sleep(LOAD_SECONDS + 2)  # the burst; the trickle goes on in the background
        # until every rule has a finite value for every server (rules run every 1 s)
        rules = load_rules()
        wait_for(lambda: all(len(finite(prom.query(r["record"] + label_selector(r)))) >= len(started) for r in rules),
                 "every recording rule evaluated for every server", prom, timeout_s=45)
        yield {"prom": prom, "servers": started, "futures": futures, "latencies": latencies}
    finally:
        if stop is not None:
            stop.set()
            loader.shutdown(wait=True)
        if prom is not None:
            prom.stop()
        for s in started:
            s.stop()
        shutil.rmtree(work, ignore_errors=True)


def label_selector(rule: dict) -> str:
    labels = rule.get("labels") or {}
    return "{" + ", ".join(f'{k}="{v}"' for k, v in labels.items()) + "}" if labels else ""


def wait_for(cond, what: str, prom: Prometheus, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}; prometheus log:\n{prom.log()[-3000:]}")
        time.sleep(0.5)


# -- live checks ----------------------------------------------------------------


def test_prometheus_scrapes_every_server(stack):
    prom = stack["prom"]
    up = prom.query('up{job="rmscore"}')
    assert {s["metric"]["service"] for s in up if s["value"][1] == "1"} == {
        SERVICE_OF_KIND[s.kind] for s in stack["servers"][:-1]} | {GPU_STANDIN[1]}
    info = prom.query("rmscore_build_info")
    assert len({(s["metric"]["server"], s["metric"]["backend"], s["metric"]["device"]) for s in info}) == len(stack["servers"])
    for kind, future in stack["futures"].items():
        if future.done():  # the load threads raise on unexpected answers
            future.result()


def test_every_recording_rule_evaluates(stack):
    prom = stack["prom"]
    groups = prom.api("rules")["groups"]
    loaded = [r for g in groups for r in g["rules"]]
    assert len(loaded) == len(load_rules()) + len(load_alerts()), "rules.yml and alerts.yml were not loaded whole"
    bad = [f"{r['name']}: {r.get('lastError')}" for r in loaded if r["health"] != "ok"]
    assert not bad, bad
    # a healthy stack pages for nothing: every target up and exporting rmscore's series (the compose
    # services scraped by name too), no stalled batcher, and the load's invalid requests are the callers'
    # errors, not failures (latency alerts may be pending here: the load shares two cores with every server)
    quiet = {"RmscoreNoTargets", "RmscoreNoTargetUp", "RmscoreTargetDown", "RmscoreMetricsMissing", "RmscoreServiceDown",
             "RmscoreBatcherStalled", "RmscoreErrorBudgetBurnFast", "RmscoreErrorBudgetBurnSlow", "RmscoreRequestsRefused"}
    states = {r["name"]: r["state"] for r in loaded if r["type"] == "alerting"}
    assert quiet <= set(states), sorted(quiet - set(states))
    assert all(states[a] == "inactive" for a in quiet), {a: states[a] for a in quiet}
    expected = prom.query('up{job="rmscore-expected"}')
    assert {s["metric"]["service"] for s in expected if s["value"][1] == "1"} == {
        SERVICE_OF_KIND[s.kind] for s in stack["servers"][:-1]}, expected
    n = len(stack["servers"])
    for r in load_rules():
        q = r["record"] + label_selector(r)
        got = finite(prom.query(q))
        assert len(got) >= n, f"{q}: finite for {len(got)} of {n} servers: {prom.query(q)}"


def variable_assignments(dashboard: dict, prom: Prometheus) -> list[dict[str, str]]:
    """'All' for every variable, then each value of each variable in turn (chained ones resolved)."""
    variables = dashboard["templating"]["list"]
    if not variables:
        return [{}]
    for v in variables:
        assert v["type"] == "query" and v["query"]["query"].startswith("label_values("), v["name"]
    all_ = {v["name"]: v.get("allValue") or ".*" for v in variables}
    out = [all_]

    def values(v: dict, assigned: dict[str, str]) -> list[str]:
        m = re.fullmatch(r"label_values\((.+),\s*(\w+)\)", v["query"]["query"].strip())
        assert m, v["query"]["query"]
        selector, label = substitute(m.group(1), assigned), m.group(2)
        vals = sorted({s[label] for s in prom.api("series", **{"match[]": selector}) if label in s})
        assert vals, f"variable {v['name']}: {v['query']['query']} has no values"
        return vals

    def expand(i: int, assigned: dict[str, str]) -> None:
        if i == len(variables):
            out.append(dict(assigned))
            return
        for val in values(variables[i], assigned):
            expand(i + 1, {**assigned, variables[i]["name"]: grafana_regex_escape(val)})

    expand(0, dict(all_))
    return out


def grafana_regex_escape(value: str) -> str:
    """What Grafana does to a variable's value used in a PromQL regex: escape regex characters, doubled for the string."""
    return re.sub(r"([\\^$*+?.()|\[\]{}])", r"\\\\\1", value)


def substitute(expr: str, assigned: dict[str, str]) -> str:
    for k, v in {**GRAFANA_BUILTINS, **{"$" + n: val for n, val in assigned.items()}}.items():
        expr = expr.replace("${" + k[1:] + "}", v).replace(k, v)
    return expr


def test_every_dashboard_panel_returns_data(stack):
    prom = stack["prom"]
    failures, checked = [], 0
    by_dashboard: dict[str, list] = {}
    for name, d, where, expr in panel_queries():
        by_dashboard.setdefault(name, [d, []])[1].append((where, expr))
    for name, (d, queries) in by_dashboard.items():
        for assigned in variable_assignments(d, prom):
            for where, expr in queries:
                q = substitute(expr, assigned)
                if "$" in q:
                    failures.append(f"{name} / {where}: unresolved variable in {q}")
                    continue
                checked += 1
                try:
                    got = finite(prom.query(q))
                except AssertionError as e:
                    failures.append(f"{name} / {where} {assigned}: query failed: {e}")
                    continue
                if not got:
                    failures.append(f"{name} / {where} {assigned}: no data for {q}")
    assert not failures, f"{len(failures)} of {checked} panel queries without data:\n" + "\n".join(failures)
    assert checked >= 30


def test_comparison_dashboard_shows_every_server(stack):
    """The side-by-side dashboard must draw one series per running server in each per-server panel."""
    prom = stack["prom"]
    d = json.loads((GRAFANA / "dashboards" / "rmscore-compare.json").read_text())
    key = lambda s: (s["metric"]["server"], s["metric"]["backend"], s["metric"].get("device"))  # noqa: E731
    kinds = {key(s) for s in prom.query("rmscore_build_info")}
    assert len(kinds) == len(stack["servers"])
    for p in iter_panels(d["panels"]):
        for t in p.get("targets", []):
            if "server_backend" not in t["expr"] or "code" in t["expr"]:
                continue  # error-code panels show only the codes that occurred
            got = {key(s) for s in finite(prom.query(substitute(t["expr"], {})))}
            assert got == kinds, f"{p['title']}: series for {sorted(got)}, servers {sorted(kinds)}"


def test_no_panel_merges_a_gpu_server_into_its_cpu_twin(stack):
    """Every panel query of both dashboards that draws the py-grpc-onnxruntime kind draws its CPU server
    and the GPU-labelled one as two series (same labels but `device`): a query or rule that summed
    over `device`, or dropped it, would give one series, or one without a device."""
    prom = stack["prom"]
    server, backend = "py-grpc", "onnxruntime"  # the series' labels of the py-grpc-onnxruntime kind
    checked = 0
    for name, d, where, expr in panel_queries():
        q = substitute(expr, {v["name"]: v.get("allValue") or ".*" for v in d["templating"]["list"]})
        got = finite(prom.query(q))
        if not any(s["metric"].get("server") == server for s in got):
            continue  # a panel of totals, or of error codes that did not occur
        twins = [s for s in got if s["metric"].get("server") == server and s["metric"].get("backend", backend) == backend]
        by_device: dict[str, list] = {}
        for s in twins:
            # the twins are different targets: per-target labels differ anyway
            rest = tuple(sorted((k, v) for k, v in s["metric"].items() if k not in ("device", "instance", "service", "job")))
            by_device.setdefault(rest, []).append(s["metric"].get("device"))
        for rest, devices in by_device.items():
            if dict(rest).get("code") or dict(rest).get("reason"):
                continue  # codes and drop reasons occur for one twin and not the other
            assert sorted(devices) == ["cpu", "cuda"], f"{name} / {where}: {server} {dict(rest)} drawn for devices {devices}: {q}"
        checked += 1
    assert checked >= 20, f"only {checked} panel queries draw {server}"


def test_p95_panels_differ_as_the_measured_latencies_do(stack):
    """The stand-in serves its twin's requests with sequences twice as long. The comparison dashboard's p95
    panel must show the two apart, by about the ratio of the p95 latencies the clients measured over the
    same minute (the histogram's buckets are at most 10 % apart, so a 20 % difference must show)."""
    prom = stack["prom"]
    d = json.loads((GRAFANA / "dashboards" / "rmscore-compare.json").read_text())
    (expr,) = {t["expr"] for p in iter_panels(d["panels"]) for t in p.get("targets", [])
               if t["expr"] == 'server_backend:rmscore_request_latency_seconds:quantile_rate1m{quantile="0.95"}'}
    now = time.time()
    data = [s for s in prom.api("query", query=expr, time=f"{now:.3f}")["result"]
            if (s["metric"]["server"], s["metric"]["backend"]) == ("py-grpc", "onnxruntime")]
    panel = {s["metric"]["device"]: float(s["value"][1]) for s in data}
    assert set(panel) == {"cpu", "cuda"}, data
    # the same window as the panel: the rule's 1 m rate, evaluated up to 1 s before `now`
    measured = {}
    for device, record in stack["latencies"].items():
        window = sorted(sec for end, sec in list(record) if now - 61 <= end <= now - 1)
        assert len(window) >= 20, f"{device}: {len(window)} requests in the last minute"
        measured[device] = window[int(0.95 * (len(window) - 1))]
    want, got = measured["cuda"] / measured["cpu"], panel["cuda"] / panel["cpu"]
    assert want >= 1.2, f"the longer requests were not 20 % slower: p95 {measured}, panel {panel}"
    assert got > 1.1, f"p95 panel {panel}: the slower server does not show (measured {measured})"
    assert abs(math.log(got / want)) <= math.log(1.25), f"p95 panel ratio {got:.2f}, measured {want:.2f}: panel {panel}, clients {measured}"
