"""Prometheus metrics built from metrics.json, the one definition shared with the C++ server."""

from __future__ import annotations

import json
import pathlib
from typing import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector, disable_created_metrics

# The C++ server (prometheus-cpp) has no *_created series; keep the expositions alike.
disable_created_metrics()

SPEC = json.loads((pathlib.Path(__file__).parent / "metrics.json").read_text())
_TYPES = {"counter": Counter, "gauge": Gauge, "histogram": Histogram}


def buckets(spec: dict) -> list[float]:
    """A histogram's bucket bounds: its list, or the name of one of SPEC's "bucket_sets"."""
    b = spec["buckets"]
    return SPEC["bucket_sets"][b] if isinstance(b, str) else b


class Metrics:
    """Every metric of one server, with `server`, `backend` and `device` (its --device) already bound."""

    def __init__(self, server: str, backend: str, registry: CollectorRegistry | None = None, *, device: str = "cpu"):
        self.registry = registry or CollectorRegistry()
        # SPEC["process_metrics"]: CPU, memory, fds and start time, as the C++ server reads them from /proc.
        # (No PlatformCollector: python_info has no counterpart in the C++ server.)
        ProcessCollector(registry=self.registry)
        self._m = {}
        common = {"server": server, "backend": backend, "device": device}
        for spec in SPEC["metrics"]:
            labels = SPEC["common_labels"] + spec["labels"]
            kwargs = {"buckets": buckets(spec)} if spec["type"] == "histogram" else {}
            name = spec["name"]
            if spec["type"] == "counter":
                name = name.removesuffix("_total")  # prometheus_client appends _total itself
            family = _TYPES[spec["type"]](name, spec["help"], labels, registry=self.registry, **kwargs)
            # Bind the common labels; metrics without extra labels become plain children.
            self._m[spec["name"]] = (family, common, spec["labels"])
            if not spec["labels"]:
                family.labels(**common)
        # Labelled families are exported only once they hold a series: make the known
        # ones now, as the C++ server does, so every name is visible from the first scrape.
        for reason in ("deadline", "cancelled"):
            self._child("rmscore_sequences_dropped_total", reason=reason)
        self._child("rmscore_requests_total", code="OK")
        for fmt in ("pair", "one_segment"):  # /get_reward's formats; 0 on a kind without that route
            self._child("rmscore_get_reward_sequences_total", format=fmt)

    def _child(self, name: str, **extra):
        family, common, _ = self._m[name]
        return family.labels(**common, **extra)

    def request(self, code: str, seconds: float | None) -> None:
        self._child("rmscore_requests_total", code=code).inc()
        if seconds is not None:
            self._child("rmscore_request_latency_seconds").observe(seconds)

    # The batcher's metrics: the same names and arguments as server_cpp/src/metrics.h.
    def in_flight(self, delta: int) -> None:
        self._child("rmscore_requests_in_flight").inc(delta)

    def set_queue_depth(self, n: int) -> None:
        self._child("rmscore_queue_depth").set(n)

    def set_queue_expected_wait(self, seconds: float) -> None:
        self._child("rmscore_queue_expected_wait_seconds").set(seconds)

    def set_stalled_source(self, seconds: Callable[[], float]) -> None:
        """rmscore_batcher_stalled_seconds is `seconds()`, called at each scrape (core/liveness.py):
        a value set by the batcher would stop changing exactly when the batcher hangs."""
        self._child("rmscore_batcher_stalled_seconds").set_function(seconds)

    def set_queued_bytes_source(self, held: Callable[[], float]) -> None:
        """rmscore_queued_request_bytes is `held()`, read at each scrape (admission.py HeldBytes)."""
        self._child("rmscore_queued_request_bytes").set_function(held)

    def set_tokenize_queue_source(self, chars: Callable[[], float]) -> None:
        """rmscore_tokenize_queue_characters is `chars()`, read at each scrape (core/tokenizing.py
        TokenizePool.waiting_chars)."""
        self._child("rmscore_tokenize_queue_characters").set_function(chars)

    def set_queue_capacity(self, n: int) -> None:
        self._child("rmscore_queue_capacity_sequences").set(n)

    def batch_ran(self, seconds: float, size: int, padding_ratio: float) -> None:
        self._child("rmscore_batch_inference_seconds").observe(seconds)
        self._child("rmscore_batch_size").observe(size)
        self._child("rmscore_batch_padding_ratio").observe(padding_ratio)

    def sequences_scored(self, n: int) -> None:
        self._child("rmscore_sequences_scored_total").inc(n)

    def queue_wait(self, seconds: float) -> None:
        self._child("rmscore_queue_wait_seconds").observe(seconds)

    def sequences_dropped(self, reason: str, n: int) -> None:
        self._child("rmscore_sequences_dropped_total", reason=reason).inc(n)

    def recompiles(self, n: int) -> None:
        self._child("rmscore_recompiles_total").inc(n)

    def build_info(self, model: str, version: str) -> None:
        self._child("rmscore_build_info", model=model, version=version).set(1)
