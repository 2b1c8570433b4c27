"""The kill/restart scenario's client, run as a process of its own (`faults.kill_restart` starts it).

A rollout through rmscore_client with retries, on one grpc.aio (or httpx) loop in a fresh process: CI's
test process died of a segfault inside grpcio's aio client three times in this scenario, in each of the
arrangements that put it on a thread of a process already holding other tests' gRPC channels and
threads. Here the client is the only gRPC user of its process, as in a trainer, and if it ever dies the
scenario reports how instead of taking the test run down with it.

Protocol: one JSON document on stdin, {"target", "transport", "seqs", "chunk_size", "max_concurrency",
"timeout_s"}; on stdout, one JSON line per chunk answered, {"offset", "attempts", "t"} (t on
time.monotonic, the system-wide clock the parent reads too), then one last line {"scores": [...]} or
{"error": "CODE: message"}.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time

from rmscore_tools import loadgen


def _emit(obj: dict) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


async def _rollout(job: dict) -> list[float]:
    from rmscore_client import AsyncHttpRewardClient, AsyncRewardClient, RetryPolicy

    cls = AsyncRewardClient if job["transport"] == "grpc" else AsyncHttpRewardClient
    # Retries for as long as a restart can take (the compile kind warms up for minutes).
    retry = RetryPolicy(max_attempts=100_000, initial_backoff_s=0.05, max_backoff_s=1.0)
    c = cls(job["target"], chunk_size=job["chunk_size"], max_concurrency=job["max_concurrency"],
            timeout_s=job["timeout_s"], retry=retry)
    try:
        r = await c.score_ids(job["seqs"], on_chunk=lambda t: _emit(
            {"offset": t.offset, "attempts": t.attempts, "t": time.monotonic()}))
        return [float(s) for s in r.scores]
    finally:
        await c.close()


def main() -> int:
    job = json.load(sys.stdin)
    try:
        _emit({"scores": asyncio.run(_rollout(job))})
    except BaseException as e:  # noqa: BLE001 - the parent's figure, not a crash
        _emit({"error": f"{loadgen.error_code(e)}: {e}"})
    return 0


if __name__ == "__main__":
    sys.exit(main())
