"""deploy/grafana-dashboard.json queries only metrics the server exports, and covers each of them."""

from __future__ import annotations

import json
import re
from pathlib import Path

from prometheus_client import REGISTRY

import api.metrics  # noqa: F401 - registers the gateway's metrics
import inference.metrics  # registers the engine's metrics; read below
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


def engine_metric_names() -> set[str]:
    """The engine's metric families, every one labelled ``model_name`` (:mod:`inference.metrics`)."""
    from prometheus_client.metrics import MetricWrapperBase

    metrics = [m for m in vars(inference.metrics).values() if isinstance(m, MetricWrapperBase)]
    assert all("model_name" in metric._labelnames for metric in metrics)
    return {metric._name for metric in metrics}


def test_the_model_selector_narrows_every_engine_query_and_splits_it_by_model():
    dashboard = json.loads(DASHBOARD.read_text())
    variables = {variable["name"]: variable for variable in dashboard["templating"]["list"]}
    assert "model_name)" in variables["model_name"]["definition"]
    engine_names = engine_metric_names()
    assert "completions_generation_tokens" in engine_names
    narrowed = set()
    for panel in dashboard["panels"]:
        for target in panel.get("targets", ()):
            for name, labels in re.findall(r"\b(completions_[a-z0-9_]+)\{([^}]*)\}", target["expr"]):
                if any(name.startswith(family) for family in engine_names):
                    assert 'model_name=~"$model_name"' in labels, (panel["title"], target["expr"])
                    assert "{{model_name}}" in target["legendFormat"], panel["title"]
                    narrowed.add(name)
    assert len(narrowed) >= len(engine_names)
