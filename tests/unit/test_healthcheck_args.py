"""docker/healthcheck/healthcheck.py's arguments (the compose health checks run it): which services and
URLs it checks, in the spellings grpc_health_probe takes too. Checks are recorded, nothing is called."""

from __future__ import annotations

import importlib.util
import pathlib

import pytest

PATH = pathlib.Path(__file__).resolve().parents[2] / "docker" / "healthcheck" / "healthcheck.py"


@pytest.fixture
def hc(monkeypatch):
    spec = importlib.util.spec_from_file_location("healthcheck", PATH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    mod.calls = []
    mod.failing = set()

    def record(*args):
        mod.calls.append(args[:-1])  # the timeout aside
        return args[-2] not in mod.failing

    monkeypatch.setattr(mod, "check_grpc", record)
    monkeypatch.setattr(mod, "check_http", record)
    return mod


@pytest.mark.parametrize("args,checked", [
    (["grpc"], [("127.0.0.1:50051", "")]),
    (["grpc", "h:1"], [("h:1", "")]),
    (["grpc", "h:1", "--service", "liveness"], [("h:1", "liveness")]),
    (["grpc", "h:1", "--service=liveness"], [("h:1", "liveness")]),
    (["grpc", "h:1", "-service", "liveness"], [("h:1", "liveness")]),
    (["grpc", "h:1", "--service", "", "-service=liveness"], [("h:1", ""), ("h:1", "liveness")]),
    (["grpc", "h:1", "", "liveness"], [("h:1", ""), ("h:1", "liveness")]),
])
def test_grpc_checks_every_service_named(hc, args, checked):
    assert hc.main(args) == 0
    assert hc.calls == checked


def test_http_checks_every_url_and_fails_when_one_does(hc):
    assert hc.main(["http"]) == 0 and hc.calls == [("http://127.0.0.1:8000/readyz",)]
    hc.calls.clear()
    hc.failing.add("http://x/livez")
    assert hc.main(["http", "http://x/readyz", "http://x/livez"]) == 1
    assert hc.calls == [("http://x/readyz",), ("http://x/livez",)]


def test_grpc_fails_when_any_service_is_not_serving(hc):
    hc.failing.add("liveness")
    assert hc.main(["grpc", "h:1", "--service", "", "--service", "liveness"]) == 1


def test_a_service_flag_without_a_value_is_refused(hc):
    with pytest.raises(SystemExit, match="--service needs a value"):
        hc.main(["grpc", "h:1", "--service"])
