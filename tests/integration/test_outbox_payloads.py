"""``jobs.outbox_payloads``: the column rows' payload encoded in SQL (migration 0012) is
byte for byte what ``events.column_payload`` makes, and a Java relay on a shared outbox
(upstream's relay SQL, ``parseFrom(payload)``) publishes every row our workers wrote in the
``always`` mode, while in the default ``columns`` mode it meets NULL payloads."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta, timezone

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from protomolt_jobs.app import JobsApp
from protomolt_jobs.config import JobsConfig
from protomolt_jobs.pb.ai.pipestream.proto.jobs.v1.jobs_pb2 import WorkflowRunEvent
from protomolt_jobs.store import JobStore
from protomolt_jobs.store.events import (
    MAX_ERROR_CHARS,
    MAX_NAME_CHARS,
    MAX_VERDICT_CHARS,
    column_payload,
    event_violations,
)
from protomolt_jobs.workflow import Runtime
from tests.support.factories import claimed_job, queued_job
from tests.support.grpc_servers import TestServices, seed_workflow
from tests.support.node import wait_for
from tests.support.upstream import upstream_classes

PAYLOAD_SQL = (
    "SELECT workflow_run_event_payload(%(event_id)s, %(event_type)s, %(kafka_key)s,"
    " %(created_at)s, %(workflow_name)s, %(attempt)s, %(status_after)s, %(step)s,"
    " %(verdict)s, %(error)s)"
)

# Text PostgreSQL can hold (no NUL, no lone surrogate): ASCII, two-byte, three-byte and
# astral (four-byte UTF-8, two UTF-16 units in Java) code points.
_ALPHABET = st.one_of(
    st.characters(min_codepoint=1, max_codepoint=0x7F),
    st.sampled_from("éß€中\u200b\ufeff"),
    st.sampled_from("𝄞😀🧪\U0010fffd"),
    st.characters(min_codepoint=1, exclude_categories=("Cs",)),
)


def _text_around(limit: int) -> st.SearchStrategy[str | None]:
    """None, empty, short, or a length at or around ``limit`` code points."""
    lengths = st.one_of(
        st.sampled_from([1, limit - 1, limit, limit + 1, limit + 7]),
        st.integers(min_value=0, max_value=limit + 50),
    )
    return st.one_of(
        st.none(),
        st.just(""),
        st.text(_ALPHABET, max_size=20),
        lengths.flatmap(
            lambda n: st.text(_ALPHABET, min_size=1, max_size=3).map(lambda s: (s * n)[:n])
        ),
    )


_TYPE_NAMES = [WorkflowRunEvent.Type.Name(n) for n in WorkflowRunEvent.Type.values()]
_TYPES = [name.removeprefix("TYPE_") for name in _TYPE_NAMES]
_EVENT_TYPES = st.one_of(
    st.sampled_from(_TYPES),
    st.sampled_from(_TYPE_NAMES),  # a TYPE_ prefix names the same type
    st.sampled_from(["", "TYPE_", "accepted", "TYPE_TYPE_ACCEPTED", "BOGUS"]),
)
_ZONES = st.sampled_from(
    [UTC, timezone(timedelta(hours=5, minutes=30)), timezone(-timedelta(hours=8))]
)
_CREATED_AT = st.one_of(
    st.datetimes(
        min_value=datetime(1900, 1, 1),
        max_value=datetime(2200, 1, 1),
        timezones=_ZONES,
    ),
    # whole seconds (no nanos), the epoch and the second before it (negative seconds)
    st.datetimes(min_value=datetime(1960, 1, 1), max_value=datetime(2100, 1, 1)).map(
        lambda d: d.replace(microsecond=0, tzinfo=UTC)
    ),
    st.sampled_from(
        [
            datetime(1970, 1, 1, tzinfo=UTC),
            datetime(1969, 12, 31, 23, 59, 59, 999_999, tzinfo=UTC),
            datetime(1970, 1, 1, 0, 0, 0, 1, tzinfo=UTC),
        ]
    ),
)
_ATTEMPTS = st.one_of(
    st.none(),
    st.integers(min_value=0, max_value=3),
    st.sampled_from([127, 128, 16_383, 16_384, 2**21, 2**28, 2**31 - 1]),
    st.integers(min_value=0, max_value=2**31 - 1),
    st.integers(min_value=-(2**31), max_value=-1),  # never written, encoded as protobuf does
)
_ROWS = st.fixed_dictionaries(
    {
        "event_id": st.uuids(),
        "event_type": _EVENT_TYPES,
        "kafka_key": st.one_of(st.uuids().map(str), st.just("")),
        "created_at": _CREATED_AT,
        "workflow_name": _text_around(MAX_NAME_CHARS),
        "attempt": _ATTEMPTS,
        "status_after": st.one_of(
            st.sampled_from(["QUEUED", "RUNNING", "WAITING", "COMPLETED", "CANCELLED", ""]),
            st.none(),
            _text_around(200),
        ),
        "step": _text_around(MAX_NAME_CHARS),
        "verdict": _text_around(MAX_VERDICT_CHARS),
        "error": _text_around(MAX_ERROR_CHARS),
    }
)


@pytest.fixture(scope="module")
def conn(pg_template):
    from tests.support import pg

    name = pg.new_name("pmjt_payload")
    dsn = pg.create_database(name, template=pg_template)
    try:
        with psycopg.connect(dsn, autocommit=True) as c:
            yield c
    finally:
        pg.drop_database(name)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(row=_ROWS)
def test_the_sql_encoder_writes_the_bytes_column_payload_writes(conn, row):
    encoded = conn.execute(PAYLOAD_SQL, row).fetchone()[0]
    assert bytes(encoded) == column_payload(row)


@pytest.mark.parametrize("event_type", _TYPES)
def test_every_event_type_at_every_limit_encodes_alike(conn, event_type):
    for limit_delta in (-1, 0, 1):
        row = {
            "event_id": uuid.uuid4(),
            "event_type": event_type,
            "kafka_key": str(uuid.uuid4()),
            "created_at": datetime(2026, 12, 2, 9, 47, 33, 123_456, tzinfo=UTC),
            "workflow_name": "w𝄞" * ((MAX_NAME_CHARS + limit_delta) // 2 + 1),
            "attempt": 7,
            "status_after": "RUNNING",
            "step": "é" * (MAX_NAME_CHARS + limit_delta),
            "verdict": "😀" * (MAX_VERDICT_CHARS + limit_delta),
            "error": "x" * (MAX_ERROR_CHARS + limit_delta),
        }
        encoded = bytes(conn.execute(PAYLOAD_SQL, row).fetchone()[0])
        assert encoded == column_payload(row)
        event = WorkflowRunEvent.FromString(encoded)
        assert len(event.error) == min(MAX_ERROR_CHARS, MAX_ERROR_CHARS + limit_delta)


# -- the store in each mode ------------------------------------------------------------------

_COLUMN_ROWS = (
    "SELECT event_id, event_type, payload, kafka_key, created_at, workflow_name, attempt,"
    " status_after, step, verdict, error FROM workflow_run_events_outbox ORDER BY seq"
)


def _outbox(dsn: str) -> list[dict]:
    with psycopg.connect(dsn, autocommit=True) as c:
        cur = c.execute(_COLUMN_ROWS)
        names = [d.name for d in cur.description]
        return [dict(zip(names, r, strict=True)) for r in cur.fetchall()]


def _settle_every_way(store: JobStore) -> None:
    """Column rows of the submit and each fenced write with an event."""
    a = claimed_job(store)
    store.job_checkpoint(a.lease, {"name": "first", "skipped": False, "response": {}})
    store.job_complete(a.lease, result={"ok": True}, verdict="done ✓")
    b = claimed_job(store)
    store.job_park(b.lease, "approve")
    c = claimed_job(store)
    store.job_fail(c.lease, "VALIDATION: bad 𝄞", step="first")
    d = claimed_job(store)
    store.job_dead(d.lease, "GRPC: unavailable", step="first")
    queued_job(store)


def test_always_mode_writes_every_row_with_the_payload_our_relay_would_encode(fresh_dsn):
    store = JobStore.open(fresh_dsn, max_size=2, outbox_payloads="always")
    try:
        _settle_every_way(store)
    finally:
        store.close()
    rows = _outbox(fresh_dsn)
    assert {r["event_type"] for r in rows} >= {
        "ACCEPTED",
        "STEP_CHECKPOINT",
        "COMPLETED",
        "WAITING",
        "FAILED",
        "DEAD",
    }
    for row in rows:
        assert row["payload"] is not None, row
        assert bytes(row["payload"]) == column_payload(row)
        assert event_violations(WorkflowRunEvent.FromString(bytes(row["payload"]))) == []


def test_our_relay_claims_the_stored_payloads_of_the_always_mode_and_they_pass_its_check(
    fresh_dsn,
):
    from protomolt_jobs.kafka.relay import inspect_payload

    store = JobStore.open(fresh_dsn, max_size=2, outbox_payloads="always")
    try:
        _settle_every_way(store)
        stored = {r["event_id"]: bytes(r["payload"]) for r in _outbox(fresh_dsn)}
        claimed = []
        while batch := store.outbox_claim(100):
            claimed += batch
            store.outbox_mark_published([r.event_id for r in batch])
    finally:
        store.close()
    assert {r.event_id for r in claimed} == set(stored)
    for row in claimed:
        assert row.payload == stored[row.event_id]
        event, problem = inspect_payload(row.payload, row.kafka_key)
        assert problem is None and event is not None


def test_default_mode_leaves_the_column_rows_without_a_payload(fresh_dsn):
    store = JobStore.open(fresh_dsn, max_size=2)
    try:
        _settle_every_way(store)
    finally:
        store.close()
    rows = _outbox(fresh_dsn)
    assert rows and all(r["payload"] is None for r in rows)


def test_a_misspelt_mode_is_refused():
    with pytest.raises(ValueError, match="outbox_payloads"):
        JobsConfig(dsn="postgresql:///x", outbox_payloads="alway")
    with pytest.raises(ValueError, match="outbox_payloads"):
        JobStore.open("postgresql:///x", outbox_payloads="payloads")


# -- upstream's relay on the shared outbox ---------------------------------------------------

# Upstream's JdbcWorkflowRunStore SQL (reference/upstream-jobs.md section 2): poll, mark
# published, mark failed (attempts + 1, FAILED at 10).
UPSTREAM_POLL = (
    "SELECT event_id, event_type, payload, kafka_key, attempts, status, created_at,"
    " published_at, last_error FROM workflow_run_events_outbox WHERE status='PENDING'"
    " ORDER BY created_at ASC, event_id ASC LIMIT %s FOR UPDATE SKIP LOCKED"
)
UPSTREAM_MARK_PUBLISHED = (
    "UPDATE workflow_run_events_outbox SET status='PUBLISHED', published_at=%s"
    " WHERE event_id=%s AND status='PENDING'"
)
UPSTREAM_MARK_FAILED = (
    "UPDATE workflow_run_events_outbox SET attempts=attempts + 1,"
    " status=CASE WHEN attempts + 1 >= 10 THEN 'FAILED' ELSE status END, last_error=%s"
    " WHERE event_id=%s AND status='PENDING'"
)


def _upstream_relay_drain(dsn: str) -> tuple[int, list[str]]:
    """Upstream's relayOnce until the outbox has no PENDING row: each row's payload parsed as
    upstream's ``WorkflowRunEvent`` (``parseFrom``), then marked PUBLISHED; a row that does not
    parse is marked failed (FAILED at its 10th failure).

    :returns: (rows published, the parse failures' messages).
    """
    event_cls, _ = upstream_classes()
    published, failures = 0, []
    with psycopg.connect(dsn) as c:  # the JDBC store's transactions, not autocommit
        while True:
            with c.transaction():
                batch = c.execute(UPSTREAM_POLL, (100,)).fetchall()
            if not batch:
                return published, failures
            for event_id, _type, payload, key, *_ in batch:
                try:
                    if payload is None:
                        raise TypeError("parseFrom(null): NullPointerException")
                    event = event_cls.FromString(bytes(payload))
                    assert event.event_id == str(event_id) and event.job_id == key
                except (TypeError, ValueError) as exc:
                    failures.append(f"{event_id}: {exc}")
                    with c.transaction():
                        c.execute(UPSTREAM_MARK_FAILED, (str(exc), event_id))
                    continue
                with c.transaction():
                    cur = c.execute(UPSTREAM_MARK_PUBLISHED, (datetime.now(UTC), event_id))
                    published += cur.rowcount


@pytest.fixture(scope="module")
def services():
    with TestServices(max_workers=16) as s:
        yield s


def _run_jobs(dsn: str, services: TestServices, mode: str, n: int) -> None:
    """Our workers run ``n`` three-step jobs (tokenize, embed, review) to COMPLETED."""
    config = JobsConfig(dsn=dsn, worker_count=4, poll_interval_ms=100, outbox_payloads=mode)
    app = JobsApp.open(config, runtime=Runtime())
    workflow = seed_workflow(services.target, review="invoke", name=f"interop-{mode}")
    try:
        app.start()
        for i in range(n):
            outcome = app.submitter.submit(workflow=workflow, input={"text": f"job {i}"})
            assert outcome.ok, outcome

        def done() -> bool:
            with psycopg.connect(dsn, autocommit=True) as c:
                row = c.execute(
                    "SELECT count(*) FILTER (WHERE status = 'COMPLETED'), count(*)"
                    " FROM workflow_run"
                ).fetchone()
            assert row is not None
            return row[0] == row[1] == n

        wait_for(done, timeout_s=120)
    finally:
        app.close()


def test_upstreams_relay_publishes_every_row_of_50_jobs_in_the_interop_mode(fresh_dsn, services):
    _run_jobs(fresh_dsn, services, "always", 50)
    total = _outbox(fresh_dsn)
    # ACCEPTED, three STEP_CHECKPOINTs and COMPLETED per job
    assert len(total) == 50 * 5
    published, failures = _upstream_relay_drain(fresh_dsn)
    assert failures == []
    assert published == len(total)
    with psycopg.connect(fresh_dsn, autocommit=True) as c:
        statuses = c.execute(
            "SELECT status, count(*) FROM workflow_run_events_outbox GROUP BY status"
        ).fetchall()
    assert statuses == [("PUBLISHED", len(total))]


def test_upstreams_relay_fails_the_column_rows_of_the_default_mode(fresh_dsn, services):
    _run_jobs(fresh_dsn, services, "columns", 3)
    rows = _outbox(fresh_dsn)
    assert len(rows) == 3 * 5 and all(r["payload"] is None for r in rows)
    published, failures = _upstream_relay_drain(fresh_dsn)
    # every row fails to parse, ten times, and ends FAILED: nobody publishes it
    assert published == 0
    assert len(failures) == 10 * len(rows)
    with psycopg.connect(fresh_dsn, autocommit=True) as c:
        statuses = c.execute(
            "SELECT status, count(*) FROM workflow_run_events_outbox GROUP BY status"
        ).fetchall()
    assert statuses == [("FAILED", len(rows))]
