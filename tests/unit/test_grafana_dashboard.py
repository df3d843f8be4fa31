"""deploy/grafana-dashboard.json queries only metrics the server exports, and covers each of them."""

from __future__ import annotations

import json
import re
from pathlib import Path

from prometheus_client import REGISTRY

import api.metrics  # noqa: F401 - registers the gateway's metrics
import inference.metrics  # noqa: F401 - registers the engine's metrics
import keys.metrics  # noqa: F401 - registers the limiter's metrics

DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana-dashboard.json"


SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_count", "_sum"), "gauge": ("",)}


def exported_samples() -> set[str]:
    """Every sample name of our metrics (``_total``, ``_bucket``, ...) as a scrape shows them, labelled
    ones included before their first sample."""
    return {
        family.name + suffix
        for family in REGISTRY.collect()
        if family.name.startswith("completions_")
        for suffix in SUFFIXES[family.type]
    }


def queried() -> set[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [target["expr"] for panel in dashboard["panels"] for target in panel.get("targets", ())]
    return {name for expr in exprs for name in re.findall(r"\bcompletions_[a-z0-9_]+", expr)}


def test_every_queried_metric_is_exported():
    assert queried() - exported_samples() == set()


def test_every_exported_metric_has_a_panel():
    families = {family.name for family in REGISTRY.collect() if family.name.startswith("completions_")}
    shown = {name for name in families if any(q.startswith(name) for q in queried())}
    assert families - shown == set()
