"""The probing client, in a process of its own: `python -m rmscore_tools.reliability.prober
TRANSPORT TARGET INTERVAL_S TIMEOUT_S`. It prints `ready`, sends a probe (a good one-sequence Score
on a fresh connection, transport.PROBE_IDS) every INTERVAL_S until a line arrives on stdin, then
prints its results as one JSON list of [code, ms, detail].

Why a process: a probe timed inside the process that runs the attack waits for that process's GIL
behind the attackers' threads (encoding, sending, reading answers), and the figure then blames the
server (py-http, three floods of the small test's size: same process, 3 of 41 probes over 100 ms,
up to 345 ms; another process, 0 of 37). The issue's probes are other clients. What remains of the
tail is the server's own (docs/hardening.md, the work flood).
"""

from __future__ import annotations

import json
import sys
import threading
import time


def run(transport: str, target: str, interval_s: float, timeout_s: float, stop: threading.Event) -> list:
    from rmscore_tools import caller
    from rmscore_tools.reliability.faults import _probe_score
    from rmscore_tools.reliability.transport import PROBE_IDS

    results = []
    print("ready", flush=True)
    while not stop.is_set():
        # The client object is built first: its set-up (httpx makes an SSL context) is not the server's time.
        c = caller.Caller(transport, target, timeout_s=timeout_s)
        t0 = time.perf_counter()
        try:
            code, detail = _probe_score(c, PROBE_IDS, timeout_s=timeout_s)
        finally:
            c.close()
        ms = (time.perf_counter() - t0) * 1e3
        results.append([code, ms, detail if code != "OK" else ""])
        stop.wait(max(0.0, interval_s - ms / 1e3))
    return results


def main(argv: list[str]) -> None:
    transport, target, interval_s, timeout_s = argv[0], argv[1], float(argv[2]), float(argv[3])
    stop = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.readline(), stop.set()), daemon=True).start()
    print(json.dumps(run(transport, target, interval_s, timeout_s, stop)), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
