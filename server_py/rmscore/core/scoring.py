"""What both Python front ends share: config, model repository, backend, batcher, metrics, readiness.

A front end only translates its transport to `ScoringCore.score` and back, and
maps `ScoreError` once (errors.Code carries both the gRPC and the HTTP status).
The core imports no runtime: the runner that starts a server hands it one
(`ScoringCore(cfg, runtime)`, core/runtime.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import pathlib
import sys
import threading
import time
from typing import Awaitable, Callable

import numpy as np

from rmscore.core.admission import CALLER, HeldBytes, request_bytes
from rmscore.core.batcher import Batcher, Job, Result
from rmscore.core import cost_profile
from rmscore.core.config import AUTO_WORKERS, ConfigError, ServeConfig
from rmscore.core.cost import CostModel, CostTable
from rmscore.core.planner import COST_AWARE
from rmscore.core.errors import Code, ScoreError
from rmscore.core.liveness import HangFault, HangHook, Liveness, LivenessWatch, StallClock, longest_batch, \
    now_us, threshold_note
from rmscore.core.metrics import Metrics
from rmscore.core.runtime import Runtime, Workers, progress
from rmscore.core.tokenizing import TokenizePool, default_max_text_chars, pieces, settle
from rmscore.core.validation import Limits, SeqInput, Validator
from rmscore.model.repository import ModelRepo, load_repo

#: The sequence length of admission's first timed batch (_work_seed); server_cpp's kSeedLength.
SEED_LENGTH = 512
#: Requests with at least this many token ids are checked on a worker thread (~0.5 ms of checking).
THREAD_VALIDATE_MIN_TOKENS = 8192

WARMING_UP, SERVING, DRAINING, FAILED = "warming_up", "serving", "draining", "failed"


class ScoringCore:
    def __init__(self, cfg: ServeConfig, runtime: Runtime):
        """`runtime`: what this core loads and runs (runtimes/workers.py RUNTIME in the servers)."""
        self.cfg = cfg
        self.runtime = runtime
        self.repo: ModelRepo = load_repo(cfg.model)
        self.metrics = Metrics(cfg.server_label, cfg.backend, device=cfg.device)
        self.metrics.set_queue_capacity(cfg.max_queue_sequences)
        self.metrics.build_info(self.repo.name, self.repo.version)
        # Liveness (core/liveness.py): the batcher tells the clock; the gauge, /livez and the gRPC
        # "liveness" status read it without the batcher's lock. Created before any loading, so the
        # gauge reads 0 while warming up (no batcher yet: nothing can be stuck in one).
        self.stall = StallClock()
        self.liveness = Liveness(self.stall, cfg.liveness_stall_seconds)
        self.metrics.set_stalled_source(lambda: self.stall.stalled_us(now_us()) / 1e6)
        self._liveness_watch: LivenessWatch | None = None
        self.hang = HangHook(HangFault.from_env())  # a bad RMSCORE_FAULT_HANG_BATCH refuses the start
        from tokenizers import Tokenizer

        tok = Tokenizer.from_file(str(self.repo.tokenizer_path))
        tok.no_padding()
        tok.no_truncation()
        self.tokenizer_json = self.repo.tokenizer_path.read_text()
        #: --max-text-chars, or its default from this model's window (core/tokenizing.py).
        self.max_text_chars = cfg.max_text_chars or default_max_text_chars(self.repo.max_sequence_length)
        self.validator = Validator(Limits(self.repo.max_sequence_length, self.repo.vocab_size,
                                          cfg.max_sequences_per_request, self.max_text_chars), tok)
        # Every route's tokenizing runs here, counted against the same bound as model work.
        self.tokenizing = TokenizePool(cfg.max_queue_wait_seconds)
        # Bytes of accepted requests, from acceptance until answered (--max-queued-request-bytes).
        self.held = HeldBytes(cfg.max_queued_request_bytes)
        self.metrics.set_queued_bytes_source(lambda: self.held.held)
        self.metrics.set_tokenize_queue_source(self.tokenizing.waiting_chars)
        self.state = WARMING_UP
        self.failure: str | None = None
        self.batcher: Batcher | None = None
        self.backend = None
        self._on_state: list = []
        self._loader: threading.Thread | None = None
        # Serialises the warm-up's "now SERVING" against SIGTERM's "now DRAINING".
        self._state_lock = threading.Lock()
        self._recompiles_lock = threading.Lock()  # model workers' threads count recompiles together
        self.workers: Workers | None = None
        # A saved profile is checked before anything loads: a wrong one refuses to start at once.
        self.cost_identity = cost_profile.identity(self.repo, cfg)
        self.cost_table: CostTable | None = None
        # Where a measured table is saved: --cost-profile, else the cache (None: not saved).
        self.cost_profile_path: pathlib.Path | None = cfg.cost_profile
        loaded = None
        if cfg.cost_profile is not None and cfg.cost_profile.exists():
            try:
                loaded = cost_profile.load(cfg.cost_profile, self.cost_identity)
            except cost_profile.ProfileError as e:
                raise ConfigError(str(e)) from None
        elif cfg.cost_profile is None and cfg.batching == COST_AWARE and cfg.cost_profile_dir is not None:
            self.cost_profile_path = cost_profile.cache_path(cfg.cost_profile_dir, self.cost_identity,
                                                             cfg.max_batch_size)
            loaded = cost_profile.load_cached(self.cost_profile_path, self.cost_identity, progress)
        if loaded is not None:
            self.cost_table, workers = loaded
            self.cost_identity["model_workers"] = workers  # auto takes the profile's: no second measurement

    # ---- start-up -------------------------------------------------------------------------
    def start_loading(self, on_state, on_liveness=None) -> None:
        """Load, warm up and self-check in a thread; `on_state(state)` hears each change, and
        `on_liveness(alive)` (optional, from the liveness watch's thread) each change of the liveness
        verdict, which starts alive. The watch runs until `stop`, whatever the state: it logs a stall
        even where no probe asks."""
        self._on_state.append(on_state)
        self._liveness_watch = LivenessWatch(self.liveness, on_liveness)
        self._liveness_watch.start()
        self._loader = threading.Thread(target=self._load, name="rmscore-load", daemon=True)
        self._loader.start()

    def _load(self) -> None:
        t0 = time.perf_counter()
        try:
            workers = self.cost_identity["model_workers"]
            self.workers = self.runtime.start_workers(self.cfg, self.repo, workers or None)
            # The first run session: the cost table and the seed are measured on what runs under load.
            self.backend = self.workers.runs[0]
            if workers == AUTO_WORKERS:
                self.cost_identity["model_workers"] = len(self.workers.runs)  # what a saved profile measured
            for _ in range(self.cfg.warmup_rounds):
                if self.state != WARMING_UP:  # SIGTERM: a long --warmup-rounds must not hold the exit
                    progress("stopped during warm-up")
                    return
                for backend in self.workers.sessions():
                    backend.warmup(self.cfg.max_batch_size, self.repo.max_sequence_length)
            cost = self._cost_model()
            longest = None if cost is None else longest_batch(cost.table, self.cfg.max_batch_size,
                                                              self.cfg.max_batch_tokens, self.repo.max_sequence_length)
            note, warning = threshold_note(self.cfg.liveness_stall_seconds, longest)
            print(note, file=sys.stderr if warning else sys.stdout, flush=True)
            seed = self._work_seed(cost)
            diff = self.runtime.self_check(self.backend, self.repo, self.cfg.precision)
            progress(f"self-check passed: max abs diff {diff:.2e} against the golden scores")
            self._release_memory()  # the self-check's padded batch and the cost profile's grew the arena
            self._baseline_recompiles = self.backend.recompiles()
            _freeze_what_lives_as_long_as_the_server()
        except Exception as e:  # noqa: BLE001 - any load failure means "never ready", said clearly
            self.failure = str(e)
            progress(f"FAILED to start: {e}")
            self._set_state(FAILED)
            return
        with self._state_lock:
            if self.state != WARMING_UP:  # SIGTERM came during warm-up: stay draining, accept nothing
                return
            # No abort hook: neither backend can interrupt a run (stop() says what that means).
            self.batcher = Batcher(Batcher.Options(self.cfg.planner, self.cfg.max_queue_sequences,
                                                   self.repo.pad_token_id, cost,
                                                   int(self.cfg.max_queue_wait_seconds * 1e6), seed,
                                                   progress=self.stall, on_idle=self._release_memory,
                                                   on_refined=self._keep_refined if self._refines_cache(cost) else None,
                                                   refine_on_thread_cpu=self._timing() == cost_profile.THREAD_CPU),
                                   [self._scorer(b) for b in self.workers.runs], self.metrics,
                                   lone=None if self.workers.lone is None else self._scorer(self.workers.lone))
            self._set_state(SERVING)
        progress(f"ready: SERVING after {time.perf_counter() - t0:.1f} s")

    def _release_memory(self) -> None:
        """The batcher went idle: each session gives back what batches larger than its warm-up grew
        (runtimes/ort.py; the other runtimes keep nothing to give)."""
        for session in self.workers.sessions():
            release = getattr(session, "release_memory", None)
            if release is not None:
                release()

    def _refines_cache(self, cost: CostModel | None) -> bool:
        """The batches served refine the cached table for the next start; never the operator's
        --cost-profile file, which a restart loads as it was written."""
        return cost is not None and self.cost_profile_path is not None and self.cfg.cost_profile is None

    def _keep_refined(self, table: CostTable, batches: int) -> None:
        """Batches refined the table and the batcher went idle (a batcher thread) or stopped: keep it in
        the cache. A cache that cannot be written costs the next start this refinement, nothing else."""
        try:
            cost_profile.save_refined(self.cost_profile_path, table, self.cost_identity, batches, self._timing())
        except OSError as e:
            progress(f"cost profile: cannot keep the refined table at {self.cost_profile_path}: {e}")

    def _cost_model(self) -> CostModel | None:
        """The cost table: the profile loaded at start, or measured now (and saved with --cost-profile).
        None when nothing plans with it and no profile was asked for: measuring costs start-up time."""
        if self.cfg.batching != COST_AWARE and self.cfg.cost_profile is None:
            return None
        if self.cost_table is None:
            rng = np.random.default_rng(0)
            low = min(1000, self.repo.vocab_size - 1)

            clock = cost_profile.clock(self._timing())

            def run(b: int, n: int) -> float:
                ids = rng.integers(low, self.repo.vocab_size, size=(b, n), dtype=np.int64)
                t = clock()
                self.backend.score(ids, np.ones((b, n), np.int64))
                return clock() - t

            self.cost_table, spent = cost_profile.measure(run, self.cfg.max_batch_size, self.repo.max_sequence_length,
                                                          self.cfg.cost_profile_seconds, progress)
            self._save_cost_profile(spent)
        else:
            progress(f"cost profile loaded from {self.cost_profile_path}")
        progress(cost_profile.describe(self.cost_table))
        return CostModel(self.cost_table)

    def _timing(self) -> str:
        """How the cost table is timed: every run session works on its caller's thread alone (one
        intra-op thread on a CPU, as --model-workers elastic's workers), so by that thread's CPU time,
        which other processes' load does not inflate (batcher.Options.refine_on_thread_cpu); else by the
        wall clock."""
        return cost_profile.timing(self.cfg.device, self.cfg.intra_op_threads // len(self.workers.runs))

    def _save_cost_profile(self, spent: float) -> None:
        path = self.cost_profile_path
        if path is None:
            return
        try:
            if path != self.cfg.cost_profile:
                path.parent.mkdir(parents=True, exist_ok=True)
            cost_profile.save(path, self.cost_table, self.cost_identity, spent, self._timing())
        except OSError as e:
            if path == self.cfg.cost_profile:
                raise  # the operator named this file: not writing it is a failed start
            # A read-only home (a container) costs the next start a measurement, not this one its start.
            progress(f"cost profile: cannot cache it at {path}: {e}; serving without saving it")
            return
        progress(f"cost profile saved to {path}")

    def _work_seed(self, cost: CostModel | None) -> float:
        """Admission's first rate (core/admission.py), model microseconds per token: one batch of
        sequences as long as the model takes (up to SEED_LENGTH); the batches served refine it from the
        first one on. Long, because a token costs more in a long sequence (attention): seeded from
        64-token sequences, the rate was half the real one while the first 512-token batches ran, and a
        probe admitted on it then expired in the queue (a 2.2 s answer to a 2 s deadline, CI). Erring
        long refuses early a little too readily, for one or two batches. Read from the cost table where
        there is one (it timed that shape, at this start or one with the same identity), else timed once
        here: a second of every start at 512 tokens."""
        b, n = min(8, self.cfg.max_batch_size), min(SEED_LENGTH, self.repo.max_sequence_length)
        if cost is not None:
            return cost.table.batch_us(b, n) / (b * n)
        ids = np.full((b, n), min(1000, self.repo.vocab_size - 1), np.int64)
        t = time.perf_counter()
        self.backend.score(ids, np.ones((b, n), np.int64))
        return (time.perf_counter() - t) * 1e6 / (b * n)

    def _scorer(self, backend):
        """The batcher's model for one worker: scores, and counts graphs compiled after warm-up."""
        def score(input_ids, attention_mask):
            self.hang.before_batch()  # RMSCORE_FAULT_HANG_BATCH (tests only): a stuck device
            scores = backend.score(input_ids, attention_mask)
            with self._recompiles_lock:
                grown = self.backend.recompiles() - self._baseline_recompiles
                if grown > 0:
                    self.metrics.recompiles(grown)
                    self._baseline_recompiles += grown
            return scores
        return score

    def _set_state(self, state: str) -> None:
        self.state = state
        for cb in self._on_state:
            cb(state)

    # ---- requests --------------------------------------------------------------------------
    def check_ready(self) -> None:
        if self.state == SERVING:
            return
        reason = {WARMING_UP: "warming up", DRAINING: "draining"}.get(self.state, f"failed: {self.failure}")
        raise ScoreError(Code.UNAVAILABLE, f"not ready: {reason}")

    def check_admission(self, deadline_s: float | None) -> None:
        """Raise what a request with this deadline gets before it is even read: not ready, or refused by
        the work ahead (admission.py). Every entry of the core asks it first, so a refusal under a work
        flood costs no validation or tokenizing (checking the ids of 128 x 512-token requests that were
        then refused took most of the GIL, and a probe waited for it). Validation errors therefore come
        second on a loaded server, in both languages (docs/contract.md). The work
        ahead is the caller's (admission.CALLER, set by the front end): callers are served in turn, so
        one that floods is refused for its own work while a new caller's wait is the batches running."""
        self.check_ready()
        refused = self.batcher.work_refusal(deadline_s, CALLER.get())
        if refused is not None:
            raise refused

    def check_before_body(self, tokenizes: bool) -> None:
        """Raise what any request gets before its body is read: `check_admission` without a deadline
        (not ready, draining, the work ahead over max_queue_wait_seconds), and for a request that
        always tokenizes, the tokenizing ahead over it. The HTTP front end asks once the headers are
        in, so an overloaded server refuses a multi-MB body without decoding it (issue 29, defect 5:
        decoding and validating 2.6 MB bodies before the work check made refusals take 100-435 ms)."""
        self.check_admission(None)
        refused = self.tokenizing.refusal_ahead() if tokenizes else None
        if refused is not None:
            raise refused

    def holding(self, items: list[SeqInput]):
        """Counts the bytes `items` hold against --max-queued-request-bytes until the block ends (the
        request is answered), or raises its refusal, RESOURCE_EXHAUSTED, before anything is queued
        (admission.py HeldBytes). After check_admission, before validation: docs/contract.md's order."""
        return self.holding_bytes(sent_bytes(items))

    @contextlib.contextmanager
    def holding_bytes(self, nbytes: int):
        """`holding` for `nbytes` counted by the caller (a route that tokenizes: its request as sent)."""
        refused = self.held.hold(nbytes)
        if refused is not None:
            raise refused
        try:
            yield nbytes
        finally:
            self.held.release(nbytes)

    async def score(self, items: list[SeqInput], truncation: str, deadline_s: float | None) -> Result:
        """Validate, queue, and await the scores; cancelling the awaiting task drops the sequences."""
        self.check_admission(deadline_s)
        with self.holding(items):
            return await self._score(items, truncation, deadline_s)

    async def _score(self, items: list[SeqInput], truncation: str, deadline_s: float | None) -> Result:
        if any(it.text is not None for it in items):
            self.validator.check_request(items, truncation)  # lengths only: refused before any tokenizing
            seqs = await self.tokenize_items(items, truncation, deadline_s)
        elif sum(len(it.tokens) for it in items if it.tokens is not None) >= THREAD_VALIDATE_MIN_TOKENS:
            # Checking 64k token ids takes ~4 ms: off the event loop, so a small call arriving
            # meanwhile is not queued behind it (a work flood of such requests stalled every probe).
            seqs = await asyncio.to_thread(self.validator.request, items, truncation)
        else:
            seqs = self.validator.request(items, truncation)
        return await self.score_ids(seqs, deadline_s)

    async def tokenize_items(self, items: list[SeqInput], truncation: str, deadline_s: float | None,
                             where: str | None = None) -> list[list[int]]:
        """The validated ids of `items` (text, or a lone item named `where`), tokenized on the
        tokenizing pool in pieces: counted by admission, stopped between pieces when cancelled."""
        chars = [len(it.text[0]) + len(it.text[1]) if it.text is not None else 0 for it in items]
        work = [(lambda r=r: self.validator.texts(items, r, truncation, where), sum(chars[i] for i in r))
                for r in pieces(chars)]
        return await self.tokenizing.run(work, deadline_s)

    async def sequence(self, item: SeqInput, truncation: str, where: str, deadline_s: float | None) -> list[int]:
        """One stream item's validated ids: text checked for length first, then tokenized on the pool."""
        if item.text is None:
            return self.validator.sequence(item, truncation, where)
        self.validator.truncation(truncation)
        self.validator.check_text_chars(item, where)
        return (await self.tokenize_items([item], truncation, deadline_s, where))[0]

    async def score_item(self, item: SeqInput, truncation: str, where: str, deadline_s: float | None) -> Result:
        """One stream item: admission, its bytes held until it is answered, then `sequence` and scoring."""
        self.check_admission(deadline_s)
        with self.holding([item]):
            seq = await self.sequence(item, truncation, where, deadline_s)
            return await self.score_ids([seq], deadline_s)

    async def score_ids(self, seqs: list[list[int]], deadline_s: float | None) -> Result:
        return await self.submit_ids(seqs, deadline_s)

    def submit_ids(self, seqs: list[list[int]], deadline_s: float | None) -> asyncio.Future:
        """Queues validated ids now or raises the refusal now (RESOURCE_EXHAUSTED, UNAVAILABLE); the
        future returned gives the Result, and cancelling it drops the sequences. Call on the loop."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future = loop.create_future()

        def done(outcome) -> None:
            try:
                loop.call_soon_threadsafe(settle, fut, outcome)
            except RuntimeError:  # the loop has closed (the process is ending): nobody awaits it
                pass

        job = Job(seqs, deadline_s, done, CALLER.get())  # its sequences take its caller's turns
        self.batcher.submit(job)  # the batcher keeps the in-flight gauge, as in the C++ server
        # A callback on the future, not an `except CancelledError` in a coroutine around it: a part of
        # `_score_in_parts` cancelled before its task first ran never entered such a coroutine, so its
        # sequences stayed queued and the model scored them for a request already refused.
        fut.add_done_callback(lambda f: self.batcher.cancel(job) if f.cancelled() else None)
        return fut

    async def score_in_parts(self, items: list[SeqInput], truncation: str) -> list[float]:
        """The scores, in order, of a request that may hold more sequences than the queue takes and
        sets no deadline (OpenRLHF's whole rollout batch in one /get_reward, vLLM's batch routes).
        Validated off the event loop, then queued in parts of max_sequences_per_request, each queued
        or refused before the next is tried: a part refused for room (sequences or work ahead) waits
        until one of this request's earlier parts is answered. When none of them is left to wait for
        (the queue is full of other callers' work) or any part fails, every part still queued is
        cancelled and the error raised, so a refused request costs the server nothing more.

        Parts used to go through `score`, which validates a large part on a thread before queueing
        it, so every part of a 5000-query request was submitted at once and the later ones were
        refused by the work bound: 429 after 1.1 s, and OpenRLHF stops training after five retries."""
        return await self.score_prepared(lambda: _ready(items), truncation, sent_bytes(items))

    async def score_prepared(self, prepare: Callable[[], Awaitable[list[SeqInput]]], truncation: str,
                             nbytes: int) -> list[float]:
        """`score_in_parts` for a route that makes its inputs itself (OpenRLHF's and vLLM's, with
        their own encoders): the one call such a route makes. Admission comes first, so a refusal
        costs no tokenizing; then the request's bytes as sent (`nbytes`: `sent_bytes` of its texts
        and ids, before tokenizing or any cut) are held; then `prepare()` makes the inputs (its
        tokenizing on `self.tokenizing`: counted by admission, stopped when the caller goes); then
        they are fed in parts. Counted after prepare, the bytes were those of the ids it made, cut
        to the model's window: 32 KiB for eight 100,000-character queries on /get_reward, which hold
        800 KB until answered."""
        self.check_admission(None)
        with self.holding_bytes(nbytes):
            items = await prepare()
            return await self._score_in_parts(items, truncation)

    async def _score_in_parts(self, items: list[SeqInput], truncation: str) -> list[float]:
        m = self.cfg.max_sequences_per_request
        parts = [items[k:k + m] for k in range(0, len(items), m)]
        seqs = await asyncio.to_thread(lambda: [self.validator.request(p, truncation) for p in parts])
        tasks: list[asyncio.Future] = []
        try:
            for part in seqs:
                while True:
                    try:
                        tasks.append(self.submit_ids(part, None))
                        break
                    except ScoreError as e:
                        waiting = [t for t in tasks if not t.done()]
                        if e.code != Code.RESOURCE_EXHAUSTED or not waiting:
                            raise
                    await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
                    for t in waiting:
                        if t.done() and t.exception() is not None:
                            raise t.exception()
            results = await asyncio.gather(*tasks)
        except BaseException:  # refused, failed, or the client went away (cancelled): drop what is queued
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            raise
        return [float(x) for r in results for x in r.scores]

    # ---- shutdown -------------------------------------------------------------------------
    def begin_drain(self) -> None:
        """From now on scoring calls are refused "not ready: draining" (wait_drained then closes the
        batcher itself), as the C++ server's StartDraining."""
        with self._state_lock:
            self._set_state(DRAINING)

    def drain_deadline(self, t_signal: float) -> float:
        """Until when (time.monotonic) accepted work may run after the signal at `t_signal`: the grace
        less a reserve for failing what is left and closing the transport, so the process exits
        within --drain-grace-seconds, as the C++ server does."""
        return t_signal + self.cfg.drain_grace_seconds - self.shutdown_reserve_s()

    def shutdown_reserve_s(self) -> float:
        return self.cfg.shutdown_reserve_s

    def wait_drained(self, until: float) -> bool:
        """Refuse new work and wait until every accepted request is answered or `until` passes."""
        return self.batcher.drain(until) if self.batcher else True

    def stop(self, join_timeout_s: float = 30.0) -> None:
        """Fail what is still queued (UNAVAILABLE), so every call ends, and stop the batcher; the
        liveness watch ends with it."""
        if self.batcher:
            self.batcher.stop(join_timeout_s)
        self.tokenizing.shutdown()
        if self._liveness_watch is not None:
            self._liveness_watch.stop()

    def still_running(self) -> bool:
        """A load, warm-up or batch is still running on a thread of its own (the process runner,
        frontends/process.py, then leaves without tearing the interpreter down under it)."""
        loading = self._loader is not None and self._loader.is_alive()  # SIGTERM came mid-load/warm-up
        return bool(loading or (self.batcher and self.batcher.running()))


def sent_bytes(items) -> int:
    """What `items` are counted as holding (admission.py request_bytes): a SeqInput by its token ids
    or its text; a route's raw input by its kind: a list of token ids, a text, a (prompt, response)
    pair, or anything with `texts()` (a conversation)."""
    n = 0
    for it in items:
        if isinstance(it, SeqInput):
            n += request_bytes(_length(it.tokens), _length(it.text[0]) + _length(it.text[1]) if it.text else 0)
        elif isinstance(it, list):
            n += request_bytes(len(it))
        elif isinstance(it, str):
            n += len(it)
        elif isinstance(it, tuple):
            n += sum(map(_length, it))
        else:
            n += sum(map(_length, it.texts()))
    return n


def _length(x) -> int:
    """len(x) of a token list or text; 0 for what validation will refuse anyway (None, a number)."""
    try:
        return len(x)
    except TypeError:
        return 0


def _freeze_what_lives_as_long_as_the_server() -> None:
    """What is alive once the model is loaded and warm (modules, the model's runtime objects, the
    tokenizer, the web framework) lives until exit: frozen, the garbage collector no longer walks it at
    every full collection, each of which holds the GIL. The HTTP server's imports alone are 78,000
    tracked objects and 15.6 ms a full collection, 0.0 ms frozen; under a stream flood on py-http its
    full collections took 19-134 ms of wall time (gc callbacks' timings, 2-core Intel Xeon)."""
    gc.collect()
    gc.freeze()


async def _ready(items: list[SeqInput]) -> list[SeqInput]:
    return items
