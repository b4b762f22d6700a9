"""``GET /metrics`` on a real node after real jobs, read with prometheus-client's parser."""

from __future__ import annotations

import grpc
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from protomolt_jobs.telemetry.metrics import REGISTRY
from tests.support.grpc_servers import TestServices, seed_workflow
from tests.support.node import http, node_environ, start_node, wait_for

TOKEN = "metrics-secret"


def _families(text: str) -> dict[str, object]:
    # Longest names first, so a sample name finds its own family, not a prefix of it.
    found = {f.name: f for f in text_string_to_metric_families(text)}
    return dict(sorted(found.items(), key=lambda kv: -len(kv[0])))


def _value(families, name: str, **labels: str) -> float:
    """The sum of sample ``name``'s values matching ``labels`` (0 when there is none)."""
    family = next((f for f in families.values() if name.startswith(f.name)), None)
    if family is None:
        return 0.0
    return sum(
        s.value
        for s in family.samples
        if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
    )


def _scrape(url: str, headers: dict[str, str] | None = None) -> tuple[int, str]:
    status, body, hdrs = http("GET", f"{url}/metrics", headers=headers)
    content_type = {k.lower(): v for k, v in hdrs.items()}.get("content-type", "")
    assert status != 200 or content_type.startswith("text/plain; version=0.0.4")
    return status, body.decode() if isinstance(body, bytes) else str(body)


def test_metrics_after_jobs_show_completions_step_histograms_and_run_counts(tmp_path, fresh_dsn):
    with TestServices(max_workers=8) as services:
        surfaces = start_node(node_environ(tmp_path, fresh_dsn, token=TOKEN))
        auth = {"Authorization": f"Bearer {TOKEN}"}
        try:
            url = surfaces.http.url
            flow = seed_workflow(services.target, review="invoke")
            # The process's registry may hold other tests' runs: compare with its values before
            # (read in process: a scrape now would also cache the run counts for 5 s).
            before = _families(generate_latest(REGISTRY).decode())
            # One run is retried: its second claim is not a first claim.
            services.fail_next("Tokenize", 1, grpc.StatusCode.UNAVAILABLE, "warming up")
            ids = []
            for i in range(5):
                status, answer, _ = http(
                    "POST",
                    f"{url}/protomolt/actions/submit-workflow",
                    {"workflow": flow, "input": {"text": f"hello metrics {i}"}},
                    headers=auth,
                )
                assert status == 200 and answer["ok"], answer
                ids.append(answer["jobId"])

            def all_completed():
                states = [
                    http("POST", f"{url}/protomolt/actions/get-job", {"jobId": j}, headers=auth)[1]
                    for j in ids
                ]
                return all(s["job"]["status"] == "COMPLETED" for s in states)

            wait_for(all_completed, timeout_s=60)

            # Behind the token by default.
            assert _scrape(url)[0] == 401
            status, text = _scrape(url, auth)
            assert status == 200
            families = _families(text)
            assert _value(families, "protomolt_jobs_settled_total", outcome="completed") >= 5
            # Issue 31: every outcome exported from the start, no _created series.
            settled = {s.labels["outcome"] for s in families["protomolt_jobs_settled"].samples}
            assert {"controlled", "abandoned", "unsettled"} <= settled, settled
            assert "_created" not in text, [ln for ln in text.splitlines() if "_created" in ln]
            # Queue wait and end-to-end by workflow and queue: one sample per run.
            run = {"workflow": "seed-review", "queue": "default"}
            assert _value(families, "protomolt_jobs_settled_total", outcome="retried") >= 1
            for name in ("queue_wait", "end_to_end"):
                count = _value(families, f"protomolt_jobs_{name}_seconds_count", **run)
                count -= _value(before, f"protomolt_jobs_{name}_seconds_count", **run)
                assert count == 5, (name, count)
                total = _value(families, f"protomolt_jobs_{name}_seconds_sum", **run)
                assert total > _value(before, f"protomolt_jobs_{name}_seconds_sum", **run), name
            assert _value(families, "protomolt_jobs_claims_total") >= 5
            method = "/jobs.test.Tokenizer/Tokenize"
            assert (
                _value(
                    families,
                    "protomolt_jobs_step_duration_seconds_count",
                    workflow=run["workflow"],
                    method=method,
                    outcome="OK",
                )
                >= 5
            )
            buckets = [
                s
                for s in families["protomolt_jobs_step_duration_seconds"].samples
                if s.name.endswith("_bucket") and s.labels["method"] == method
            ]
            assert buckets and buckets[-1].labels["le"] == "+Inf"
            # The node's collector: counts from the database (this database holds only these).
            assert _value(families, "protomolt_jobs_runs", status="COMPLETED", queue="default") == 5
            assert _value(families, "protomolt_jobs_runs", status="DEAD") == 0
            # No broker: every event waits in the outbox.
            assert _value(families, "protomolt_jobs_outbox_pending") > 0
            assert _value(families, "protomolt_jobs_component_up", component="store") == 1
            assert _value(families, "protomolt_jobs_component_up", component="worker") == 1
            # Low cardinality: no job id anywhere in a label.
            for family in families.values():
                for sample in family.samples:
                    assert not any(j in v for j in ids for v in sample.labels.values())
        finally:
            surfaces.close()


def test_metrics_public_serves_without_the_token(tmp_path, fresh_dsn):
    env = node_environ(tmp_path, fresh_dsn, token=TOKEN)
    env["PROTOMOLT_NODE_METRICS_PUBLIC"] = "true"
    surfaces = start_node(env)
    try:
        status, text = _scrape(surfaces.http.url)
        assert status == 200 and "protomolt_jobs_runs" in text
        # Only /metrics: the verbs still need the token.
        status, _, _ = http("GET", f"{surfaces.http.url}/protomolt/actions")
        assert status == 401
    finally:
        surfaces.close()
