"""What a benchmark run measures: figures (repeated samples, a baseline to divide by), goals,
and the notes that go with them.

Absolute times drift on a shared machine; a ratio to a baseline measured in the same run holds.
Every figure therefore names its baseline, and the table prints ``median / baseline median``.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any


def percentile(samples: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of the samples."""
    ordered = sorted(samples)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


@dataclass
class Figure:
    key: str
    label: str
    unit: str  # 'ms' or 'tenants/min'
    samples: list[float]
    baseline: str | None = None  # key of the figure this one is divided by
    note: str = ""
    percentiles: bool = False  # print p50/p99 as well
    #: each sample's own baseline, measured in the same database right before or after it: the
    #: ratio is then the median of the per-sample ratios. Why: the same DDL costs up to 2x more
    #: from one run to the next, seconds apart (raw builds 23-56 ms a tenant; this machine's
    #: fsync latency swings 0.13-0.36 ms p50 from one second to the next), so a baseline
    #: measured in another database, minutes earlier, swung ratios between 0.45x and 1.4x.
    pairs: list[float] | None = None

    @property
    def median(self) -> float:
        return statistics.median(self.samples)

    @property
    def low(self) -> float:
        return min(self.samples)

    @property
    def high(self) -> float:
        return max(self.samples)

    def p(self, q: float) -> float:
        return percentile(self.samples, q)

    def paired_spread(self) -> str | None:
        """The :func:`spread` of a paired figure's per-sample ratios (None: not paired): a goal
        read off the median alone flips between runs when the spread straddles its target."""
        return None if self.pairs is None else spread(paired_ratios(self.samples, self.pairs))

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "label": self.label,
            "unit": self.unit,
            "n": len(self.samples),
            "median": round(self.median, 3),
            "min": round(self.low, 3),
            "max": round(self.high, 3),
            "baseline": self.baseline,
            "note": self.note,
        }
        if self.pairs is not None:
            out["paired_with"] = [round(v, 3) for v in self.pairs]
        if self.percentiles:
            out["p50"] = round(self.p(50), 3)
            out["p99"] = round(self.p(99), 3)
        return out


@dataclass
class Goal:
    name: str
    target: str
    measured: str
    met: bool | None  # None: not measured in this run
    comment: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "target": self.target,
            "measured": self.measured,
            "met": self.met,
            "comment": self.comment,
        }


@dataclass
class Results:
    figures: dict[str, Figure] = field(default_factory=dict)
    goals: list[Goal] = field(default_factory=list)
    #: Named blocks of text printed after the table (EXPLAIN output, step breakdowns).
    notes: dict[str, str] = field(default_factory=dict)
    #: Scenario data that is not a figure (per-block scale table, step breakdowns).
    extra: dict[str, Any] = field(default_factory=dict)

    def add(self, figure: Figure) -> Figure:
        self.figures[figure.key] = figure
        return figure

    def ratio(self, key: str) -> float | None:
        figure = self.figures.get(key)
        if figure is None or figure.baseline is None or figure.baseline not in self.figures:
            return None
        if figure.pairs is not None:
            return paired_ratio(figure.samples, figure.pairs)
        return figure.median / self.figures[figure.baseline].median


def paired_ratios(samples: list[float], baselines: list[float]) -> list[float]:
    """Each sample divided by its own baseline (see :attr:`Figure.pairs`)."""
    assert len(samples) == len(baselines), "one baseline per sample"
    return [s / b for s, b in zip(samples, baselines, strict=True)]


def paired_ratio(samples: list[float], baselines: list[float]) -> float:
    """The median of :func:`paired_ratios`."""
    return statistics.median(paired_ratios(samples, baselines))


def spread(ratios: Iterable[float]) -> str:
    """The lowest and highest of a goal's per-run ratios, as printed beside its median (the runs
    may straddle the target)."""
    found = list(ratios)
    return f"{min(found):.2f}-{max(found):.2f}x" if found else "no runs"


def timed_ms(action: Callable[[], object]) -> float:
    """Wall time of one call, in milliseconds."""
    started = time.perf_counter()
    action()
    return (time.perf_counter() - started) * 1000
