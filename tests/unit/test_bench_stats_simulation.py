"""bench/stats_simulation.py runs end to end at a tiny size and writes its figures."""
import json

from bench import stats_simulation


def test_tiny_run_writes_json_and_png(tmp_path, capsys):
    out = tmp_path / "sim.json"
    assert stats_simulation.main(["--sims", "2", "--canary-sims", "50", "--z-runs", "3", "--out", str(out)]) == 0
    figures = json.loads(out.read_text())
    assert len(figures["aa"]) == 6 and len(figures["canary"]) == 45
    assert out.with_suffix(".png").stat().st_size > 10_000
    assert "SRM on users" in capsys.readouterr().out
    assert [r["runs"] for r in figures["ztest"]] == [3] * len(stats_simulation.Z_CELLS)
    assert all(0 <= r["ci_low"] <= r["type_i"] + 1e-12 and r["type_i"] <= r["ci_high"] <= 1 for r in figures["ztest"])
    assert all(0 <= r["ci_low_t"] <= r["type_i_t"] + 1e-12 and r["median_df"] > 0 for r in figures["ztest"])
    out.with_suffix(".png").unlink()
    assert stats_simulation.main(["--redraw", "--out", str(out)]) == 0  # the PNG again, from the JSON alone
    assert out.with_suffix(".png").stat().st_size > 10_000
