"""The benchmark's paired ratio (bench/figures.py): a figure measured in fresh databases is
divided sample by sample by the baseline measured in the same database, not by the median of
baselines measured elsewhere (docs/performance.md, "The raw limit, and how figures are read")."""

from __future__ import annotations

import pytest

from bench.figures import Figure, Results, paired_ratio
from bench.report import goal_ratio


def test_a_paired_figure_is_the_median_of_its_samples_each_over_its_own_baseline() -> None:
    results = Results()
    results.add(Figure("raw", "raw", "ms", [20.0, 40.0, 60.0]))
    # each sample is 0.9x the raw figure of its own database; the medians' ratio says 1.35x
    results.add(Figure("tool", "tool", "ms", [54.0, 54.0, 18.0], "raw", pairs=[60.0, 60.0, 20.0]))
    results.add(Figure("unpaired", "tool", "ms", [54.0, 54.0, 18.0], "raw"))
    assert results.ratio("tool") == pytest.approx(0.9)
    assert results.ratio("unpaired") == pytest.approx(1.35)
    assert results.figures["tool"].as_dict()["paired_with"] == [60.0, 60.0, 20.0]


def test_a_paired_ratio_needs_one_baseline_per_sample() -> None:
    with pytest.raises(AssertionError):
        paired_ratio([1.0, 2.0], [1.0])


def test_a_paired_goal_shows_the_spread_of_its_runs() -> None:
    """A median on either side of the target says little when the runs straddle it."""
    results = Results()
    results.add(Figure("raw", "raw", "ms", [20.0, 40.0, 60.0]))
    results.add(Figure("tool", "tool", "ms", [24.0, 36.0, 60.0], "raw", pairs=[20.0, 40.0, 60.0]))
    goal = goal_ratio(results, "tool", 1.0, "tool <= raw")
    assert goal.met is True
    assert goal.measured == "1.00x (36.0 ms median; paired, per run 0.90-1.20x)"
    assert results.figures["raw"].paired_spread() is None
