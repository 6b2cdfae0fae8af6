"""The Grafana dashboard in deploy/ charts only metrics cairn exports."""

from __future__ import annotations

import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy" / "grafana" / "cairn-dashboard.json"
SOURCES = [
    *sorted((ROOT / "services" / "observability").glob("*.py")),
    ROOT / "services" / "api" / "routes_observability.py",
    ROOT / "services" / "api" / "cluster_gauges.py",
    ROOT / "services" / "agent" / "metrics.py",
]
SUFFIXES = ("_bucket", "_count", "_sum")


def test_every_metric_the_dashboard_charts_is_exported() -> None:
    """Each ``cairn_*`` name in a panel's query is declared by the observability code (less a
    histogram's suffix), and every panel has a query."""
    dashboard = json.loads(DASHBOARD.read_text())
    declared = set(re.findall(r'"(cairn_[a-z_]+)"', "\n".join(p.read_text() for p in SOURCES)))
    charted = set()
    for panel in dashboard["panels"]:
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            charted |= set(re.findall(r"cairn_[a-z_]+", target["expr"]))
    bare = {next((n.removesuffix(s) for s in SUFFIXES if n.endswith(s)), n) for n in charted}
    assert bare - declared == set()
