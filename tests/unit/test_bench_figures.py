"""The benchmark's paired ratio (bench/figures.py): a figure measured in fresh databases is
divided sample by sample by the baseline measured in the same database, not by the median of
baselines measured elsewhere (docs/performance.md, "The raw limit, and how figures are read")."""

from __future__ import annotations

import pytest

from bench.figures import Figure, Results, paired_ratio


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
