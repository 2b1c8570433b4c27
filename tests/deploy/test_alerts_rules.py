"""The alerts against what they rely on: the runbook (docs/alerts.md), the scrape set-ups that name
the servers' job `rmscore`, the compose services scraped by name, the one recorded definition of a
failed request, and a target down for longer than any lookback.

Static, but for one promtool run (seconds); tests/deploy/test_dashboards.py runs the alerts' unit
tests (docker/prometheus/alerts_test.yml) and tests/deploy/test_alerts_keda.py the autoscaler's
queries.
"""

from __future__ import annotations

import json
import pathlib
import re
import shutil
import subprocess

import pytest
import yaml

ROOT = pathlib.Path(__file__).resolve().parents[2]
PROM_DIR = ROOT / "docker" / "prometheus"
RULES, ALERTS = PROM_DIR / "rules.yml", PROM_DIR / "alerts.yml"
RUNBOOK = ROOT / "docs" / "alerts.md"
K8S = ROOT / "deploy" / "k8s"
DASHBOARDS = sorted((ROOT / "docker" / "grafana" / "dashboards").glob("*.json"))
METRICS = json.loads((ROOT / "server_py" / "rmscore" / "core" / "metrics.json").read_text())
RUNBOOK_PREFIX = "{{ with $externalLabels.runbook_base }}{{ . }}{{ end }}docs/alerts.md#"
FAILED_CODES = {"INTERNAL", "UNKNOWN", "DATA_LOSS", "DEADLINE_EXCEEDED"}
RETRIED_CODES = {"RESOURCE_EXHAUSTED", "UNAVAILABLE"}


def rules(path: pathlib.Path) -> list[dict]:
    return [r for g in yaml.safe_load(path.read_text())["groups"] for r in g["rules"]]


def alerts() -> list[dict]:
    return rules(ALERTS)


def github_anchor(heading: str) -> str:
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def runbook_sections() -> dict[str, str]:
    """'## X' heading -> the text under it, up to the next '## ' heading."""
    text = RUNBOOK.read_text()
    parts = re.split(r"^## (.+)$", text, flags=re.M)
    return {parts[i].strip(): parts[i + 1] for i in range(1, len(parts), 2)}


# ---------------------------------------------------------------------------
# the runbook


def test_every_alert_links_its_runbook_section():
    sections = runbook_sections()
    anchors = {github_anchor(h): h for h in sections}
    names = {a["alert"] for a in alerts()}
    for a in alerts():
        url = a["annotations"]["runbook_url"]
        assert url.startswith(RUNBOOK_PREFIX), f"{a['alert']}: {url!r}"
        anchor = url[len(RUNBOOK_PREFIX):]
        assert anchor == a["alert"].lower(), f"{a['alert']}: links #{anchor}"
        assert anchors.get(anchor) == a["alert"], f"{a['alert']}: docs/alerts.md has no section '## {a['alert']}'"
        body = sections[a["alert"]]
        assert "**Means.**" in body and "**Check" in body and "Do.**" in body, f"{a['alert']}: what it means, what to check, what to do"
    documented = {h for h in sections if h.startswith("Rmscore")}
    assert documented == names, f"runbook sections without an alert: {sorted(documented - names)}"


def test_runbook_states_the_slos_the_alerts_hold():
    slo = runbook_sections()["SLOs"]
    assert "Availability 99.9 %" in slo and "Latency 99 % within 2.566 s" in slo, slo[:300]
    by_name = {a["alert"]: a["expr"] for a in alerts()}
    for name, budget, burn in (("RmscoreErrorBudgetBurnFast", "0.001", "14.4"), ("RmscoreErrorBudgetBurnSlow", "0.001", "6"),
                               ("RmscoreLatencyBudgetBurnFast", "0.01", "14.4"), ("RmscoreLatencyBudgetBurnSlow", "0.01", "6")):
        expr = by_name[name]
        assert len(re.findall(rf"/ {re.escape(budget)} > {re.escape(burn)}\b", expr)) == 2, f"{name}: {expr}"
        assert re.search(r">= 100\b", expr), f"{name}: no minimum-traffic guard: {expr}"
        assert f"| `{name}` |" in slo, f"{name} is not in the SLO table"


# ---------------------------------------------------------------------------
# one definition of a failed request, one of a slow one


def test_one_recorded_definition_of_a_failed_and_of_a_slow_request():
    recorded = rules(RULES)
    failed = [r for r in recorded if ":rmscore_requests_failed:" in r["record"]]
    slow = [r for r in recorded if ":rmscore_request_latency_slow:" in r["record"]]
    assert {r["record"].rsplit("rate", 1)[1] for r in failed} == {"5m", "30m", "1h", "6h"}
    assert {r["record"].rsplit("rate", 1)[1] for r in slow} == {"5m", "30m", "1h", "6h"}
    for r in failed:
        (codes,) = re.findall(r'code=~"([^"]+)"', r["expr"])
        assert set(codes.split("|")) == FAILED_CODES, f"{r['record']}: {codes}"
    bounds = {b for r in slow for b in re.findall(r'le="([^"]+)"', r["expr"])}
    assert len(bounds) == 1, bounds
    (bound,) = bounds
    # the bound is one the servers export, written as both write it (Python's repr, C++'s shortest form)
    assert bound in {repr(b) for b in METRICS["bucket_sets"]["seconds"]}, bound
    # the alerts read the recorded definition, never a code list of their own that could drift from it
    for a in alerts():
        for codes in re.findall(r'code=~"([^"]+)"', a["expr"]):
            assert not set(codes.split("|")) & FAILED_CODES, f"{a['alert']} counts failures itself: {codes}"
            assert set(codes.split("|")) == RETRIED_CODES, f"{a['alert']}: {codes}"
    # and so do the dashboards' error-ratio panels
    for path in DASHBOARDS:
        d = json.loads(path.read_text())
        for p in d["panels"]:
            if p.get("title") == "Error ratio":
                (t,) = p["targets"]
                assert t["expr"].startswith("server_backend:rmscore_requests_failed:ratio_rate5m"), f"{path.name}: {t['expr']}"


# ---------------------------------------------------------------------------
# the job the scrape-target alerts read


def test_every_scrape_set_up_names_the_servers_job_rmscore():
    jobs = {m.group(1) for a in alerts() for m in re.finditer(r'job="([^"]+)"', a["expr"])}
    assert jobs == {"rmscore", "rmscore-expected"}, jobs
    compose = yaml.safe_load((PROM_DIR / "prometheus.yml").read_text())
    assert any(j["job_name"] == "rmscore" and j.get("dns_sd_configs") for j in compose["scrape_configs"])
    base = [o for f in sorted((K8S / "base").glob("*.yaml")) for o in yaml.safe_load_all(f.read_text()) if o]
    services = [o for o in base if o["kind"] == "Service"]
    pods = [o["spec"]["template"] for o in base if o["kind"] == "Deployment"]
    assert services and pods
    for name in ("servicemonitor.yaml", "podmonitor.yaml"):
        mon = yaml.safe_load((K8S / "monitoring" / name).read_text())
        label = mon["spec"]["jobLabel"]
        # the job is the value of that label on the Services (ServiceMonitor) or the pods (PodMonitor)
        for obj in services if mon["kind"] == "ServiceMonitor" else pods:
            assert obj["metadata"]["labels"][label] == "rmscore", f"{name}: job would be {obj['metadata']['labels'].get(label)!r}"
        (ep,) = mon["spec"]["endpoints" if mon["kind"] == "ServiceMonitor" else "podMetricsEndpoints"]
        set_by = {r["targetLabel"]: r["sourceLabels"] for r in ep["relabelings"]}
        assert set_by["namespace"] == ["__meta_kubernetes_namespace"] and set_by["pod"] == ["__meta_kubernetes_pod_name"], name


def test_compose_services_are_also_scraped_by_name():
    """Job rmscore-expected lists the default profile's server services, each on the port the rmscore job
    scrapes it on, and keeps no series but `up` (RmscoreServiceDown reads it)."""
    config = yaml.safe_load((PROM_DIR / "prometheus.yml").read_text())
    (rmscore,) = [j for j in config["scrape_configs"] if j["job_name"] == "rmscore"]
    ports = {n: sd["port"] for sd in rmscore["dns_sd_configs"] for n in sd["names"]}
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]
    default = {n for n in ports if not compose[n].get("profiles")}
    assert default and default != set(ports), "expected both default and gpu-profile server services"
    (expected,) = [j for j in config["scrape_configs"] if j["job_name"] == "rmscore-expected"]
    listed = {}
    for sc in expected["static_configs"]:
        (target,) = sc["targets"]
        listed[sc["labels"]["service"]] = target
    assert listed == {n: f"{n}:{ports[n]}" for n in default}
    (drop,) = expected["metric_relabel_configs"]
    assert drop == {"source_labels": ["__name__"], "regex": ".+", "action": "drop"}


# ---------------------------------------------------------------------------
# down longer than the 6 h of rmscore_build_info the old rule joined


def test_a_target_down_for_seven_hours_still_fires(tmp_path):
    if shutil.which("promtool") is None:
        pytest.skip("promtool is not installed (scripts/setup.sh installs the prometheus package)")
    spec = {
        "rule_files": [str(RULES), str(ALERTS)],
        "evaluation_interval": "1m",
        "tests": [{
            "interval": "1m",
            "input_series": [
                {"series": 'up{job="rmscore", instance="10.0.0.2:9100", service="cpp-grpc"}', "values": "1 0x420"},
                {"series": 'rmscore_build_info{job="rmscore", instance="10.0.0.2:9100", service="cpp-grpc", '
                           'server="cpp-grpc", backend="onnxruntime", device="cpu", model="m", version="1"}', "values": "1"},
            ],
            "alert_rule_test": [
                {"eval_time": t, "alertname": "RmscoreTargetDown", "exp_alerts": [{
                    "exp_labels": {"severity": "warning", "job": "rmscore", "instance": "10.0.0.2:9100", "service": "cpp-grpc"},
                    "exp_annotations": {"summary": "rmscore target 10.0.0.2:9100 (cpp-grpc) is down",
                                        "description": "Prometheus has failed to scrape 10.0.0.2:9100 (job rmscore) for 2 minutes.",
                                        "runbook_url": "docs/alerts.md#rmscoretargetdown"}}]}
                for t in ("5m", "6h5m", "7h")],
        }],
    }
    f = tmp_path / "long_test.yml"
    f.write_text(yaml.safe_dump(spec))
    r = subprocess.run(["promtool", "test", "rules", str(f)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
