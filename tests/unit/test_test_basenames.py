"""pytest imports test modules by their basename (the tiers are folders, not packages): two files
of one name in different tiers stop the whole run at collection ("import file mismatch"), which
a run of one tier alone never shows."""

from __future__ import annotations

import collections
import pathlib

TESTS = pathlib.Path(__file__).resolve().parents[1]


def test_every_test_module_name_is_unique_across_tiers():
    seen = collections.defaultdict(list)
    for f in TESTS.rglob("*.py"):
        seen[f.name].append(f.relative_to(TESTS).as_posix())
    clashes = {name: paths for name, paths in seen.items() if len(paths) > 1}
    assert not clashes, clashes
