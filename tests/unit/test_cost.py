"""The cost table, its online refinement and the profile file (core/cost.py, core/cost_profile.py)."""

import json

import pytest

from rmscore.core import cost_profile
from rmscore.core.cost import CostError, CostModel, CostTable, grid

IDENTITY = {"model": "default", "model_version": "sha256:abc", "backend": "onnxruntime", "device": "cpu",
            "precision": "fp32", "intra_op_threads": 2, "model_workers": 1}


def table():
    return CostTable.make([1, 4], [16, 128], [[100, 900], [300, 3000]])


def test_interpolates_between_points_and_extrapolates_in_proportion():
    t = table()
    assert t.batch_us(1, 16) == 100 and t.batch_us(4, 128) == 3000
    assert t.batch_us(1, 72) == 500  # halfway along L
    assert t.batch_us(2, 16) == 166  # a third of the way from B=1 to B=4 (integer floor)
    assert t.batch_us(8, 128) == 6000 and t.batch_us(4, 256) == 6000  # twice the last point
    assert t.batch_us(1, 1) == 100  # below the first length: the first point


def test_a_noisy_table_is_made_non_decreasing():
    t = CostTable.make([1, 4], [16, 128], [[900, 500], [300, 3000]])
    assert t.cost_us == ((900, 900), (900, 3000))


@pytest.mark.parametrize("sizes, lengths, costs, quoted", [
    ([1, 1], [16], [[1], [1]], "[1, 1]"),
    ([1], [0], [[1]], "[0]"),
    ([1], [16], [[1, 2]], "[2]"),
    ([1], [16], [[0]], "[[0]]"),
])
def test_a_bad_grid_is_refused_quoting_it(sizes, lengths, costs, quoted):
    with pytest.raises(CostError, match=__import__("re").escape(quoted)):
        CostTable.make(sizes, lengths, costs)


def test_refinement_moves_the_nearest_cell_toward_what_ran():
    model = CostModel(table())
    for _ in range(50):
        model.observe(4, 128, 0.006)  # 6000 us where the table said 3000
    assert 5500 < model.table.batch_us(4, 128) <= 6000
    assert model.table.batch_us(1, 16) == 100  # other cells keep their measurement


def test_grid_reaches_the_limits():
    assert grid(32, 512) == ([1, 2, 4, 8, 16, 32], [16, 32, 64, 128, 256, 512])
    assert grid(12, 100) == ([1, 2, 4, 8, 12], [16, 32, 64, 100])


def test_a_profile_round_trips(tmp_path):
    path = tmp_path / "p.json"
    cost_profile.save(path, table(), IDENTITY, 1.5)
    assert cost_profile.load(path, IDENTITY) == (table(), 1)
    # --model-workers auto (0) takes the profile's count instead of refusing it.
    assert cost_profile.load(path, dict(IDENTITY, model_workers=0)) == (table(), 1)


@pytest.mark.parametrize("key, value", [("model_version", "sha256:other"), ("backend", "eager"),
                                        ("intra_op_threads", 4), ("model_workers", 2), ("device", "cuda")])
def test_a_profile_for_another_server_is_refused_naming_what_differs(tmp_path, key, value):
    path = tmp_path / "p.json"
    cost_profile.save(path, table(), IDENTITY, 1.5)
    with pytest.raises(cost_profile.ProfileError, match=f"measured for {key}=.*this server runs {key}={value!r}"):
        cost_profile.load(path, dict(IDENTITY, **{key: value}))


@pytest.mark.parametrize("content, why", [
    ("{not json", "cannot read a cost profile"),
    ('{"format": "something else"}', "not a cost profile"),
    ("[1, 2]", "not a cost profile"),
])
def test_a_corrupt_profile_is_refused(tmp_path, content, why):
    path = tmp_path / "p.json"
    path.write_text(content)
    with pytest.raises(cost_profile.ProfileError, match=why):
        cost_profile.load(path, IDENTITY)


def test_a_profile_with_a_broken_table_is_refused(tmp_path):
    path = tmp_path / "p.json"
    cost_profile.save(path, table(), IDENTITY, 1.5)
    doc = json.loads(path.read_text())
    doc["table"]["cost_us"] = [[1]]
    path.write_text(json.dumps(doc))
    with pytest.raises(cost_profile.ProfileError, match="corrupt table"):
        cost_profile.load(path, IDENTITY)


def test_measure_stays_within_its_budget_and_extrapolates_the_rest():
    calls = []

    def run(b, n):  # a stand-in runtime: 1 us per token, so what is measured is known
        calls.append((b, n))
        return b * n * 1e-6

    t, _ = cost_profile.measure(run, 8, 128, budget_s=1e-9, progress=lambda msg: None)
    assert calls == [(1, 16), (1, 16)]  # one shape (twice) before the budget is seen spent
    assert t.batch_us(8, 128) == 8 * 128  # extrapolated in proportion to tokens
    calls.clear()
    t, _ = cost_profile.measure(run, 8, 128, budget_s=60, progress=lambda msg: None)
    assert len(calls) == 2 * 4 * 4 and t.batch_us(4, 64) == 256
