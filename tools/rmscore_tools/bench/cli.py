"""`rmscore bench`: repeated independent runs against freshly started servers, with CIs and plots.

    rmscore bench --preset tiny --out /tmp/bench          # seconds of measuring: checks the machinery
    rmscore bench --preset short --out docs/bench/short   # minutes per server kind
    rmscore bench --preset full --out bench-full          # the real run
    rmscore bench --report-only bench-full/run.json       # redo report and plots from the JSON
    rmscore bench --overhead --preset short --out runs/cpp_bench   # the C++ serving overhead
    rmscore bench --scheduling --out runs/scheduling              # servers vs the best in-process plan
    rmscore bench --planning --out runs/planning                  # one batching decision at 4096 queued
    rmscore bench --client-cost --out runs/client-cost            # the client's own cost at one in flight

Writes OUT/run.json (every repetition, every latency, and the summary), OUT/report.md and the PNG
plots next to it. docs/benchmark.md explains each figure. With --overhead, instead: the C++
server's serving overhead against the C++ in-process driver and C++ vs Python ONNX Runtime on
identical full batches (OUT/overhead.json, OUT/overhead.md, docs/cpp_bench.md).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys

from rmscore_tools.args import comma_list
from rmscore_tools.bench.presets import ALL_KINDS, BATCHING, MODES, PRESETS, RUNTIMES


def add_parsers(sub) -> None:
    p = sub.add_parser("bench", help="benchmark every server kind: K repetitions, 95%% CIs, report and plots",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", choices=sorted(PRESETS), default="short", help="sizes of everything (default: %(default)s)")
    p.add_argument("--out", default="bench-out", help="output directory (default: %(default)s)")
    p.add_argument("--model", default="models/default", help="model repository (default: %(default)s)")
    p.add_argument("--kinds", type=comma_list(), help=f"server kinds, comma-separated, from {', '.join(ALL_KINDS)}")
    p.add_argument("--batching", type=comma_list(), help=f"batching policies: {', '.join(BATCHING)}")
    p.add_argument("--modes", type=comma_list(), help=f"{', '.join(MODES)}")
    p.add_argument("--repeats", type=int, help="K, independent repetitions per configuration (>= 2 for a CI)")
    p.add_argument("--warmup-s", type=float, help="warm-up seconds per server start")
    p.add_argument("--window-s", type=float, help="measured seconds per closed-loop level and for the open loop")
    p.add_argument("--settle-s", type=float, help="unmeasured seconds at the start of each closed-loop level")
    p.add_argument("--concurrency", type=comma_list(int), help="closed-loop concurrency levels, e.g. 1,4,16")
    p.add_argument("--open-rate", type=float, dest="open_rate_seq_s", help="open-loop offered load, sequences/s")
    p.add_argument("--chunk-size", type=int, help="sequences per request (RPC)")
    p.add_argument("--rollout-size", type=int, help="sequences per rollout")
    p.add_argument("--rollouts", type=int, dest="rollouts_per_rep", help="rollouts scored per repetition")
    p.add_argument("--lengths", help="length mix: lognormal:MEDIAN:SIGMA:MIN:MAX, uniform:MIN:MAX or fixed:N")
    p.add_argument("--threads", type=int, dest="intra_op_threads", help="intra-op threads of every runtime")
    p.add_argument("--inter-op-threads", type=int, help="inter-op threads of every runtime")
    p.add_argument("--inproc", type=comma_list(), dest="inproc_runtimes",
                   help=f"in-process runtime baselines ({', '.join(RUNTIMES)}; 'none' for none)")
    p.add_argument("--no-ablation", action="store_true", help="skip the in-process batching ablation")
    p.add_argument("--seed", type=int)
    p.add_argument("--note", action="append", default=[], help="a line for the report (repeatable)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--report-only", metavar="RUN_JSON", help="rewrite report and plots from a run.json "
                   "(or overhead.md from an overhead.json)")
    p.add_argument("--overhead", action="store_true",
                   help="the C++ serving-overhead study (docs/cpp_bench.md); kinds from cpp-grpc, py-grpc-onnxruntime")
    p.add_argument("--scheduling", action="store_true",
                   help="each kind against the best in-process plan of its runtime, one sequence per request "
                        "(bench/scheduling.py)")
    p.add_argument("--configs", type=comma_list(),
                   help="--scheduling: configurations, `default` (each kind's defaults) or POLICY:WORKERS "
                        "(default: default,length_aware:1,cost_aware:auto)")
    p.add_argument("--planning", action="store_true",
                   help="one batching decision's time with 4096 sequences queued, Python and C++, the queue rebuilt "
                        "against the kept index (bench/planning.py): OUT/planning.md")
    p.add_argument("--client-cost", action="store_true",
                   help="what rmscore_client adds to a call at one in flight, beside the bare aiohttp, httpx and "
                        "grpc.aio clients (bench/client_cost.py): OUT/client_cost.md")
    p.add_argument("--precision", action="store_true",
                   help="each graph precision of --model beside fp32: throughput ratio with intervals and the "
                        "manifest's ranking figures, OUT/precision.md and OUT/precision.png (docs/precision.md)")
    p.set_defaults(func=main)


def settings_from(args):
    s = PRESETS[args.preset]
    inproc = args.inproc_runtimes
    if inproc is not None and inproc in (("none",), ()):
        inproc = ()
    s = s.with_(kinds=args.kinds, batching=args.batching, modes=args.modes, repeats=args.repeats,
                warmup_s=args.warmup_s, window_s=args.window_s, settle_s=args.settle_s, concurrency=args.concurrency,
                open_rate_seq_s=args.open_rate_seq_s, chunk_size=args.chunk_size, rollout_size=args.rollout_size,
                rollouts_per_rep=args.rollouts_per_rep, lengths=args.lengths, intra_op_threads=args.intra_op_threads,
                inter_op_threads=args.inter_op_threads, inproc_runtimes=inproc, seed=args.seed,
                notes=tuple(args.note) or None)
    if args.no_ablation:
        s = s.with_(ablation=False)
    problems = []
    problems += [f"--kinds: unknown kind {k!r}" for k in s.kinds if k not in ALL_KINDS]
    problems += [f"--batching: unknown policy {b!r}" for b in s.batching if b not in BATCHING]
    problems += [f"--modes: unknown mode {m!r}" for m in s.modes if m not in MODES]
    problems += [f"--inproc: unknown runtime {r!r}" for r in s.inproc_runtimes if r not in RUNTIMES]
    if s.repeats < 1:
        problems.append(f"--repeats: must be >= 1, got {s.repeats}")
    if any(c < 1 for c in s.concurrency) or not s.concurrency:
        problems.append(f"--concurrency: levels must be >= 1, got {s.concurrency}")
    if s.window_s <= 0 or s.open_rate_seq_s <= 0 or s.chunk_size < 1 or s.rollout_size < 1:
        problems.append("--window-s and --open-rate must be > 0, --chunk-size and --rollout-size >= 1")
    from rmscore_tools.workload import LengthMix

    try:
        LengthMix.parse(s.lengths)
    except ValueError as e:
        problems.append(f"--lengths: {e}")
    if problems:
        raise SystemExit("rmscore bench: " + "; ".join(problems))
    return s


def write_outputs(record: dict, out_dir: pathlib.Path) -> dict:
    from rmscore_tools.bench import report
    from rmscore_tools.bench.summary import summarise

    summary = summarise(record)
    record["summary"] = summary
    (out_dir / "run.json").write_text(json.dumps(record, indent=1))
    (out_dir / "report.md").write_text(report.markdown(record, summary))
    report.plots(record, summary, out_dir)
    return summary


def report_only(arg: str) -> int:
    path = pathlib.Path(arg)
    path = path / "run.json" if path.is_dir() else path
    record = json.loads(path.read_text())
    if record.get("format", "").startswith("rmscore-bench-overhead"):
        from rmscore_tools.bench import overhead

        overhead.write(record, path.parent)
        print(f"rmscore bench: wrote {path.parent / 'overhead.md'}")
        return 0
    write_outputs(record, path.parent)
    print(f"rmscore bench: wrote {path.parent / 'report.md'} and plots")
    return 0


def main_overhead(args, settings) -> int:
    from rmscore_tools.bench import overhead

    model = pathlib.Path(args.model)
    model = str(model if model.is_absolute() else (overhead.ROOT / model).resolve())
    kinds = list(args.kinds or overhead.KINDS)
    bad = [k for k in kinds if k not in overhead.KINDS]
    if bad:
        raise SystemExit(f"rmscore bench --overhead: --kinds {bad} not in {', '.join(overhead.KINDS)}")
    why = overhead.missing(kinds)
    if why:
        print(f"rmscore bench --overhead: {why}", file=sys.stderr)
        return 2
    record = overhead.run(settings, pathlib.Path(args.out), model, kinds)
    print(overhead.markdown(record))
    return 0


def main_scheduling(args, settings) -> int:
    from rmscore_tools.bench import scheduling

    kinds = list(args.kinds or scheduling.KINDS)
    configs = list(args.configs or scheduling.CONFIGS)
    bad = [c for c in configs if c != scheduling.DEFAULT and
           (c.count(":") != 1 or c.split(":")[0] not in ("fifo", "length_aware", "cost_aware"))]
    if bad:
        raise SystemExit(f"rmscore bench --scheduling: --configs {bad}: expected default or POLICY:WORKERS, "
                         "e.g. cost_aware:auto")
    model = str(pathlib.Path(args.model).resolve())
    record = scheduling.run(settings, pathlib.Path(args.out), model, kinds, configs)
    print(scheduling.markdown(record))
    return 0


def main(args) -> int:
    if args.report_only:
        return report_only(args.report_only)
    if args.precision:
        from rmscore_tools.bench import precision

        return precision.main(args.model, args.out, args.repeats or 5, args.intra_op_threads or 2,
                              args.rollout_size or 128)
    if args.client_cost:
        from rmscore_tools.bench import client_cost

        print(client_cost.markdown(client_cost.run(pathlib.Path(args.out), rounds=args.repeats or 5)))
        return 0
    if args.planning:
        from rmscore_tools.bench import planning

        print(planning.markdown(planning.run(pathlib.Path(args.out), repeats=args.repeats or 5)))
        return 0
    settings = settings_from(args)
    if args.overhead:
        return main_overhead(args, settings)
    if args.scheduling:
        return main_scheduling(args, settings)
    from rmscore_tools.bench.runner import Bench

    out = pathlib.Path(args.out)
    bench = Bench(settings, out, model=args.model, progress=not args.no_progress)
    record = bench.run()
    write_outputs(record, out)
    sessions = record["sessions"]
    failed = [x for x in sessions if (x.get("server") or {}).get("error")]
    print(f"rmscore bench: {len(sessions)} server sessions ({len(failed)} failed to start), "
          f"report {out / 'report.md'}", file=sys.stderr)
    if sessions and len(failed) == len(sessions):
        return 1
    return 0
