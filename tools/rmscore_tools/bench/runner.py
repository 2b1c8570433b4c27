"""`rmscore bench` runs: K independent repetitions per configuration, each on freshly started servers.

A configuration is a server kind (which fixes transport and backend) and a batching policy. A
repetition starts the server(s) (`rmscore_tools.launch.start`, on 127.0.0.1, plaintext and without
auth tokens: the numbers are the servers', not TLS's), waits for SERVING, warms up, scores a fixed
parity set once (repetition 0), then runs the phases in order: closed loop at each concurrency
level, open loop, rollouts. Isolated mode: one server at a time. Contended mode: every kind of the
run at once (same batching policy), each phase started on all of them together.

Repetition r uses the same requests, arrivals and rollouts for every configuration (paired design),
and a different set from every other repetition.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import os
import pathlib
import signal
import subprocess
import sys
import time
from dataclasses import dataclass

import numpy as np

from rmscore_tools import caller, launch, loadgen
from rmscore_tools.host import machine_info
from rmscore_tools.bench.presets import BACKEND_OF, Settings
from rmscore_tools.workload import LengthMix, make_rollout

ROOT = launch.ROOT


@dataclass(frozen=True)
class Config:
    kind: str
    batching: str

    @property
    def id(self) -> str:
        return f"{self.kind}/{self.batching}"

    @property
    def backend(self) -> str:
        return BACKEND_OF[self.kind]

    @property
    def transport(self) -> str:
        return "http" if self.kind.startswith("py-http") else "grpc"

    def as_dict(self) -> dict:
        return {"id": self.id, "kind": self.kind, "backend": self.backend, "transport": self.transport,
                "batching": self.batching}


class _Progress:
    def __init__(self, total: int, enabled: bool):
        self.bar = None
        if enabled:
            from tqdm import tqdm

            self.bar = tqdm(total=total, desc="rmscore bench", unit="phase", file=sys.stderr, dynamic_ncols=True)

    def step(self, what: str, n: int = 1) -> None:
        if self.bar is not None:
            self.bar.set_postfix_str(what[:70])
            self.bar.update(n)

    def note(self, what: str) -> None:
        if self.bar is not None:
            self.bar.set_postfix_str(what[:70])
        else:
            print(f"[bench] {what}", file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


class Bench:
    def __init__(self, settings: Settings, out_dir: pathlib.Path, model: str = "models/default",
                 progress: bool = True, log=None):
        self.s = settings
        self.out = pathlib.Path(out_dir)
        self.model = model if pathlib.Path(model).is_absolute() else str((ROOT / model).resolve())
        self.progress = progress
        self.mix = LengthMix.parse(settings.lengths)
        self.wl = loadgen.Workload(self.mix, settings.chunk_size, settings.rollout_size)
        self.log = log or (lambda msg: print(f"[bench] {msg}", file=sys.stderr, flush=True))
        self.stopping = False

    def _on_signal(self, signum, frame) -> None:
        if self.stopping:
            raise KeyboardInterrupt
        self.stopping = True
        self.log(f"signal {signum}: finishing the current phase, then stopping the servers and writing the "
                 "report of what was measured (signal again to abort at once)")

    # ---- plan ---------------------------------------------------------------------------
    def configs(self) -> tuple[list[Config], list[dict]]:
        available = set(launch.built_kinds())
        skipped = [{"kind": k, "reason": f"not available here ({launch.CPP_BINARY} not built)"}
                   for k in self.s.kinds if k not in available]
        kinds = [k for k in self.s.kinds if k in available]
        return [Config(k, b) for b in self.s.batching for k in kinds], skipped

    def _phase_count(self) -> int:
        return 3 + len(self.s.concurrency) + 2  # start, warm-up, parity/closed..., open, rollouts

    # ---- run ----------------------------------------------------------------------------
    def run(self) -> dict:
        previous = {sig: signal.signal(sig, self._on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            return self._run()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def _run(self) -> dict:
        self.out.mkdir(parents=True, exist_ok=True)
        configs, skipped = self.configs()
        started = dt.datetime.now(dt.timezone.utc)
        record = {
            "format": "rmscore-bench/1",
            "meta": {**machine_info(), "started": started.isoformat(timespec="seconds"),
                     "load_avg_start": list(os.getloadavg()), "model": self.model,
                     "client": "rmscore_client", "length_mix": self.mix.describe()},
            "settings": self.s.as_dict(),
            "configs": [c.as_dict() for c in configs],
            "skipped": skipped,
            "sessions": [],
            "inproc": None,
        }
        for k in skipped:
            self.log(f"skipping {k['kind']}: {k['reason']}")
        self._save(record)
        if (self.s.inproc_runtimes or self.s.ablation) and not self.stopping:
            record["inproc"] = self.run_inproc()
            self._save(record)
        per_mode = {"isolated": len(configs), "contended": len(self.s.batching) if configs else 0}
        total = sum(per_mode[m] for m in self.s.modes) * self.s.repeats * self._phase_count()
        bar = _Progress(total, self.progress)
        try:
            for rep in range(self.s.repeats):
                for mode in self.s.modes:
                    groups = [[c] for c in configs] if mode == "isolated" else \
                        [[c for c in configs if c.batching == b] for b in self.s.batching]
                    # Rotate the order per repetition: drifting machine load then falls on every
                    # configuration in turn instead of always on the first one.
                    k = rep % len(groups) if groups else 0
                    groups = groups[k:] + groups[:k]
                    for group in groups:
                        if group and not self.stopping:
                            record["sessions"] += asyncio.run(self._group(group, mode, rep, bar))
                            self._save(record)
        finally:
            bar.close()
        if self.stopping:
            record["meta"]["interrupted"] = True
        record["meta"]["finished"] = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
        record["meta"]["load_avg_end"] = list(os.getloadavg())
        self._save(record)
        return record

    def _save(self, record: dict) -> None:
        path = self.out / "run.json"
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(record, indent=1, allow_nan=True))
        tmp.replace(path)

    def run_inproc(self) -> dict:
        spec = {**self.s.as_dict(), "model": self.model}
        spec_path, out_path, log_path = self.out / "inproc_spec.json", self.out / "inproc.json", self.out / "inproc.log"
        spec_path.write_text(json.dumps(spec))
        self.log(f"in-process baselines ({', '.join(self.s.inproc_runtimes) or 'none'}) and batching ablation "
                 f"({self.s.ablation_backend if self.s.ablation else 'off'}); log: {log_path}")
        t = time.perf_counter()
        with open(log_path, "w") as log:
            proc = subprocess.run([sys.executable, "-m", "rmscore_tools.bench.inproc", str(spec_path), str(out_path)],
                                  cwd=ROOT, stdout=log, stderr=None if self.progress else log)
        if proc.returncode != 0 or not out_path.exists():
            tail = log_path.read_text(errors="replace")[-2000:]
            self.log(f"in-process baselines failed (exit {proc.returncode}):\n{tail}")
            return {"error": f"exit {proc.returncode}", "log_tail": tail}
        result = json.loads(out_path.read_text())
        result["elapsed_s"] = time.perf_counter() - t
        return result

    # ---- one group of servers measured together ------------------------------------------
    async def _group(self, group: list[Config], mode: str, rep: int, bar: _Progress) -> list[dict]:
        s = self.s
        seed = s.seed * 1000 + rep
        sessions = []
        for c in group:
            sessions.append({"mode": mode, "rep": rep, "config": c.id, "kind": c.kind, "backend": c.backend,
                             "batching": c.batching, "transport": c.transport, "load_avg_start": list(os.getloadavg())})
        names = ", ".join(c.kind for c in group)
        bar.note(f"rep {rep + 1}/{s.repeats} {mode}: starting {names}")
        running = self._start(group, sessions)
        bar.step(f"rep {rep + 1} {mode}: started {names}")
        live = [(c, sess, srv) for c, sess, srv in zip(group, sessions, running) if srv is not None]
        try:
            if live:
                await self._measure(live, mode, rep, seed, bar)
            else:
                bar.step("no server", self._phase_count() - 1)
        finally:
            for c, sess, srv in zip(group, sessions, running):
                if srv is not None:
                    t = time.perf_counter()
                    sess["server"]["exit_code"] = srv.stop()
                    sess["server"]["stop_s"] = time.perf_counter() - t
                    sess["server"]["log_tail"] = srv.log()[-1500:] if sess["server"]["exit_code"] not in (0, None) \
                        else ""
                sess["load_avg_end"] = list(os.getloadavg())
        return sessions

    def _start(self, group: list[Config], sessions: list[dict]) -> list:
        flags = self.s.server_flags(group[0].batching)
        procs = []
        for c, sess in zip(group, sessions):
            t = time.perf_counter()
            sess["server"] = {"flags": flags}
            try:
                srv = launch.start(c.kind, ready_timeout_s=self.s.server_ready_timeout_s, wait_ready=False,
                                   model=self.model, **flags)
            except Exception as e:  # noqa: BLE001 - recorded; the run goes on without this server
                sess["server"]["error"] = str(e)[-1500:]
                srv = None
            procs.append((srv, t))
        running = []
        for (srv, t), sess, c in zip(procs, sessions, group):
            if srv is None:
                running.append(None)
                continue
            try:
                srv.wait_until_ready(time.monotonic() + self.s.server_ready_timeout_s)
                sess["server"]["ready_s"] = time.perf_counter() - t
                running.append(srv)
            except Exception as e:  # noqa: BLE001
                sess["server"]["error"] = str(e)[-1500:]
                srv.stop(10)
                running.append(None)
            if sess["server"].get("error"):
                self.log(f"{c.id}: server did not start: {sess['server']['error'][:300]}")
        return running

    async def _measure(self, live, mode: str, rep: int, seed: int, bar: _Progress) -> None:
        s = self.s
        requests = self.wl.requests(seed)
        rollouts = self.wl.rollouts(seed, s.rollouts_per_rep)
        conns = []
        for c, sess, srv in live:
            target = srv.base_url if c.transport == "http" else srv.target
            conns.append(caller.async_client(c.transport, target, chunk_size=s.chunk_size,
                                              timeout_s=s.rpc_timeout_s))
        tag = f"rep {rep + 1}/{s.repeats} {mode}"

        async def each(fn):
            return await asyncio.gather(*(fn(client) for client in conns))

        for c, sess, srv in live:
            sess["measured_from"] = time.time()
        warm_c = min(max(s.concurrency), 4)  # enough to warm every path without queueing a backlog
        try:
            warm = await each(lambda cl: loadgen.warmup(cl, requests, warm_c, s.warmup_s))
            for (c, sess, srv), w in zip(live, warm):
                sess["warmup"] = w
            bar.step(f"{tag}: warmed up")
            if rep == 0:
                parity = make_rollout(np.random.default_rng([s.seed, 99]), s.parity_set_size, self.mix)
                got = await each(lambda cl: _safe(loadgen.score_set(cl, parity)))
                for (c, sess, srv), g in zip(live, got):
                    sess["parity_scores"] = g
            bar.step(f"{tag}: parity set")
            for conc in s.concurrency:
                if self.stopping:
                    return
                res = await each(lambda cl: loadgen.closed_loop(cl, requests, conc, s.window_s, s.settle_s,
                                                                drain_timeout_s=s.rpc_timeout_s,
                                                                max_settle_s=s.rpc_timeout_s))
                for (c, sess, srv), r in zip(live, res):
                    sess.setdefault("closed", []).append(r)
                bar.step(f"{tag}: closed loop C={conc} " +
                         " ".join(f"{c.kind}={r['throughput_seq_s']:.1f}/s" for (c, _, _), r in zip(live, res)))
            if self.stopping:
                return
            res = await each(lambda cl: loadgen.open_loop(cl, requests, s.open_rate_seq_s, s.chunk_size, s.window_s,
                                                          seed, s.max_outstanding, drain_timeout_s=s.rpc_timeout_s))
            for (c, sess, srv), r in zip(live, res):
                sess["open"] = r
            bar.step(f"{tag}: open loop {s.open_rate_seq_s:g} seq/s")
            if self.stopping:
                return
            res = await each(lambda cl: loadgen.rollouts(cl, rollouts))
            for (c, sess, srv), r in zip(live, res):
                sess["rollout"] = r
            bar.step(f"{tag}: rollouts " + " ".join(f"{c.kind}={r['makespan_s_mean']:.2f}s"
                                                    for (c, _, _), r in zip(live, res)))
            for c, sess, srv in live:
                sess["measured_to"] = time.time()
        finally:
            for cl in conns:
                try:
                    await cl.close()
                except Exception:  # noqa: BLE001
                    pass


async def _safe(coro):
    try:
        return await coro
    except Exception as e:  # noqa: BLE001
        return {"error": f"{type(e).__name__}: {e}"[:500]}
