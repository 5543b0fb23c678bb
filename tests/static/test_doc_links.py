"""Links between the README and docs/ point at files and headings that exist, and the dated
measurement history stays out of docs/ (it lives in commit messages and the CHANGELOG)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.static.lint_tools import REPO_ROOT

PAGES = [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
CODE = re.compile(r"```.*?```", re.S)


def anchors(page: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces as hyphens."""
    headings = re.findall(r"^#{1,6} (.+)$", CODE.sub("", page.read_text()), re.M)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in headings}


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(REPO_ROOT).as_posix())
def test_every_relative_link_resolves(page: Path) -> None:
    broken = []
    for target in LINK.findall(CODE.sub("", page.read_text())):
        if re.match(r"[a-z]+://", target):
            continue
        path, _, anchor = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        if not linked.exists() or (anchor and anchor not in anchors(linked)):
            broken.append(target)
    assert broken == []


def test_docs_hold_no_dated_measurement_history() -> None:
    assert not (REPO_ROOT / "docs" / "PERFORMANCE.md").exists()
    for page in PAGES:
        dated = re.findall(r"^#+ .*\b20\d\d-\d\d-\d\d\b.*$", page.read_text(), re.M)
        assert dated == [], page


def test_the_readme_stays_short_and_the_performance_page_too() -> None:
    assert len((REPO_ROOT / "README.md").read_text().splitlines()) <= 330
    assert len((REPO_ROOT / "docs" / "performance.md").read_text().splitlines()) <= 400
