"""Writes contract/batching_vectors.json: the batching policy's shared test vectors.

The "hand" cases carry expectations worked out by hand from docs/batching.md;
the "generated" cases are random queues whose expectations come from the Python
reference planner, so that the C++ planner must reproduce it decision by
decision. Run it again only when the policy itself changes.
"""

import json
import pathlib
import random
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "server_py"))
from rmscore.core.admission import QueueWork  # noqa: E402
from rmscore.core.cost import CostTable  # noqa: E402
from rmscore.core.planner import COST_AWARE, MODES, PlannerConfig, Waiting, plan  # noqa: E402

SIZES, LENGTHS = [1, 2, 4, 8, 16, 32, 64], [16, 32, 64, 128, 256, 512]


def table(fn):
    return CostTable.make(SIZES, LENGTHS, [[fn(b, n) for n in LENGTHS] for b in SIZES]).to_json()


# CPU-like: a small fixed cost, and per-token cost that grows with the batch (caches): batch 1 wins.
CPU_TABLE = table(lambda b, n: 300 + 12 * b * n * (4 + b) // 4)
# GPU-like: a large fixed cost (launches, transfers) and cheap tokens: the biggest batch wins.
GPU_TABLE = table(lambda b, n: 5000 + 2 * b * n)
# Measured up to batch 2 and extrapolated linearly past it (as the warm-up extrapolates the sizes its
# budget left): batch 2 is cheaper per sequence than 1, and every larger batch exactly as cheap as 2.
FLAT_TABLE = table(lambda b, n: 15 * n + 60 if b == 1 else b * (10 * n + 40))
# Measured-looking noise: not monotone until CostTable.make makes it so.
NOISY_TABLE = {"batch_sizes": [1, 4, 16], "lengths": [16, 128],
               "cost_us": [[900, 2500], [800, 9000], [4000, 8000]]}


def case(name, cfg, now_us, waiting, expired=(), batch=(), wait_us=None):
    return {
        "name": name,
        "config": cfg,
        "now_us": now_us,
        "waiting": [dict(id=i, arrival_us=a, length=n, deadline_us=d) for i, a, n, d in waiting],
        "expect": {"expired": list(expired), "batch": list(batch), "wait_us": wait_us},
    }


def cfg(mode="length_aware", size=8, tokens=4096, delay_us=5000, cost=None, us_per_token=0.0, arrivals_per_s=0.0,
        max_batch_us=0):
    """`us_per_token`: the admission's rate, which keeps batches inside deadlines and `max_batch_us`
    (0: unknown). `arrivals_per_s`: the batcher's arrival rate; below one sequence per remaining delay,
    no wait (0: unknown). `max_batch_us`: the longest a batch of several may be expected to take (0: no bound)."""
    c = dict(mode=mode, max_batch_size=size, max_batch_tokens=tokens, max_queue_delay_us=delay_us,
             us_per_token=us_per_token, arrivals_per_s=arrivals_per_s, max_batch_us=max_batch_us)
    if mode == COST_AWARE:
        c["cost_table"] = cost
    return c


def _same_length(n, length=100, step=10):
    return [(i + 1, i * step, length, None) for i in range(n)]


HAND = [
    case("empty queue sleeps until an arrival", cfg(), 0, []),
    case("lone sequence waits out the delay", cfg(), 1000, [(1, 0, 10, None)], wait_us=4000),
    case("lone sequence goes when the delay is up", cfg(), 5000, [(1, 0, 10, None)], batch=[1]),
    case("zero delay dispatches at once", cfg(delay_us=0), 7, [(1, 7, 10, None)], batch=[1]),
    case("delay counts from the oldest", cfg(), 3000, [(1, 1000, 10, None), (2, 2500, 10, None)], wait_us=3000),
    case("full by count: length-aware picks the nearest length", cfg(size=2), 0,
         [(1, 0, 10, None), (2, 0, 50, None), (3, 0, 12, None)], batch=[1, 3]),
    case("full by count: fifo takes arrival order", cfg("fifo", size=2), 0,
         [(1, 0, 10, None), (2, 0, 50, None), (3, 0, 12, None)], batch=[1, 2]),
    case("token budget: length-aware skips the long one", cfg(tokens=250), 0,
         [(1, 0, 100, None), (2, 0, 400, None), (3, 0, 100, None)], batch=[1, 3]),
    case("token budget: fifo stops at the long one", cfg("fifo", tokens=250), 0,
         [(1, 0, 100, None), (2, 0, 400, None), (3, 0, 100, None)], batch=[1]),
    case("expired sequences are dropped first", cfg(), 6000,
         [(1, 0, 10, 6000), (2, 100, 10, None), (3, 200, 10, 9000)], expired=[1], batch=[2, 3]),
    case("all expired: nothing to run", cfg(), 10, [(1, 0, 10, 5), (2, 0, 10, 10)], expired=[1, 2]),
    case("the long oldest sequence is never starved", cfg(size=4, tokens=100000), 0,
         [(1, 0, 500, None), (2, 1, 10, None), (3, 2, 10, None), (4, 3, 10, None), (5, 4, 10, None), (6, 5, 10, None)],
         batch=[1, 4, 5, 6]),
    case("an oldest longer than the token budget runs alone", cfg(tokens=256), 0,
         [(1, 0, 512, None), (2, 0, 10, None)], batch=[1]),
    case("equal padding either way: the shorter neighbour wins", cfg(size=2), 0,
         [(1, 0, 20, None), (2, 0, 30, None), (3, 0, 10, None)], batch=[1, 3]),
    case("too little room for the cheaper longer one: take the shorter", cfg(size=8, tokens=81), 0,
         [(1, 0, 40, None), (2, 0, 41, None), (3, 0, 30, None)], batch=[1, 3]),
    case("not full and not due: wait even with several queued", cfg(size=8), 2000,
         [(1, 0, 10, None), (2, 1000, 20, None), (3, 1500, 30, None)], wait_us=3000),
    case("fifo not full and due: all of them", cfg("fifo"), 5000,
         [(1, 0, 10, None), (2, 1000, 300, None), (3, 1500, 30, None)], batch=[1, 2, 3]),
    case("exactly max_batch_size waiting: runs at once", cfg(size=3), 1000,
         [(1, 0, 10, None), (2, 100, 20, None), (3, 200, 30, None)], batch=[1, 2, 3]),
    case("fifo, exactly max_batch_size waiting: runs at once", cfg("fifo", size=3), 1000,
         [(1, 0, 10, None), (2, 100, 20, None), (3, 200, 30, None)], batch=[1, 2, 3]),
    case("token budget exactly filled: runs at once", cfg(tokens=200), 1000,
         [(1, 0, 100, None), (2, 100, 100, None)], batch=[1, 2]),
    case("one short of the size limit: waits", cfg(size=4), 1000,
         [(1, 0, 10, None), (2, 100, 20, None), (3, 200, 30, None)], wait_us=4000),
    case("cost, CPU-like: the oldest runs alone at once", cfg(COST_AWARE, size=8, cost=CPU_TABLE), 1000,
         _same_length(3), batch=[1]),
    case("cost, GPU-like: a short queue waits for more", cfg(COST_AWARE, size=64, tokens=65536, cost=GPU_TABLE), 1000,
         _same_length(3), wait_us=4000),
    case("cost, GPU-like: due, it runs what there is", cfg(COST_AWARE, size=64, tokens=65536, cost=GPU_TABLE), 5000,
         _same_length(3), batch=[1, 2, 3]),
    case("cost, GPU-like: the size limit reached runs at once",
         cfg(COST_AWARE, size=4, tokens=65536, cost=GPU_TABLE), 100, _same_length(6), batch=[1, 2, 3, 4]),
    case("cost, GPU-like: the token budget caps the batch",
         cfg(COST_AWARE, size=64, tokens=300, cost=GPU_TABLE), 100, _same_length(6), batch=[1, 2, 3]),
    case("cost, GPU-like: shorter sequences join the long oldest",
         cfg(COST_AWARE, size=64, tokens=65536, cost=GPU_TABLE), 5000,
         [(1, 0, 400, None), (2, 10, 20, None), (3, 20, 30, None)], batch=[1, 2, 3]),
    case("cost, CPU-like: a long oldest runs alone, not padded with the short",
         cfg(COST_AWARE, size=8, cost=CPU_TABLE), 0,
         [(1, 0, 400, None), (2, 10, 20, None), (3, 20, 30, None)], batch=[1]),
    # Equal throughput goes to the smaller batch: the same model time per sequence, answered sooner, and
    # the other workers not left idle behind one long batch (a rollout's makespan: docs/batching.md).
    case("cost: among equally cheap sizes the smaller wins, and runs at once",
         cfg(COST_AWARE, size=64, tokens=65536, cost=FLAT_TABLE), 100, _same_length(6), batch=[1, 2]),
    # A batch is worth what its sequences would cost in the best batches of their own lengths: padding a
    # 20-token sequence to 100 costs 520 us more here, against the 240 us it costs among its own length,
    # so the 100 runs alone (counting sequences, the pair won: 2 / 2080 > 1 / 1560). A partner of
    # nearly its length still joins.
    case("cost: padding is waste: a long oldest does not take a much shorter partner",
         cfg(COST_AWARE, size=8, cost=FLAT_TABLE), 5000, [(1, 0, 100, None), (2, 10, 20, None)], batch=[1]),
    case("cost: padding is waste: a partner of nearly its length joins",
         cfg(COST_AWARE, size=8, cost=FLAT_TABLE), 5000, [(1, 0, 100, None), (2, 10, 90, None)], batch=[1, 2]),
    # Deadlines cap a batch by the measured rate (1000 us per padded token here): a 4-token request
    # due in 2 s joins only as many 512-token sequences as end in time, and runs at once.
    case("deadline: the batch ends before its earliest deadline", cfg(size=16, tokens=8192, us_per_token=1000.0),
         1000, [(1, 0, 4, 2_000_000)] + [(i, 10 * i, 512, None) for i in range(2, 17)], batch=[1, 2, 3]),
    case("deadline: fifo is capped alike", cfg("fifo", size=16, tokens=8192, us_per_token=1000.0),
         1000, [(1, 0, 4, 2_000_000)] + [(i, 10 * i, 512, None) for i in range(2, 17)], batch=[1, 2, 3]),
    case("deadline: no rate measured, no cap", cfg(size=16, tokens=8192), 1000,
         [(1, 0, 4, 2_000_000)] + [(i, 10 * i, 512, None) for i in range(2, 17)], batch=list(range(1, 17))),
    case("deadline: the oldest runs alone even past it", cfg(size=16, tokens=8192, us_per_token=1000.0), 1000,
         [(1, 0, 512, 101_000), (2, 10, 512, None)], batch=[1]),
    # The wait for partners happens only when one is expected before the delay ends.
    case("arrivals: a lone sequence with no partner expected runs at once", cfg(arrivals_per_s=100.0), 1000,
         [(1, 0, 10, None)], batch=[1]),
    case("arrivals: with partners expected it waits", cfg(arrivals_per_s=1000.0), 1000, [(1, 0, 10, None)],
         wait_us=4000),
    case("arrivals: exactly one expected still waits", cfg(arrivals_per_s=250.0), 1000, [(1, 0, 10, None)],
         wait_us=4000),
    case("arrivals: the expectation shrinks with the wait left", cfg(arrivals_per_s=250.0), 2000,
         [(1, 0, 10, None)], batch=[1]),
    case("arrivals: cost, GPU-like, few arriving: what there is runs now",
         cfg(COST_AWARE, size=64, tokens=65536, cost=GPU_TABLE, arrivals_per_s=50.0), 1000, _same_length(3),
         batch=[1, 2, 3]),
    case("arrivals: cost, GPU-like, thousands arriving: waits to fill",
         cfg(COST_AWARE, size=64, tokens=65536, cost=GPU_TABLE, arrivals_per_s=5000.0), 1000, _same_length(3),
         wait_us=4000),
    case("deadline: cost_aware stops growing at it", cfg(COST_AWARE, size=64, tokens=65536, cost=GPU_TABLE,
                                                         us_per_token=1000.0), 100,
         [(1, 0, 100, 400_100)] + [(i + 1, i * 10, 100, None) for i in range(1, 6)], batch=[1, 2, 3, 4]),
    # The batch time bound, by the same rate (100 us per padded token here): 512-token sequences stop at
    # 4 (204.8 ms within 250 ms; 5 would take 256 ms), and the batch runs at once, as a full one does.
    case("batch time: cost_aware grows only while the batch stays within it",
         cfg(COST_AWARE, size=32, tokens=16384, cost=GPU_TABLE, us_per_token=100.0, max_batch_us=250_000), 100,
         [(i, i * 10, 512, None) for i in range(1, 17)], batch=[1, 2, 3, 4]),
    case("batch time: length_aware alike", cfg(size=32, tokens=16384, us_per_token=100.0, max_batch_us=250_000), 100,
         [(i, i * 10, 512, None) for i in range(1, 17)], batch=[1, 2, 3, 4]),
    case("batch time: the oldest runs alone past it", cfg(size=32, tokens=16384, us_per_token=100.0, max_batch_us=10_000),
         100, [(1, 0, 512, None), (2, 10, 512, None)], batch=[1]),
    case("batch time: no rate measured, no bound", cfg(size=32, tokens=16384, max_batch_us=10_000), 10_000,
         [(1, 0, 512, None), (2, 10, 512, None)], batch=[1, 2]),
]


def admission_case(name, expect_code, *, workers=1, max_wait_us=60_000_000, seed=0.0, observe=(), tokens=0,
                   running=0, now_us=1_000_000, deadline_us=None, max_batch_us=0, own_batch_tokens=0,
                   queued_before_last=None):
    """One admission decision (core/admission.py), its message from the Python reference; the
    intended code is written by hand and checked here."""
    w = QueueWork(workers, max_wait_us, seed, max_batch_us)
    for batch_us, n in observe:
        w.observe(batch_us, n)
    w.add(tokens)
    w.batch_started(running)
    r = w.refusal(now_us, deadline_us, None, own_batch_tokens, queued_before_last)
    code = "OK" if r is None else r.code.name
    assert code == expect_code, (name, code, r)
    return {"name": name, "workers": workers, "max_wait_us": max_wait_us, "seed_us_per_token": seed,
            "observe": [list(o) for o in observe], "tokens": tokens, "running": running, "now_us": now_us, "deadline_us": deadline_us,
            "max_batch_us": max_batch_us, "own_batch_tokens": own_batch_tokens, "queued_before_last": queued_before_last,
            "expect": {"code": code, "message": "" if r is None else r.message, "wait_us": w.wait_us()}}


ADMISSION = [
    admission_case("nothing measured yet: accepted", "OK", tokens=10**7, deadline_us=1_000_001),
    admission_case("an idle server accepts even a past deadline", "OK", seed=10.0, deadline_us=5),
    admission_case("queued work past the bound: refused", "RESOURCE_EXHAUSTED", seed=100.0, tokens=700_000),
    admission_case("two workers halve the wait", "OK", workers=2, seed=100.0, tokens=700_000),
    admission_case("bound 0: no bound", "OK", max_wait_us=0, seed=100.0, tokens=10**8),
    admission_case("the wait outlasts the deadline: refused", "DEADLINE_EXCEEDED", seed=100.0, tokens=20_000,
                   deadline_us=2_500_000),
    admission_case("the deadline outlasts the wait: accepted", "OK", seed=100.0, tokens=20_000, deadline_us=3_500_000),
    admission_case("the bound is checked before the deadline", "RESOURCE_EXHAUSTED", seed=100.0, tokens=700_000,
                   deadline_us=1_000_100),
    admission_case("observed batches set and move the rate", "DEADLINE_EXCEEDED", observe=[(1000, 10), (2000, 10)],
                   tokens=1000, deadline_us=1_100_000),
    admission_case("a past deadline behind queued work", "DEADLINE_EXCEEDED", seed=3.0, tokens=1000, deadline_us=0),
    admission_case("a running batch is work ahead: refused", "DEADLINE_EXCEEDED", seed=100.0, running=20_000,
                   deadline_us=2_500_000),
    admission_case("queued and running work add up: refused", "DEADLINE_EXCEEDED", seed=100.0, tokens=10_000,
                   running=10_000, deadline_us=2_500_000),
    admission_case("its own batch counts against the deadline: refused", "DEADLINE_EXCEEDED", seed=100.0,
                   tokens=20_000, deadline_us=3_500_000, own_batch_tokens=5_100),
    admission_case("its own batch fits before the deadline: accepted", "OK", seed=100.0, tokens=20_000,
                   deadline_us=3_500_000, own_batch_tokens=4_000),
    admission_case("its own batch is at most the batch time bound: accepted", "OK", seed=100.0, tokens=20_000,
                   deadline_us=3_500_000, own_batch_tokens=8_192, max_batch_us=500_000),
    admission_case("its own batch is not work ahead: no bound refuses it", "OK", seed=100.0, max_wait_us=1_000_000,
                   tokens=9_000, own_batch_tokens=8_192),
    admission_case("empty batches are not observed", "OK", observe=[(0, 10), (500, 0)], tokens=10**6,
                   deadline_us=1_000_001),
    # A request of several sequences (queued_before_last: what ranks before its last one, its own included).
    admission_case("the deadline is held to its last sequence: refused", "DEADLINE_EXCEEDED", seed=100.0,
                   tokens=1_000, deadline_us=1_500_000, own_batch_tokens=512, queued_before_last=8_680),
    admission_case("its last sequence fits before the deadline: accepted", "OK", seed=100.0, tokens=1_000,
                   deadline_us=2_000_000, own_batch_tokens=512, queued_before_last=8_680),
    admission_case("the work bound reads only the work ahead of its first", "OK", seed=100.0,
                   max_wait_us=500_000, tokens=1_000, own_batch_tokens=512, queued_before_last=100_000),
    admission_case("an idle server refuses a request its deadline cannot hold", "DEADLINE_EXCEEDED", seed=100.0,
                   deadline_us=1_500_000, own_batch_tokens=512, queued_before_last=7_680),
    admission_case("an idle server accepts a request its deadline holds", "OK", seed=100.0,
                   deadline_us=2_000_000, own_batch_tokens=512, queued_before_last=7_680),
]


def cost_queries():
    """batch_us of each table at grid points, between them, below and past them."""
    points = [(1, 16), (1, 1), (3, 100), (5, 16), (64, 512), (100, 600), (7, 700), (2, 48), (48, 200)]
    return [{"table": t, "queries": [[b, n, CostTable.from_json(t).batch_us(b, n)] for b, n in points]}
            for t in (CPU_TABLE, GPU_TABLE, NOISY_TABLE)]


def generated(n_cases=300, seed=20261202, timed=False, paced=False, capped=False):
    """Random queues; `timed`: with a rate (and more deadlines), so batches are cut by deadlines;
    `paced`: with an arrival rate, so some waits become dispatches; `capped`: with a rate and a batch
    time bound."""
    rng = random.Random(seed)
    out = []
    for k in range(n_cases):
        mode = MODES[k % len(MODES)]
        cost = [CPU_TABLE, GPU_TABLE][(k // len(MODES)) % 2]
        c = cfg(mode, rng.choice([1, 2, 4, 8, 16, 64]), rng.choice([64, 512, 2048, 4096, 16384]),
                rng.choice([0, 1000, 5000, 20000]), cost, rng.choice([0.5, 2.0, 10.0, 40.0]) if timed else 0.0)
        if paced:
            c["arrivals_per_s"] = rng.choice([20.0, 200.0, 1000.0, 20000.0])
        if capped:
            c["us_per_token"] = rng.choice([0.5, 2.0, 10.0, 40.0])
            c["max_batch_us"] = rng.choice([0, 2000, 5000, 20000])
        now = rng.randint(0, 30000)
        waiting = []
        t = 0
        for i in range(rng.randint(0, 40)):
            t += rng.randint(0, 2000)
            length = min(512, max(1, int(rng.lognormvariate(4.5, 0.9))))
            deadline = rng.choice([None, rng.randint(0, 60000)] if timed else [None, None, None, rng.randint(0, 60000)])
            waiting.append((i + 1, t, length, deadline))
        d = plan([Waiting(*w) for w in waiting], now,
                 PlannerConfig(c["max_batch_size"], c["max_batch_tokens"], c["max_queue_delay_us"], mode, c["max_batch_us"]),
                 CostTable.from_json(cost) if mode == COST_AWARE else None, c["us_per_token"], c["arrivals_per_s"])
        kind = "timed " if timed else "paced " if paced else "capped " if capped else ""
        out.append(case(f"generated {kind}{k}", c, now, waiting, d.expired, d.batch, d.wait_us))
    return out


if __name__ == "__main__":
    path = pathlib.Path(__file__).parent / "batching_vectors.json"
    doc = {"_comment": __doc__.strip(), "hand": HAND, "generated": generated(n_cases=450) + generated(150, 20261204, timed=True)
           + generated(150, 20261205, paced=True) + generated(150, 20261206, capped=True),
           "cost_tables": cost_queries(), "admission": ADMISSION}
    path.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {len(HAND)} hand, {len(doc['generated'])} generated and {len(ADMISSION)} admission cases to {path}")
