"""The example Grafana dashboard (infra/grafana/) queries only metrics the worker serves, as
docs/metrics.md lists them."""

from __future__ import annotations

import json
import re

from tests.conftest import ROOT

DASHBOARD = ROOT / "infra" / "grafana" / "provisioner-dashboard.json"


def test_the_dashboard_queries_only_documented_metrics() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    queried = {
        re.sub(r"_(bucket|count|sum|total)$", "", name)
        for panel in dashboard["panels"]
        for target in panel["targets"]
        for name in re.findall(r"provisioner_[a-z_]+", target["expr"])
    }
    documented = set(
        re.findall(r"^\| `(provisioner_[a-z_]+)`", (ROOT / "docs" / "metrics.md").read_text(), re.M)
    )
    documented = {re.sub(r"_total$", "", name) for name in documented}
    assert queried and queried <= documented, queried - documented
    assert {
        "provisioner_jobs",
        "provisioner_queue_jobs",
        "provisioner_step_duration_seconds",
    } <= queried
