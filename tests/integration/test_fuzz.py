"""Fuzzing of request decoding and validation (docs/fuzzing.md), bounded in time.

Each fuzz target runs for RMSCORE_FUZZ_SECONDS (default 10) through scripts/fuzz.sh,
the same runner a user calls for longer runs, and must finish without a crash; a
crashing input lands in tests/fuzz/regressions/ and fails the test. Every input kept
there is replayed on each run: the Python ones through the harness's one-input
function, the C++ ones by the libFuzzer binary (which runs files given as arguments).
"""

from __future__ import annotations

import importlib
import os
import pathlib
import re
import subprocess
import sys

import pytest

from rmscore.core.errors import Code, ScoreError

ROOT = pathlib.Path(__file__).resolve().parents[2]
FUZZ = ROOT / "tests" / "fuzz"
REGRESSIONS = FUZZ / "regressions"
CPP_FUZZER = ROOT / "build" / "cpp-fuzz" / "fuzz_cpp_validation"
SECONDS = int(os.environ.get("RMSCORE_FUZZ_SECONDS", "10"))
TARGETS = ["fuzz_cpp_validation", "fuzz_py_grpc", "fuzz_py_http"]
SUMMARY = re.compile(r"^(\w+): (\d+) runs in (\d+) s, (\d+) crashes$", re.M)

sys.path.insert(0, str(FUZZ))  # the harnesses import fuzz_common as a sibling, as when run as scripts


def harness(target: str):
    return importlib.import_module(target)


def kept_inputs(lang: str) -> list[pathlib.Path]:
    return sorted(p for p in (REGRESSIONS / lang).glob("*/*") if p.is_file())


@pytest.mark.slow
@pytest.mark.parametrize("target", TARGETS)
def test_fuzz_target_finds_no_crash(target):
    run = subprocess.run(["bash", "scripts/fuzz.sh", str(SECONDS), target], cwd=ROOT,
                         capture_output=True, text=True, timeout=SECONDS + 300)
    print(run.stdout + run.stderr[-3000:])
    found = SUMMARY.findall(run.stdout)
    assert found, f"no summary line from scripts/fuzz.sh:\n{run.stdout}\n{run.stderr[-3000:]}"
    name, runs, secs, crashes = found[-1]
    assert (name, crashes, run.returncode) == (target, "0", 0), run.stdout
    # It must have fuzzed, not died at start-up: a few hundred inputs even on a loaded machine.
    assert int(runs) >= 200, run.stdout


@pytest.mark.parametrize("path", kept_inputs("py"), ids=lambda p: f"{p.parent.name}/{p.name}")
def test_python_regression_input(path):
    harness(path.parent.name).one_input(path.read_bytes())


def test_cpp_regression_inputs():
    inputs = kept_inputs("cpp")
    if not CPP_FUZZER.exists():
        subprocess.run(["bash", "scripts/build_cpp.sh", "--fuzz"], cwd=ROOT, check=True, timeout=600)
    # Run on files (not directories), libFuzzer executes each once and exits non-zero on a crash;
    # the seed corpus goes along so the binary is exercised even while no crash has been kept.
    files = inputs + sorted((FUZZ / "corpus" / "proto").iterdir())
    run = subprocess.run([str(CPP_FUZZER), *map(str, files)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-4000:]
    assert run.stderr.count("Executed ") == len(files), run.stderr[-4000:]


def test_python_harnesses_flag_a_broken_invariant():
    """The checks the fuzzers rely on do fail: an out-of-vocabulary id or an over-long sequence after validation."""
    common = harness("fuzz_common")
    limits = common.core().validator.limits
    common.check_sequences([[1, 2, 3]], 1)
    for bad in ([[limits.vocab_size]], [[-1]], [[1] * (limits.max_sequence_length + 1)], [[]], [[1]] * 2):
        with pytest.raises(AssertionError):
            common.check_sequences(bad, 1)
    common.check_refusal(ScoreError(Code.INVALID_ARGUMENT, "sequences: empty request, send at least one sequence"))
    with pytest.raises(AssertionError):
        common.check_refusal(ScoreError(Code.INTERNAL, "batch failed: x"))

