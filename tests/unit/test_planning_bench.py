"""`rmscore bench --planning`'s machinery on a small queue: both forms time the same decisions, and the
report names every mode in each language it could time (C++ only when its timing binary is built)."""

from rmscore_tools.bench import planning


def test_the_report_times_every_mode_in_both_forms(tmp_path):
    rec = planning.run(tmp_path, queued=64, repeats=1)
    assert set(rec["python"]) == set(planning.MODES)
    assert all(t["rebuilt_us"] > 0 and t["index_us"] > 0 for t in rec["python"].values())
    text = (tmp_path / "planning.md").read_text()
    assert "| python | cost_aware |" in text and "64 sequences queued" in text
    if planning.TIMING.exists():
        assert set(rec["cpp"]) == set(planning.MODES) and "| cpp | fifo |" in text
