"""Tiers: unit/ (no server, no model), conformance/ (the contract on every server kind),
integration/ (client, benchmark, load, faults, export, fuzzing), deploy/ (compose, images,
manifests, dashboards and rules with real tools). `bash scripts/test.sh TIER` runs one.

The shared helpers beside this file (servers.py: real servers on loopback; harness.py: golden
inputs and the contract's expectations; virtual_time.py, references.py) are imported by name from every tier: pytest puts this
folder on sys.path because it holds this conftest."""

import atexit
import os
import shutil
import tempfile

# cost_aware, the default batching, caches the cost table it measures per machine (core/cost_profile.py):
# the tests keep theirs in a directory of their own, so a run neither reads what an earlier run or
# `rmscore up` measured nor leaves anything in the home directory. Every server a test starts inherits it.
_CACHE = tempfile.mkdtemp(prefix="rmscore-test-cache-")
os.environ["RMSCORE_CACHE_DIR"] = _CACHE
atexit.register(shutil.rmtree, _CACHE, True)
