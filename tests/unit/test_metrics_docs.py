"""docs/operations.md and docs/grafana-dashboard.json against telemetry/metrics.py (issue 31
item 6): every series the process and a node export is in the docs' table, and every metric
the shipped Grafana dashboard (and the docs' alert rules) query exists. The exposition itself
parses with prometheus-client's parser (``promtool`` is not installed here)."""

from __future__ import annotations

import json
import re
from pathlib import Path

from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from protomolt_jobs.telemetry import metrics

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs" / "operations.md"
GRAFANA = ROOT / "docs" / "grafana-dashboard.json"
_METRIC = re.compile(r"\bprotomolt_jobs_[a-z_]+\b")


class _Counts:
    def metrics_counts(self):
        return {("RECOVERY_REQUIRED", "default"): 2}, 3


def _exported() -> dict[str, str]:
    """``{family name: type}`` of everything a node's ``/metrics`` can export."""
    metrics.observe_run("docs-test", "default", waited_s=0.5, total_s=2.0)
    metrics.observe_step("docs", "/jobs.test.Tokenizer/Tokenize", "OK", 0.01)
    node = CollectorRegistry()
    node.register(metrics.StoreCollector(_Counts(), lambda: {"worker": True}))
    text = metrics.exposition(node).decode()
    return {f.name: f.type for f in text_string_to_metric_families(text)}


def _series(families: dict[str, str]) -> set[str]:
    """The sample names a query may use for each family."""
    names: set[str] = set()
    for name, kind in families.items():
        if kind == "counter":
            names.add(f"{name}_total")
        elif kind == "histogram":
            names |= {f"{name}_bucket", f"{name}_sum", f"{name}_count", name}
        else:
            names.add(name)
    return names


def test_every_exported_series_is_in_the_docs_table():
    families = _exported()
    assert "protomolt_jobs_queue_wait_seconds" in families
    assert "protomolt_jobs_end_to_end_seconds" in families
    text = DOCS.read_text()
    for name, kind in families.items():
        shown = f"{name}_total" if kind == "counter" else name
        assert f"| `{shown}` |" in text, shown
    assert 'settled_total{outcome="controlled"}' in text


def test_the_grafana_dashboard_queries_only_metrics_that_exist():
    board = json.loads(GRAFANA.read_text())
    assert board["title"] and board["panels"]
    series = _series(_exported())
    queried: set[str] = set()
    for panel in board["panels"]:
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            found = set(_METRIC.findall(target["expr"]))
            assert found, (panel["title"], target["expr"])
            queried |= found
    assert queried <= series, queried - series
    # every family a node exports has a panel
    covered = {re.sub(r"_(bucket|sum|count|total)$", "", n) for n in queried}
    assert covered >= set(_exported()), set(_exported()) - covered


def test_the_docs_alert_rules_query_only_metrics_that_exist():
    text = DOCS.read_text()
    start = text.index("```yaml\ngroups:")
    rules = text[start : text.index("```", start + 7)]
    found = set(_METRIC.findall(rules))
    assert found and found <= _series(_exported()), found - _series(_exported())
    for alert in ("OutboxStuck", "RecoveryRequiredGrowing", "QueueWaitP95High"):
        assert f"alert: {alert}" in rules
