"""Property tests: ``build_event`` cannot make an event that breaks the contract, and the plain
Python check the relay runs (``events.event_violations``) is the contract's own check.

Why it matters: the relay no longer interprets the contract's CEL rules for the events our own
code built (DESIGN.md section 17). These properties are what keep DESIGN.md section 6's
guarantee ("events are checked against their CEL rules before publishing"):

1. for every event type and every text length up to and past the limits, ``build_event``
   either refuses (``ValueError`` naming the field) or returns a payload that passes
   ``wire.validate_event`` (the declared field rules and CEL rules, interpreted), and it
   refuses exactly the inputs the contract forbids after truncation;
2. on arbitrary ``WorkflowRunEvent`` messages (bad UUIDs, unknown types, negative attempts,
   over-long texts, missing timestamps), ``event_violations`` gives the same violations as
   ``validate_event``, in the same order.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from protomolt_jobs.kafka.wire import EventType, WorkflowRunEvent, validate_event
from protomolt_jobs.store.events import (
    MAX_ERROR_CHARS,
    MAX_NAME_CHARS,
    MAX_VERDICT_CHARS,
    build_event,
    event_violations,
)

#: Every event type the contract defines (new types after TYPE_DEAD are included as added).
TYPES = [v for v in EventType.values() if v != EventType.TYPE_UNSPECIFIED]


def texts(limit: int) -> st.SearchStrategy[str]:
    """Empty, short, exactly at the limit, one past it, and far past it."""
    return st.one_of(
        st.just(""),
        st.text(max_size=8),
        st.text(min_size=limit - 2, max_size=limit + 2),
        st.integers(limit - 1, limit * 2 + 5).map(lambda n: "é" * n),
        st.text(
            alphabet=st.characters(min_codepoint=0x1F600, max_codepoint=0x1F64F), max_size=8
        ).map(lambda s: s * (limit // 4 + 1)),
    )


def _decode(payload: bytes) -> WorkflowRunEvent:
    return WorkflowRunEvent.FromString(payload)


def _as_tuples(violations) -> list[tuple[str, str, str]]:
    return [(v.path, v.rule_id, v.message) for v in violations]


SLOW = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SLOW
@given(
    type_=st.sampled_from(TYPES),
    workflow_name=texts(MAX_NAME_CHARS),
    step=texts(MAX_NAME_CHARS),
    verdict=texts(MAX_VERDICT_CHARS),
    error=texts(MAX_ERROR_CHARS),
    attempt=st.integers(0, 2**31 - 1),
    status=st.sampled_from(["QUEUED", "RUNNING", "WAITING", "COMPLETED", "FAILED", "DEAD", ""]),
    seconds=st.integers(-(10**9), 10**10),
    job_id=st.uuids().map(lambda u: u if hash(u) % 2 else str(u)),
)
def test_build_event_never_makes_an_event_that_breaks_the_contract(
    type_, workflow_name, step, verdict, error, attempt, status, seconds, job_id
):
    occurred_at = datetime(1970, 1, 1, tzinfo=UTC) + timedelta(seconds=seconds)
    # What the contract forbids after build_event's truncation: a blank name, a COMPLETED
    # event without verdict, a FAILED or DEAD event without error.
    forbidden = (
        not workflow_name
        or (type_ == EventType.TYPE_COMPLETED and not verdict)
        or (type_ in (EventType.TYPE_FAILED, EventType.TYPE_DEAD) and not error)
        or (type_ == EventType.TYPE_CANCELLED and not error)
    )
    try:
        ev = build_event(
            job_id=job_id,
            workflow_name=workflow_name,
            type=type_,
            attempt=attempt,
            status_after=status,
            occurred_at=occurred_at,
            step=step,
            verdict=verdict,
            error=error,
        )
    except ValueError as exc:
        assert forbidden, f"refused a valid event: {exc}"
        # The refusal names the field the rule is about.
        assert str(exc).split(":")[0] in ("workflow_name", "verdict", "error")
        return
    assert not forbidden, "built an event the contract forbids"
    msg = _decode(ev.payload)
    assert validate_event(msg) == []
    assert event_violations(msg) == []
    assert msg.job_id == ev.kafka_key == str(job_id)
    assert msg.type == type_ and EventType.Name(type_) == f"TYPE_{ev.event_type}"
    # Truncated in the event only, to the contract's limits, as prefixes of the input.
    assert workflow_name.startswith(msg.workflow_name)
    assert msg.error == error[:MAX_ERROR_CHARS] and msg.verdict == verdict[:MAX_VERDICT_CHARS]
    assert msg.step == step[:MAX_NAME_CHARS]


@pytest.mark.parametrize("type_", TYPES, ids=EventType.Name)
@pytest.mark.parametrize("over", [0, 1, 1000])
def test_every_type_at_and_past_every_limit_is_valid(type_, over):
    ev = build_event(
        job_id=uuid.uuid4(),
        workflow_name="w" * (MAX_NAME_CHARS + over),
        type=type_,
        attempt=1,
        status_after="RUNNING",
        occurred_at=datetime.now(UTC),
        step="s" * (MAX_NAME_CHARS + over),
        verdict="v" * (MAX_VERDICT_CHARS + over),
        error="e" * (MAX_ERROR_CHARS + over),
    )
    msg = _decode(ev.payload)
    assert validate_event(msg) == [] and event_violations(msg) == []
    assert len(msg.error) == MAX_ERROR_CHARS and len(msg.step) == MAX_NAME_CHARS


def test_refusals_name_field_and_rule():
    base = {
        "job_id": uuid.uuid4(),
        "workflow_name": "w",
        "attempt": 1,
        "status_after": "DEAD",
        "occurred_at": datetime.now(UTC),
    }
    with pytest.raises(ValueError, match=r"^error: .*\(terminal-carries-error\)"):
        build_event(type="DEAD", **base)
    with pytest.raises(ValueError, match=r"^verdict: .*\(completed-carries-verdict\)"):
        build_event(type="COMPLETED", **base)
    with pytest.raises(ValueError, match=r"^workflow_name: field is required"):
        build_event(type="ACCEPTED", **{**base, "workflow_name": ""})
    with pytest.raises(ValueError, match=r"^job_id: not a UUID"):
        build_event(type="ACCEPTED", **{**base, "job_id": "job-1"})
    with pytest.raises(ValueError, match=r"^event: cannot be serialized"):
        build_event(type="DEAD", **{**base, "error": "lone \ud800 surrogate"})


def _uuidish() -> st.SearchStrategy[str]:
    return st.one_of(
        st.just(""),
        st.uuids().map(str),
        st.uuids().map(lambda u: str(u).upper()),
        st.text(max_size=40),
    )


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    event_id=_uuidish(),
    job_id=_uuidish(),
    workflow_name=texts(MAX_NAME_CHARS),
    type_=st.one_of(st.sampled_from([0, *TYPES]), st.integers(-5, 100)),
    step=texts(MAX_NAME_CHARS),
    attempt=st.integers(-(2**31), 2**31 - 1),
    verdict=texts(MAX_VERDICT_CHARS),
    error=texts(MAX_ERROR_CHARS),
    status=st.one_of(st.none(), st.text(max_size=10)),
    stamped=st.booleans(),
)
def test_plain_check_is_the_contracts_check(
    event_id, job_id, workflow_name, type_, step, attempt, verdict, error, status, stamped
):
    msg = WorkflowRunEvent(
        event_id=event_id,
        job_id=job_id,
        workflow_name=workflow_name,
        type=type_,
        step=step,
        attempt=attempt,
        verdict=verdict,
        error=error,
    )
    if status is not None:
        msg.detail.update({"status": status})
    if stamped:
        msg.occurred_at.FromDatetime(datetime(2026, 1, 1, tzinfo=UTC))
    # Through the wire, as the relay sees it (an unknown enum number survives the round trip).
    msg = _decode(msg.SerializeToString())
    assert _as_tuples(event_violations(msg)) == _as_tuples(validate_event(msg))
