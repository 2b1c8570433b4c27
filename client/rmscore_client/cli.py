"""`rmscore score` and `rmscore info`: the client from the command line.

    rmscore score --target 127.0.0.1:50051 --input rollouts.jsonl --output scores.jsonl
    rmscore score --http --target 127.0.0.1:8000 --input rollouts.jsonl --output scores.jsonl
    rmscore info --target ipv4:127.0.0.1:5001,127.0.0.1:5002
    rmscore score --target rm.internal:50051 --tls-ca-file ca.pem --auth-token-file token ...

Each input line is `{"tokens": [...]}` or `{"prompt": "...", "response": "..."}` (text is
tokenized here with the model's own tokenizer). Each output line is `{"index": i, "score": s}`,
in input order. A summary (sequences/s, per-request latency p50/p95/p99) goes to stderr.
"""

from __future__ import annotations

import json
import sys
import time


def _client_args(p) -> None:
    p.add_argument("--target", required=True,
                   help="gRPC target (HOST:PORT, ipv4:H1:P1,H2:P2, dns:///NAME:PORT) or, with --http, "
                        "the FastAPI server's URL or HOST:PORT")
    p.add_argument("--http", action="store_true", help="talk to the FastAPI server (JSON over HTTP)")
    p.add_argument("--timeout", type=float, default=30.0, help="deadline per request in seconds, retries "
                   "included (default: %(default)s)")
    p.add_argument("--retries", type=int, default=5, help="attempts per request on UNAVAILABLE / "
                   "RESOURCE_EXHAUSTED (default: %(default)s)")
    p.add_argument("--tls", action="store_true", help="speak TLS, verified against the system's roots")
    p.add_argument("--tls-ca-file", default=None, help="speak TLS, verified against this PEM file alone "
                   "(implies --tls)")
    p.add_argument("--auth-token-file", default=None, help="file holding the servers' shared bearer token "
                   "(a file, so the token never shows in ps)")


def add_parsers(sub) -> None:
    p = sub.add_parser("score", help="score a JSONL file of rollouts against a running server")
    _client_args(p)
    p.add_argument("--input", required=True, help="JSONL: {\"tokens\": [...]} or {\"prompt\": .., \"response\": ..}"
                   " per line ('-': stdin)")
    p.add_argument("--output", required=True, help="JSONL of {\"index\", \"score\"} in input order ('-': stdout)")
    p.add_argument("--chunk-size", type=int, default=64, help="sequences per request (default: %(default)s)")
    p.add_argument("--max-concurrency", type=int, default=8, help="requests in flight (default: %(default)s)")
    p.add_argument("--truncation", choices=["none", "left", "right"], default="none",
                   help="what the server does with a sequence over max_sequence_length (default: %(default)s)")
    p.add_argument("--tokenizer", default=None, help="local tokenizer.json (default: the server's)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=score_main)

    p = sub.add_parser("info", help="print a server's model info and health")
    _client_args(p)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=info_main)


def read_token_file(path: str) -> str:
    """The token in `path`, surrounding whitespace stripped (as the servers read theirs)."""
    try:
        token = open(path, "rb").read().strip(b" \t\r\n\f\v")
    except OSError as e:
        raise ValueError(f"--auth-token-file: cannot read the file, got {path!r} ({e.strerror})") from None
    if not token:
        raise ValueError(f"--auth-token-file: the file holds no token, got {path!r}")
    try:
        return token.decode("ascii")
    except UnicodeDecodeError:
        raise ValueError(f"--auth-token-file: the token must be printable ASCII without spaces, got {path!r}") \
            from None


def _make_client(args, **kw):
    from .sync import HttpRewardClient, RewardClient
    from .types import RetryPolicy

    kw.update(timeout_s=args.timeout, retry=RetryPolicy(max_attempts=max(args.retries, 1)),
              tls=args.tls, tls_ca_file=args.tls_ca_file,
              auth_token=read_token_file(args.auth_token_file) if args.auth_token_file else None)
    if args.http:
        scheme = "https" if args.tls or args.tls_ca_file else "http"
        url = args.target if "://" in args.target else f"{scheme}://{args.target}"
        return HttpRewardClient(url, **kw)
    return RewardClient(args.target, **kw)


class InputError(Exception):
    pass


def read_jsonl(f) -> list[dict]:
    records = []
    for lineno, line in enumerate(f, 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as e:
            raise InputError(f"line {lineno}: not JSON: {e}") from None
        if not isinstance(rec, dict):
            raise InputError(f"line {lineno}: expected an object, got {type(rec).__name__}")
        if "tokens" in rec:
            toks = rec["tokens"]
            if not isinstance(toks, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in toks):
                raise InputError(f"line {lineno}: tokens must be a list of integers")
        elif "prompt" in rec or "response" in rec:
            for k in ("prompt", "response"):
                if not isinstance(rec.get(k, ""), str):
                    raise InputError(f"line {lineno}: {k} must be a string")
        else:
            raise InputError(f"line {lineno}: needs \"tokens\" or \"prompt\" and \"response\"")
        records.append(rec)
    return records


def percentile(xs: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100)."""
    if not xs:
        return float("nan")
    s = sorted(xs)
    k = max(0, min(len(s) - 1, int(-(-q * len(s) // 100)) - 1))
    return s[k]


def _open(path: str, mode: str):
    if path == "-":
        return sys.stdin if "r" in mode else sys.stdout
    return open(path, mode, encoding="utf-8")


def score_main(args) -> int:
    from tqdm import tqdm

    from .errors import RewardServerError

    try:
        with _open(args.input, "r") as f:
            records = read_jsonl(f)
    except (OSError, InputError) as e:
        print(f"rmscore score: {args.input}: {e}", file=sys.stderr)
        return 2
    try:
        client = _make_client(args, chunk_size=args.chunk_size, max_concurrency=args.max_concurrency,
                              truncation=args.truncation, tokenizer=args.tokenizer)
    except ValueError as e:
        print(f"rmscore score: {e}", file=sys.stderr)
        return 2
    with client:
        try:
            text_idx = [i for i, r in enumerate(records) if "tokens" not in r]
            seqs: list = [r.get("tokens") for r in records]
            if text_idx:
                ids = client.tokenize([records[i].get("prompt", "") for i in text_idx],
                                      [records[i].get("response", "") for i in text_idx])
                for i, x in zip(text_idx, ids):
                    seqs[i] = x
            bar = tqdm(total=len(seqs), unit="seq", disable=args.no_progress, file=sys.stderr)
            t0 = time.perf_counter()
            result = client.score_ids(seqs, on_chunk=lambda t: bar.update(t.count))
            wall = time.perf_counter() - t0
            bar.close()
        except RewardServerError as e:
            print(f"rmscore score: {type(e).__name__}: {e.code}: {e.message} (after {e.attempts} attempts)",
                  file=sys.stderr)
            return 1
    with _open(args.output, "w") as out:
        for i, s in enumerate(result.scores):
            out.write(json.dumps({"index": i, "score": s}) + "\n")
    lat = [t.latency_ms for t in result.timings]
    retried = sum(t.attempts - 1 for t in result.timings)
    n = len(result.scores)
    print(f"scored {n} sequences in {wall:.2f} s: {n / wall if wall > 0 else 0:.1f} sequences/s; "
          f"{len(lat)} requests, latency p50 {percentile(lat, 50):.1f} ms, p95 {percentile(lat, 95):.1f} ms, "
          f"p99 {percentile(lat, 99):.1f} ms; {retried} retries; model {', '.join(sorted(result.model_versions))}",
          file=sys.stderr)
    return 0


def info_main(args) -> int:
    from dataclasses import asdict

    from .errors import RewardServerError

    try:
        client = _make_client(args)
    except ValueError as e:
        print(f"rmscore info: {e}", file=sys.stderr)
        return 2
    with client:
        health = client.health()
        try:
            info = asdict(client.info())
        except RewardServerError as e:
            info = {"error": f"{e.code}: {e.message}"}
    tok = info.pop("tokenizer_json", None)
    if tok is not None:
        info["tokenizer_json_bytes"] = len(tok)
    info["health"] = health.status
    if args.json:
        print(json.dumps(info))
    else:
        width = max(map(len, info))
        for k, v in info.items():
            print(f"{k:<{width}}  {v}")
    return 0 if health.serving and "error" not in info else 1


def main(argv: list[str] | None = None) -> int:
    """`rmscore-client score|info`: the same commands where only the client is installed."""
    import argparse

    parser = argparse.ArgumentParser(prog="rmscore-client", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_parsers(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
