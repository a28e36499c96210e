"""bench/autotune_week.py runs end to end at a tiny size, its array copy of the auto-tune rule
agrees with tuning.recommend on week 0, and the true-rate model is what its docstring says."""
import json

import numpy as np

from bench import autotune_week


def test_tiny_run_writes_json_and_checks_against_the_project(tmp_path, capsys):
    out = tmp_path / "week.json"
    assert autotune_week.main(["--weeks", "2", "--runs", "9", "--out", str(out)]) == 0
    figures = json.loads(out.read_text())
    assert len(figures["rows"]) == len(autotune_week.SCENARIOS) and figures["runs"] == 9
    assert sum(r["project_checks"] for r in figures["rows"]) >= 6  # run 0 of every scenario at least
    assert "all equal" in capsys.readouterr().out
    path = figures["rows"][0]["path"]
    assert len(path["base_median"]) == 9 and path["base_p10"][0] <= path["base_median"][0] <= path["base_p90"][0]
    assert out.with_suffix(".png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_true_rates_fall_with_the_threshold_and_cross_the_target_inside_the_grid():
    for s in autotune_week.SCENARIOS:
        rates = autotune_week.true_rates(s)[40:100]  # thresholds 0.70-0.995
        assert np.all(np.diff(rates) <= 1e-12)
        assert rates[0] > s.target > rates[-1]
