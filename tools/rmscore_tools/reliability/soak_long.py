"""A long soak of several servers at once, with optional environment variants, as a plot.

`rmscore hardening` soaks each kind for minutes, one after another; telling a leak from
allocator settling takes tens of minutes, so this runs the servers side by side (the same
load on each, the same machine noise) and plots resident memory over time.

    python -m rmscore_tools.reliability.soak_long --kinds cpp-grpc,py-grpc-eager,py-grpc-compile --seconds 1200
    python -m rmscore_tools.reliability.soak_long --kinds py-grpc-eager --seconds 720 \\
        --variant onednn0:ONEDNN_PRIMITIVE_CACHE_CAPACITY=0 --variant arena2:MALLOC_ARENA_MAX=2
    python -m rmscore_tools.reliability.soak_long --plot-only docs/hardening/soak_long.json

Each server is started by rmscore_tools.reliability.faults (its flags) and soaked by faults.soak; a variant
starts one more server of each kind with the given environment. Writes OUT.json and OUT.png.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys
import threading

from rmscore_tools.host import ROOT


def parse_variant(text: str) -> tuple[str, dict[str, str]]:
    name, _, assigns = text.partition(":")
    pairs = [a.split("=", 1) for a in assigns.split(",") if a]
    if not name or not pairs or any(len(p) != 2 or not p[0] for p in pairs):
        raise argparse.ArgumentTypeError(f"--variant wants NAME:VAR=VALUE[,VAR=VALUE], got {text!r}")
    return name, dict(pairs)


def run(args) -> dict:
    from rmscore_tools.reliability import faults
    variants = [("default", {})] + list(args.variant)
    servers = {}
    try:
        for kind in args.kinds.split(","):
            for name, env in variants:
                saved = dict(os.environ)
                os.environ.update(env)  # the server inherits it; this process does not keep it
                try:
                    servers[f"{kind}@{name}"] = faults.start(kind)
                finally:
                    os.environ.clear()
                    os.environ.update(saved)
                print(f"soak_long: started {kind}@{name}", flush=True)
        out: dict = {}

        def one(label):
            def tick(t_s, total_s, count):
                if int(t_s) % 60 == 0 and t_s - int(t_s) < 0.5:
                    print(f"soak_long: {label} {t_s:.0f}/{total_s:.0f} s, {count['requests']} requests", flush=True)
            out[label] = faults.soak(servers[label], seconds=args.seconds, warmup_s=args.warmup_seconds,
                                     sample_every_s=args.sample_seconds, concurrency=args.concurrency, progress=tick)

        threads = [threading.Thread(target=one, args=(label,)) for label in servers]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return {"settings": {k: v for k, v in vars(args).items() if k != "variant"},
                "variants": {n: e for n, e in variants}, "loadavg_end": list(os.getloadavg()), "soaks": out}
    finally:
        for s in servers.values():
            s.stop(60)


def plot(record: dict, path: pathlib.Path) -> None:
    from rmscore_tools.reliability.hardening import rss_plot

    rss_plot(sorted(record["soaks"].items()), path, "Long soak: resident memory under steady load", minutes=True)


def table(record: dict) -> str:
    rows = ["| server | start MiB | end MiB | max MiB | growth | slope MiB/min | requests | errors |",
            "|---|---|---|---|---|---|---|---|"]
    for label, r in sorted(record["soaks"].items()):
        rows.append(f"| {label} | {r['rss_start_mb']:.0f} | {r['rss_end_mb']:.0f} | {r['rss_max_mb']:.0f} | "
                    f"{r['rss_growth_pct']:+.1f} % | {r['rss_slope_mb_per_min']:.1f} | {r['requests']} | "
                    f"{r['errors']} |")
    return "\n".join(rows)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kinds", default="cpp-grpc,py-grpc-eager,py-grpc-compile")
    ap.add_argument("--seconds", type=float, default=1800.0, help="measured soak (default: %(default)s)")
    ap.add_argument("--warmup-seconds", type=float, default=60.0, help="load before the first sample")
    ap.add_argument("--sample-seconds", type=float, default=15.0)
    ap.add_argument("--concurrency", type=int, default=4, help="closed-loop clients per server")
    ap.add_argument("--variant", type=parse_variant, action="append", default=[],
                    help="NAME:VAR=VALUE[,...]: one more server per kind with this environment")
    ap.add_argument("--out", default=str(ROOT / "docs/hardening/soak_long"), help="OUT.json and OUT.png")
    ap.add_argument("--plot-only", metavar="JSON", help="redraw the plot and table from a saved run")
    a = ap.parse_args()
    if a.plot_only:
        src = pathlib.Path(a.plot_only)
        record, out = json.loads(src.read_text()), src.with_suffix("")
    else:
        record, out = run(a), pathlib.Path(a.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.with_suffix(".json").write_text(json.dumps(record, indent=1))
    plot(record, out.with_suffix(".png"))
    print(table(record))
    print(f"soak_long: wrote {out.with_suffix('.png')}", file=sys.stderr)
    return 0 if all(r["errors"] == 0 for r in record["soaks"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
