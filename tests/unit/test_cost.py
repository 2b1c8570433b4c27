"""The cost table, its online refinement and the profile file (core/cost.py, core/cost_profile.py)."""

import json
import random
import threading

import pytest

from rmscore.core import cost_profile
from rmscore.core.cost import CostError, CostModel, CostTable, grid

IDENTITY = {"model": "default", "model_version": "sha256:abc", "backend": "onnxruntime", "device": "cpu",
            "precision": "fp32", "intra_op_threads": 2, "model_workers": 1, "cpu": "Intel(R) Xeon(R) Processor"}


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


def test_a_refined_table_is_kept_with_its_measurement_and_counted(tmp_path):
    path = tmp_path / "p.json"
    cost_profile.save(path, table(), IDENTITY, 1.5)
    measured = json.loads(path.read_text())
    model = CostModel(table())
    model.observe(4, 128, 0.006)
    cost_profile.save_refined(path, model.table, IDENTITY, 3)
    cost_profile.save_refined(path, model.table, IDENTITY, 2)
    doc = json.loads(path.read_text())
    assert doc["measured_at"] == measured["measured_at"] and doc["measured_seconds"] == 1.5
    assert doc["refined_batches"] == 5 and doc["refined_at"]
    assert cost_profile.load(path, IDENTITY) == (model.table, 1) != (table(), 1)
    # Another identity's file, or none, is replaced by this one's table (nothing of the other kept).
    other = tmp_path / "o.json"
    cost_profile.save(other, table(), dict(IDENTITY, cpu="AMD EPYC 7B13"), 1.5)
    for path in (other, tmp_path / "absent.json"):
        cost_profile.save_refined(path, model.table, IDENTITY, 4)
        doc = json.loads(path.read_text())
        assert doc["refined_batches"] == 4 and "measured_at" not in doc
        assert cost_profile.load(path, IDENTITY) == (model.table, 1)


def test_refinements_saved_from_several_threads_at_once_all_count(tmp_path):
    """Two model workers' idle spells, or one and the stop, save at once (batcher on_refined): each save
    reads, adds its batches and writes, so without one save at a time batches were lost, or a save
    found the shared temporary file already moved and failed."""
    path = tmp_path / "p.json"
    cost_profile.save(path, table(), IDENTITY, 1.5)
    threads, saves = 6, 40
    start = threading.Barrier(threads)
    failed: list[BaseException] = []

    def worker():
        start.wait()
        for _ in range(saves):
            try:
                cost_profile.save_refined(path, table(), IDENTITY, 1)
            except BaseException as e:  # noqa: BLE001 - reported below
                failed.append(e)

    running = [threading.Thread(target=worker) for _ in range(threads)]
    for t in running:
        t.start()
    for t in running:
        t.join()
    assert not failed, failed[:3]
    assert json.loads(path.read_text())["refined_batches"] == threads * saves


def test_a_profile_round_trips(tmp_path):
    path = tmp_path / "p.json"
    cost_profile.save(path, table(), IDENTITY, 1.5)
    assert cost_profile.load(path, IDENTITY) == (table(), 1)
    # --model-workers auto (0) takes the profile's count instead of refusing it.
    assert cost_profile.load(path, dict(IDENTITY, model_workers=0)) == (table(), 1)


@pytest.mark.parametrize("key, value", [("model_version", "sha256:other"), ("backend", "eager"),
                                        ("intra_op_threads", 4), ("model_workers", 2), ("device", "cuda"),
                                        ("cpu", "AMD EPYC 7B13")])
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


def test_the_cpu_is_the_first_model_name_line(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nmodel name\t: AMD EPYC 7B13 \nflags\t: avx2\n\nmodel name\t: other\n")
    assert cost_profile.cpu_model(info) == "AMD EPYC 7B13"
    assert cost_profile.cpu_model(tmp_path / "absent") == "unknown"


def test_the_cache_directory_follows_the_environment():
    assert cost_profile.default_dir({"RMSCORE_CACHE_DIR": "/c", "XDG_CACHE_HOME": "/x", "HOME": "/h"}) == \
        __import__("pathlib").Path("/c/cost-profiles")
    assert str(cost_profile.default_dir({"XDG_CACHE_HOME": "/x", "HOME": "/h"})) == "/x/rmscore/cost-profiles"
    assert str(cost_profile.default_dir({"HOME": "/h"})) == "/h/.cache/rmscore/cost-profiles"


def test_the_cache_file_is_named_for_what_picks_a_table(tmp_path):
    # server_cpp/tests/test_cost.cc holds the C++ CachePath to the same name.
    path = cost_profile.cache_path(tmp_path, dict(IDENTITY, model="my model/v2"), 32)
    assert path == tmp_path / "my_model_v2-onnxruntime-cpu-fp32-2t-b32.json"


def test_a_cached_profile_that_does_not_match_is_measured_again_saying_why(tmp_path):
    said = []
    path = tmp_path / "p.json"
    assert cost_profile.load_cached(path, IDENTITY, said.append) is None
    assert said[-1] == f"cost profile: none cached at {path}: measuring"
    cost_profile.save(path, table(), dict(IDENTITY, cpu="AMD EPYC 7B13"), 1.5)
    assert cost_profile.load_cached(path, IDENTITY, said.append) is None
    assert said[-1] == (f"cost profile: not used: cached cost profile {path}: measured for cpu='AMD EPYC 7B13', "
                        f"but this server runs cpu='Intel(R) Xeon(R) Processor'; measuring again "
                        f"(the file will be replaced)")
    path.write_text("{half a profi")
    assert cost_profile.load_cached(path, IDENTITY, said.append) is None
    assert "cannot read a cost profile" in said[-1] and said[-1].endswith("(the file will be replaced)")
    cost_profile.save(path, table(), IDENTITY, 1.5)
    assert cost_profile.load_cached(path, IDENTITY, said.append) == (table(), 1)


@pytest.mark.parametrize("timing", [cost_profile.THREAD_CPU, cost_profile.WALL])
def test_a_cached_table_refined_before_profiles_said_their_timing_is_measured_again(tmp_path, timing):
    # Refined by the wall clock, other processes' load in its cells (cost_profile's docstring): not used.
    said = []
    path = tmp_path / "p.json"
    model = CostModel(table())
    model.observe(4, 128, 0.006)
    cost_profile.save_refined(path, model.table, IDENTITY, 3, timing)
    assert json.loads(path.read_text())["timing"] == timing
    assert cost_profile.load_cached(path, IDENTITY, said.append) == (model.table, 1)
    old = json.loads(path.read_text())
    del old["timing"]
    path.write_text(json.dumps(old))
    assert cost_profile.load_cached(path, IDENTITY, said.append) is None
    assert said[-1] == (f"cost profile: not used: cached cost profile {path}: refined by the wall clock before "
                        "profiles said how they were timed, so other processes' load is in its cells; measuring "
                        "again (the file will be replaced)")
    # Measured and never refined, it is used (its warm-up timed by either clock is alike on an idle core),
    # and so is the operator's file, which a restart loads as written.
    assert cost_profile.load(path, IDENTITY) == (model.table, 1)
    cost_profile.save(path, table(), IDENTITY, 1.5, timing)
    old = json.loads(path.read_text())
    del old["timing"]
    path.write_text(json.dumps(old))
    assert cost_profile.load_cached(path, IDENTITY, said.append) == (table(), 1)


def _rule(xs, x, f):
    """The documented interpolation, as plainly as it can be written: linear between grid points, the
    first point's value below them, proportional past the last."""
    if x <= xs[0]:
        return f(0)
    if x >= xs[-1]:
        return f(len(xs) - 1) * x // xs[-1]
    i = max(k for k in range(len(xs)) if xs[k] <= x)
    return f(i) + (f(i + 1) - f(i)) * (x - xs[i]) // (xs[i + 1] - xs[i])


def test_batch_us_is_the_rule_at_every_point():
    rng = random.Random(5)
    t = CostTable.make([1, 2, 4, 8, 16, 32], [16, 32, 64, 128, 256, 512],
                       [[rng.randint(1, 200_000) for _ in range(6)] for _ in range(6)])
    for count in range(1, 70):
        for length in range(1, 600, 7):
            want = _rule(t.batch_sizes, count, lambda i: _rule(t.lengths, length, lambda j: t.cost_us[i][j]))
            assert t.batch_us(count, length) == want, (count, length)


def test_the_planners_memo_is_the_tables_own():
    model = CostModel(CostTable.make([1, 4], [16, 128], [[100, 900], [300, 3000]]))
    model.table.memo["x"] = 1
    model.observe(4, 128, 0.005)
    assert model.table.memo == {}  # a refined table is a new one: nothing it did not answer itself
