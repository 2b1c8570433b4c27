"""The KEDA ScaledObjects (overlays/keda, overlays/gpu): their queries run against a real Prometheus.

KEDA reads one number per trigger from Prometheus's query API and its prometheus scaler
(pkg/scalers/prometheus_scaler.go, ExecutePromQuery) makes of the answer: an empty vector or
a NaN/Inf value -> 0 with ignoreNullValues "true", an error with "false"; two or more elements
-> an error. After `fallback.failureThreshold` errors in a row the trigger reports
`threshold x fallback.replicas`, so the HPA wants fallback.replicas; otherwise an AverageValue
trigger wants ceil(value / threshold) replicas, and the HPA takes the largest wish, within
[minReplicaCount, maxReplicaCount].

The Prometheus here is Debian's binary on a TSDB backfilled with `promtool tsdb
create-blocks-from openmetrics`: three replicas of each scaled Deployment busy for 10 minutes,
then idle (gauges 0, counters flat) for 10, then gone (no series: Prometheus lost the
servers), plus decoy series of other namespaces and kinds the queries must not read. Each query
is asked at a time in each phase, and KEDA's reading of the answer must give: busy -> more than
the minimum; idle -> exactly 0, so the minimum; gone -> an error, so the fallback (where
ignoreNullValues "true" would have read 0 and pinned the minimum, which the test shows too).
"""

from __future__ import annotations

import math
import pathlib
import shutil
import subprocess
import tempfile
import time

import pytest
import yaml

from test_dashboards import Prometheus, free_port

ROOT = pathlib.Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "k8s"
SCALEDOBJECT_FILES = [K8S / "overlays" / "keda" / "scaledobjects.yaml", K8S / "overlays" / "gpu" / "scaledobjects.yaml"]
DEPLOYMENT_SERVER = {"rmscore-cpp-grpc": ("cpp-grpc", "onnxruntime"), "rmscore-py-grpc-onnxruntime": ("py-grpc", "onnxruntime")}

STEP_S = 15
BUSY_S, IDLE_S = 600, 600           # then nothing
REPLICAS = 3
BUSY = {"depth": 200, "expected_wait_s": 3.0, "observed_per_s": 10}  # per replica; every wait in (0.1, 0.5139] s
WAIT_BUCKETS = ("0.1", "0.5139", "+Inf")
ASK_AT = {"busy": BUSY_S - 60, "idle": BUSY_S + IDLE_S - 60, "gone": BUSY_S + IDLE_S + 900}


def scaled_objects() -> list[dict]:
    return [o for f in SCALEDOBJECT_FILES for o in yaml.safe_load_all(f.read_text()) if o]


def labels_of(so: dict) -> dict[str, str]:
    """The series labels a ScaledObject's Deployment exports, as the ServiceMonitor scrapes them."""
    server, backend = DEPLOYMENT_SERVER[so["spec"]["scaleTargetRef"]["name"]]
    ns = so["metadata"]["namespace"]
    return {"namespace": ns, "server": server, "backend": backend, "device": "cuda" if ns.endswith("-gpu") else "cpu"}


# ---------------------------------------------------------------------------
# static: every ScaledObject falls back instead of reading a lost metric as no load


@pytest.mark.parametrize("so", scaled_objects(), ids=lambda o: f"{o['metadata']['namespace']}/{o['metadata']['name']}")
def test_scaled_object_falls_back_when_blind(so):
    spec = so["spec"]
    fb = spec["fallback"]
    assert fb["failureThreshold"] >= 1
    assert spec["minReplicaCount"] < fb["replicas"] <= spec["maxReplicaCount"], \
        "the fallback must be above the minimum (blind is not idle) and within the maximum"
    want = labels_of(so)
    for t in spec["triggers"]:
        assert t["type"] == "prometheus", t
        # KEDA applies the fallback to AverageValue triggers only
        assert t["metricType"] == "AverageValue", t
        assert t["metadata"]["ignoreNullValues"] == "false", f"{t['name']}: an empty answer must be an error, not 0"
        for k, v in want.items():
            assert f'{k}="{v}"' in t["metadata"]["query"], f"{t['name']}: {k}={v} not in {t['metadata']['query']}"


def test_gpu_replicas_scale_on_queue_wait_not_cpu():
    gpu = yaml.safe_load((K8S / "overlays" / "gpu" / "kustomization.yaml").read_text())
    assert "scaledobjects.yaml" in gpu["resources"]
    objs = [o for o in scaled_objects() if o["metadata"]["namespace"] == gpu["namespace"]]
    assert {o["spec"]["scaleTargetRef"]["name"] for o in objs} == set(DEPLOYMENT_SERVER)
    for o in objs:
        queries = [t["metadata"]["query"] for t in o["spec"]["triggers"]]
        assert any("rmscore_queue_expected_wait_seconds" in q for q in queries), queries
        assert any("rmscore_queue_wait_seconds_bucket" in q for q in queries), queries


# ---------------------------------------------------------------------------
# live: the queries against Prometheus, busy, idle and gone


def openmetrics(t0: int) -> str:
    """Three replicas per scaled Deployment through the phases, and decoys (another namespace, another kind)."""
    targets = []
    for i, so in enumerate(scaled_objects()):
        for r in range(REPLICAS):
            targets.append({**labels_of(so), "job": "rmscore", "instance": f"10.9.{i}.{r}:9100",
                            "pod": f"{so['spec']['scaleTargetRef']['name']}-{r}"})
    decoys = [{**targets[0], "namespace": "other", "instance": "10.8.0.1:9100", "pod": "x"},
              {**targets[0], "server": "py-http", "instance": "10.8.0.2:9100", "pod": "y"}]
    end = BUSY_S + IDLE_S
    steps = range(0, end, STEP_S)

    def busy(s: int) -> bool:
        return s < BUSY_S

    def series(name: str, labels: dict, value) -> list[str]:
        body = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
        return [f"{name}{{{body}}} {value(s)} {t0 + s}" for s in steps]

    out = []
    for family, kind in (("rmscore_build_info", "gauge"), ("rmscore_queue_depth", "gauge"),
                         ("rmscore_queue_expected_wait_seconds", "gauge"), ("rmscore_queue_wait_seconds", "histogram")):
        out.append(f"# TYPE {family} {kind}")
        for lbl in targets + decoys:
            decoy = lbl in decoys
            if family == "rmscore_build_info":
                out += series(family, {**lbl, "model": "m", "version": "1"}, lambda s: 1)
            elif family == "rmscore_queue_depth":
                out += series(family, lbl, lambda s, d=decoy: 10000 if d else BUSY["depth"] if busy(s) else 0)
            elif family == "rmscore_queue_expected_wait_seconds":
                out += series(family, lbl, lambda s, d=decoy: 500 if d else BUSY["expected_wait_s"] if busy(s) else 0)
            else:
                for le in WAIT_BUCKETS:
                    rate = 0 if le == "0.1" else BUSY["observed_per_s"] * (100 if decoy else 1)
                    out += series(family + "_bucket", {**lbl, "le": le}, lambda s, r=rate: r * min(s, BUSY_S))
    return "\n".join(out + ["# EOF"]) + "\n"


@pytest.fixture(scope="module")
def prom():
    for tool in ("prometheus", "promtool"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} is not installed (scripts/setup.sh installs the prometheus package)")
    work = pathlib.Path(tempfile.mkdtemp(prefix="rmscore-keda-"))
    p = None
    try:
        t0 = (int(time.time()) - 3600) // STEP_S * STEP_S
        (work / "series.om").write_text(openmetrics(t0))
        r = subprocess.run(["promtool", "tsdb", "create-blocks-from", "openmetrics", str(work / "series.om"), str(work / "tsdb")],
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stdout + r.stderr
        port = free_port()
        config = {"global": {"scrape_interval": "15s", "evaluation_interval": "15s"}, "scrape_configs": []}
        p = Prometheus(config, work, port)
        p.wait_ready()
        yield p, t0
    finally:
        if p is not None:
            p.stop()
        shutil.rmtree(work, ignore_errors=True)


class KedaError(Exception):
    pass


def keda_reads(result: list[dict], ignore_null_values: bool) -> float:
    """What KEDA's prometheus scaler makes of a query's answer (ExecutePromQuery)."""
    if not result:
        if ignore_null_values:
            return 0.0
        raise KedaError("the result is empty")
    if len(result) > 1:
        raise KedaError(f"{len(result)} elements")
    v = float(result[0]["value"][1])
    if math.isnan(v) or math.isinf(v):
        if ignore_null_values:
            return 0.0
        raise KedaError(f"value {v}")
    return v


def replicas_wanted(so: dict, answers: list[list[dict]], ignore_null_values: bool | None = None) -> int:
    """The HPA's replica count from every trigger's answer: the fallback for a trigger that errs."""
    spec = so["spec"]
    wishes = []
    for t, result in zip(spec["triggers"], answers):
        ignore = t["metadata"]["ignoreNullValues"] == "true" if ignore_null_values is None else ignore_null_values
        try:
            wishes.append(math.ceil(keda_reads(result, ignore) / float(t["metadata"]["threshold"])))
        except KedaError:
            wishes.append(spec["fallback"]["replicas"])
    return min(max(max(wishes), spec["minReplicaCount"]), spec["maxReplicaCount"])


def ask(p: Prometheus, query: str, at: int) -> list[dict]:
    data = p.api("query", query=query, time=str(at))
    assert data["resultType"] == "vector", f"{query}: {data['resultType']}"
    return data["result"]


@pytest.mark.parametrize("so", scaled_objects(), ids=lambda o: f"{o['metadata']['namespace']}/{o['metadata']['name']}")
def test_keda_queries_scale_up_when_busy_rest_when_idle_and_fall_back_when_blind(prom, so):
    p, t0 = prom
    spec = so["spec"]
    triggers = spec["triggers"]
    answers = {phase: [ask(p, t["metadata"]["query"], t0 + s) for t in triggers] for phase, s in ASK_AT.items()}

    # busy: one finite number per trigger, the replicas' own (the decoys' 10,000 would show)
    for t, result in zip(triggers, answers["busy"]):
        v = keda_reads(result, ignore_null_values=False)
        if "rmscore_queue_depth" in t["metadata"]["query"]:
            assert v == REPLICAS * BUSY["depth"], (t["name"], v)
        elif "rmscore_queue_expected_wait_seconds" in t["metadata"]["query"]:
            assert v == REPLICAS * BUSY["expected_wait_s"], (t["name"], v)
        else:  # p95 of waits spread over (0.1, 0.5139], times the replicas scraped
            assert v == pytest.approx(REPLICAS * (0.1 + 0.95 * (0.5139 - 0.1)), rel=1e-6), (t["name"], v)
    assert replicas_wanted(so, answers["busy"]) > spec["minReplicaCount"]

    # idle: every trigger answers 0 (not NaN, not empty): back to the minimum
    for t, result in zip(triggers, answers["idle"]):
        assert keda_reads(result, ignore_null_values=False) == 0, (t["name"], result)
    assert replicas_wanted(so, answers["idle"]) == spec["minReplicaCount"]

    # gone: nothing to read is an error, and the fallback holds the replicas; read as 0 it pinned the minimum
    for t, result in zip(triggers, answers["gone"]):
        assert result == [], (t["name"], result)
    assert replicas_wanted(so, answers["gone"]) == spec["fallback"]["replicas"] > spec["minReplicaCount"]
    assert replicas_wanted(so, answers["gone"], ignore_null_values=True) == spec["minReplicaCount"]
