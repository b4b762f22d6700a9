"""Cancel that keeps what the user asked to keep (issue 27 item 4): the workflow's default,
the request's word, and the lease guard's cancel watchers (no database, no network)."""

from __future__ import annotations

import uuid

from protomolt_jobs.store.records import Lease
from protomolt_jobs.worker.heartbeat import LeaseGuard
from protomolt_jobs.workflow import cancel
from protomolt_jobs.workflow.effects import EffectContext
from protomolt_jobs.workflow.types import EFFECT_EXTERNAL


def _guard() -> LeaseGuard:
    return LeaseGuard(Lease(uuid.uuid4(), "w", 1, uuid.uuid4()), 0.0)


def test_the_requests_word_wins_then_the_definition_then_true():
    assert cancel.compensates({}) is True
    assert cancel.compensates({"cancel": {"compensate": False}}) is False
    assert cancel.compensates({"cancel": {"compensate": False}}, True) is True
    assert cancel.compensates({"cancel": {}}, False) is False
    assert cancel.compensates({"cancel": {"compensate": "no"}}) is True  # refused at the door


def test_a_malformed_cancel_object_is_a_finding():
    assert cancel.findings({"cancel": {"compensate": False}}) == []
    assert cancel.findings({}) == []
    (f,) = cancel.findings({"cancel": {"compensate": "no"}})
    assert (f.kind, f.error) == ("cancel", "'cancel.compensate' must be a boolean")
    (f,) = cancel.findings({"cancel": True})
    assert f.kind == "cancel"


def test_a_cancel_calls_each_watcher_once_and_a_pause_calls_none():
    guard = _guard()
    called: list[str] = []
    withdraw = guard.watch_cancel(lambda: called.append("a"))
    guard.watch_cancel(lambda: called.append("b"))
    withdraw()
    guard.set_control({"kind": "pause", "actor": "x"})
    assert called == [] and not guard.cancel_requested
    guard.set_control({"kind": "cancel", "actor": "x"})
    assert called == ["b"] and guard.cancel_requested
    guard.set_control({"kind": "cancel", "actor": "x"})
    assert called == ["b"]
    # a call that starts after the request is cancelled at once
    guard.watch_cancel(lambda: called.append("c"))
    assert called == ["b", "c"]


def test_an_external_step_is_never_handed_the_cancel():
    class _Step:
        def __init__(self, effect: str) -> None:
            self.effect = effect

    guard = _guard()
    effects = EffectContext(job_id="j", watch_cancel=guard.watch_cancel)
    assert effects.canceller(_Step(EFFECT_EXTERNAL)) is None  # type: ignore[arg-type]
    assert effects.canceller(_Step("idempotent")) is not None  # type: ignore[arg-type]
