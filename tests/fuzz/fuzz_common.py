"""What the Python fuzz harnesses share: the real scoring core, the invariants, the atheris entry point.

The core is the servers' own `ScoringCore` over models/default (repository, tokenizer,
limits, validator), built without a backend: decoding and validation never touch the
model, and a model run per input would cut the executions per second a hundredfold.
An input is fine when it is refused with INVALID_ARGUMENT (or pydantic's validation
error) or when it validates into sequences that keep the invariants below; any other
exception is a crash, and atheris saves the input.
"""

from __future__ import annotations

import functools
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
MODEL = ROOT / "models" / "default"


@functools.cache
def core():
    from rmscore.core.config import ServeConfig
    from rmscore.core.scoring import ScoringCore
    from rmscore.runtimes.workers import RUNTIME

    return ScoringCore(ServeConfig(model=MODEL), RUNTIME)  # the servers' runtime, never loaded here


def check_sequences(seqs, n_items: int) -> None:
    """What the batcher may rely on after validation: one non-empty, in-vocabulary, short-enough list per item."""
    limits = core().validator.limits
    assert len(seqs) == n_items, (len(seqs), n_items)
    for s in seqs:
        assert isinstance(s, list) and 1 <= len(s) <= limits.max_sequence_length, len(s)
        for t in s:
            assert type(t) is int and 0 <= t < limits.vocab_size, t


def check_refusal(err) -> None:
    from rmscore.core.errors import Code

    assert err.code is Code.INVALID_ARGUMENT, err
    assert err.message and err.message.isprintable(), err.message


def main(one_input, instrumented_modules=("rmscore",)) -> None:
    """`python tests/fuzz/fuzz_py_X.py [libFuzzer flags] [corpus dirs | files]`."""
    import atheris

    with atheris.instrument_imports(include=list(instrumented_modules)):
        core()  # imports (and so instruments) rmscore's modules before fuzzing starts
        import rmscore.frontends.grpc_server  # noqa: F401
        import rmscore.frontends.http_app  # noqa: F401
        import rmscore.frontends.http_middleware  # noqa: F401
    atheris.Setup(sys.argv, one_input)
    atheris.Fuzz()
