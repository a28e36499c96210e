"""Where a judge cuts (cache_core.decision.judge_cuts): the sources' rule and the unseen-kind rule."""
from __future__ import annotations

import numpy as np

from cache_core.decision.judge_cuts import (NOTHING, best_cut_served, cut_serving, left_out_kind_point,
                                            served_share, strictest_over_sources, unseen_kind_cuts)
from cache_core.decision.judge_shared_pairs import human_pairs
from infra.runtime import shared_data_dir


def test_cut_serving_serves_at_most_the_share_and_nothing_below_one_duplicate():
    prob = np.array([0.9, 0.8, 0.7, 0.6, 0.5, 0.95])
    y = np.array([1, 1, 1, 1, 0, 0])
    assert cut_serving(prob, y, 0.5) == 0.8 and served_share(prob, y, 0.8) == 0.5
    assert cut_serving(prob, y, 0.74) == 0.8  # 2.96 duplicates: two, never a third
    assert cut_serving(prob, y, 1.0) == 0.6
    assert cut_serving(prob, y, 0.2) == NOTHING and served_share(prob, y, NOTHING) == 0.0


def test_strictest_over_sources_skips_a_source_no_cut_holds_on():
    per_source = {"a": {"0.05": {"accept_at": 0.7, "false_hit": 0.03}},
                  "b": {"0.05": {"accept_at": NOTHING, "false_hit": None}}}
    assert strictest_over_sources({"0.05": 0.6}, per_source) == {"0.05": 0.7}


def _shifted_kind(rng, n=4000):
    """A left-out kind whose wrong pairs score as high as its duplicates above 0.8: only the very top holds."""
    y = (rng.random(n) < 0.5).astype(int)
    prob = np.where(y == 1, rng.uniform(0.5, 1.0, n), rng.uniform(0.0, 0.95, n))
    return prob, y


def test_a_left_out_kind_that_needs_a_strict_cut_raises_the_shipped_one_by_what_it_cost():
    rng = np.random.default_rng(0)
    known_prob = rng.uniform(0, 1, 2000)
    known_y = (rng.random(2000) < known_prob).astype(int)
    prob_kind, y_kind = _shifted_kind(rng)
    point = left_out_kind_point(prob_kind, y_kind, known_prob, known_y)["0.05"]
    assert point["accept_at"] > 0.9  # the wrong pairs reach 0.95: the cut that holds 5% sits near it
    assert point["known_share"] == served_share(known_prob, known_y, point["accept_at"])
    easy = {"0.05": {"accept_at": 0.6, "false_hit": 0.01, "known_share": 0.8}}
    lost = {"0.05": {"accept_at": NOTHING, "false_hit": None, "known_share": None}}
    final_prob, final_y = rng.uniform(0, 1, 1000), rng.integers(0, 2, 1000)
    cuts = unseen_kind_cuts({"0.05": 0.5}, final_prob, final_y,
                            {"easy": easy, "shifted": {"0.05": point}, "lost": lost})
    # the shifted kind's share decides (the smaller), the kind no cut held on is left out
    assert served_share(final_prob, final_y, cuts["0.05"]) <= point["known_share"] + 1e-9
    assert cuts["0.05"] == cut_serving(final_prob, final_y, point["known_share"])
    # never looser than the cut it is given; no kind that held: the given cut
    assert unseen_kind_cuts({"0.05": 0.999}, final_prob, final_y, {"shifted": {"0.05": point}}) == {"0.05": 0.999}
    assert unseen_kind_cuts({"0.05": 0.5}, final_prob, final_y, {"lost": lost}) == {"0.05": 0.5}
    # a cut that already serves no more than the share stays where it is
    assert unseen_kind_cuts({"0.05": 0.5}, final_prob, final_y, {"easy": {"0.05": {"known_share": 1.0}}}) == \
        {"0.05": 0.5}


def test_a_tighter_target_is_never_cut_below_a_looser_one():
    rng = np.random.default_rng(1)
    prob, y = rng.uniform(0, 1, 1000), rng.integers(0, 2, 1000)
    left_out = {"k": {"0.02": {"known_share": None}, "0.05": {"known_share": 0.1}, "0.10": {"known_share": 0.3}}}
    cuts = unseen_kind_cuts({"0.02": 0.6, "0.05": 0.5, "0.10": 0.4}, prob, y, left_out)
    assert cuts["0.05"] == cut_serving(prob, y, 0.1) and cuts["0.10"] == cut_serving(prob, y, 0.3)
    assert cuts["0.02"] == cuts["0.05"] > 0.6  # no kind held 2%: it takes the 5% cut, not its own looser one


def test_the_best_cut_counts_duplicates_a_floor_keeps_out_as_missed():
    score = np.array([0.99, 0.95, 0.90, 0.80, 0.70])
    y = np.array([1, 0, 1, 1, 1])
    assert best_cut_served(score, y, 0.05) == 0.25  # only 0.99: the next cut serves a wrong one
    assert best_cut_served(score, y, 0.25) == 1.0  # everything, 1 wrong of 5 hits
    floor = score >= 0.85
    assert best_cut_served(score, y, 0.40, floor) == 0.5  # two of the four duplicates are above the floor
    assert best_cut_served(score, y, 0.40, np.zeros(5, dtype=bool)) == 0.0


def test_the_human_labelled_sets_read_as_given_without_an_encoder():
    mrpc, stsb = human_pairs(shared_data_dir(), "mrpc"), human_pairs(shared_data_dir(), "stsb")
    assert {k: len(v) for k, v in mrpc.items()} == {"mrpc-train": 4075, "mrpc-test": 1724}
    assert sum(row[2] for row in mrpc["mrpc-test"]) == 1146
    assert {k: len(v) for k, v in stsb.items()} == {"stsb-train": 3770, "stsb-test": 954}
    assert all(row[3] == "stsb" and row[2] in (0, 1) for row in stsb["stsb-test"])
