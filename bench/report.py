"""The one table a run prints, the goals under it, and ``bench/results/latest.json``."""

from __future__ import annotations

import json
import os
import platform
import subprocess
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.figures import Figure, Goal, Results

RESULTS_DIR = Path(__file__).resolve().parent / "results"


def machine() -> dict[str, Any]:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    memory_gb = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                memory_gb = round(int(line.split()[1]) / 1024 / 1024, 1)
    except OSError:
        pass
    try:
        load = os.getloadavg()[0]
    except OSError:
        load = None
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory_gb": memory_gb,
        "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "load_1min_at_end": load,
    }


def git_commit() -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
            cwd=Path(__file__).resolve().parent,
        )
    except (OSError, subprocess.CalledProcessError):
        return None
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=no"],
        capture_output=True,
        text=True,
        check=False,
        cwd=Path(__file__).resolve().parent,
    ).stdout.strip()
    return out.stdout.strip() + ("+dirty" if dirty else "")


def _number(value: float, unit: str) -> str:
    if unit == "tenants/min":
        return f"{value:,.0f}"
    if value >= 100:
        return f"{value:.0f}"
    if value >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}"


def _row(figure: Figure, results: Results) -> str:
    ratio = results.ratio(figure.key)
    ratio_text = f"{ratio:.3g}x {figure.baseline}" if ratio is not None else "baseline"
    if ratio is not None and figure.pairs is not None:
        ratio_text += " (paired: same database)"
    if figure.baseline is None and figure.note and figure.note != "baseline":
        ratio_text = figure.note
    extra = ""
    if figure.percentiles:
        extra = (
            f" p50 {_number(figure.p(50), figure.unit)} p99 {_number(figure.p(99), figure.unit)}"
        )
    return (
        f"{figure.label:<58} {figure.unit:>11} {len(figure.samples):>4} "
        f"{_number(figure.median, figure.unit):>9} {_number(figure.low, figure.unit):>9} "
        f"{_number(figure.high, figure.unit):>9}  {ratio_text}{extra}"
    )


def render(results: Results, header: dict[str, Any]) -> str:
    lines = [
        f"provisioner benchmarks - {header['when']} - commit {header['commit']}",
        f"machine: {header['machine']['cpu']}, {header['machine']['cores']} cores, "
        f"{header['machine']['memory_gb']} GB; {header['server']}; Python "
        f"{header['machine']['python']}",
        "",
        f"{'figure':<58} {'unit':>11} {'n':>4} {'median':>9} {'min':>9} {'max':>9}  ratio",
        "-" * 126,
    ]
    lines += [_row(figure, results) for figure in results.figures.values()]
    lines += ["", "goals (ratios and limits measured in this run):"]
    for goal in results.goals:
        mark = {True: "MET ", False: "GAP ", None: "n/a "}[goal.met]
        lines.append(f"  [{mark}] {goal.name}: target {goal.target}; measured {goal.measured}")
        if goal.comment:
            lines.append(f"          {goal.comment}")
    for title, text in results.notes.items():
        lines += ["", f"{title}:", *("  " + line for line in text.splitlines())]
    return "\n".join(lines)


def write_json(results: Results, header: dict[str, Any], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    document = {
        **header,
        "figures": {key: figure.as_dict() for key, figure in results.figures.items()},
        "ratios": {
            key: round(ratio, 3)
            for key in results.figures
            if (ratio := results.ratio(key)) is not None
        },
        "goals": [goal.as_dict() for goal in results.goals],
        "notes": results.notes,
        "extra": results.extra,
    }
    path.write_text(json.dumps(document, indent=2, default=str) + "\n")


def header(server: str) -> dict[str, Any]:
    return {
        "when": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "commit": git_commit(),
        "machine": machine(),
        "server": server,
    }


def goal_ratio(
    results: Results, key: str, limit: float, name: str, *, at_most: bool = True
) -> Goal:
    ratio = results.ratio(key)
    figure = results.figures.get(key)
    if ratio is None or figure is None:
        return Goal(name, f"{'<=' if at_most else '>='} {limit}x", "not measured", None)
    met = ratio <= limit if at_most else ratio >= limit
    gap = ""
    if not met:
        gap = f"gap: {ratio - limit:+.3f}x beyond the target"
    measured = f"{ratio:.2f}x ({_number(figure.median, figure.unit)} {figure.unit} median"
    spread = figure.paired_spread()
    if spread is not None:
        measured += f"; paired, per run {spread}"
    return Goal(
        name, f"{'<=' if at_most else '>='} {limit:g}x {figure.baseline}", f"{measured})", met, gap
    )
