"""Tiers: unit/ (no server, no model), conformance/ (the contract on every server kind),
integration/ (client, benchmark, load, faults, export, fuzzing), deploy/ (compose, images,
manifests, dashboards and rules with real tools). `bash scripts/test.sh TIER` runs one.

The shared helpers beside this file (servers.py: real servers on loopback; harness.py: golden
inputs and the contract's expectations; virtual_time.py, references.py) are imported by name from every tier: pytest puts this
folder on sys.path because it holds this conftest."""

import atexit
import os
import pathlib
import shutil
import tempfile

import pytest

# cost_aware, the default batching, caches the cost table it measures per machine (core/cost_profile.py),
# and a server writes the table its batches refined back there once idle. The tests keep their cache in
# a directory of their own, so a run neither reads what an earlier run or `rmscore up` measured nor
# leaves anything in the home directory. Each test gets a copy of it (RMSCORE_CACHE_DIR, inherited by
# every server the test starts, whatever fixture scope starts it): one test's load (a flood, two servers
# on two cores) refines the tables of its own servers only, never those a later test starts with. A
# table first measured during a test is copied back, so later starts load it instead of measuring again.
_CACHE = pathlib.Path(tempfile.mkdtemp(prefix="rmscore-test-cache-"))
_SEED = _CACHE / "seed"
(_SEED / "cost-profiles").mkdir(parents=True)
os.environ["RMSCORE_CACHE_DIR"] = str(_SEED)
atexit.register(shutil.rmtree, _CACHE, True)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    own = pathlib.Path(tempfile.mkdtemp(prefix="t-", dir=_CACHE))
    shutil.copytree(_SEED / "cost-profiles", own / "cost-profiles")
    os.environ["RMSCORE_CACHE_DIR"] = str(own)
    try:
        yield
    finally:
        os.environ["RMSCORE_CACHE_DIR"] = str(_SEED)
        for f in (own / "cost-profiles").glob("*.json"):  # never a .tmp file half written
            if not (_SEED / "cost-profiles" / f.name).exists():
                shutil.copy2(f, _SEED / "cost-profiles" / f.name)
