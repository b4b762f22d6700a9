"""Request-consumer defects never lose a record: a failure while handling becomes a reject,
and when not even the reject can be stored the record is held, like an outage (fakes only)."""

from __future__ import annotations

from protomolt_jobs.errors import StoreError
from tests.unit.test_request_consumer import (
    FakeStore,
    FakeSubmitter,
    Outcome,
    _consumer,
    _msg,
    _request,
)


class BrokenRejects(FakeStore):
    """A store whose reject insert fails with a non-store error ``failures`` times."""

    def __init__(self, failures: int) -> None:
        super().__init__()
        self.failures = failures

    def reject_insert(self, raw, topic, partition, offset, reason):
        if self.failures:
            self.failures -= 1
            raise RuntimeError("a defect in the reject insert")
        return super().reject_insert(raw, topic, partition, offset, reason)


def test_non_finite_input_is_rejected_without_calling_the_submitter():
    store, sub = FakeStore(), FakeSubmitter(Outcome(ok=True))
    raw = _request(input={"n": float("nan")})
    rc, fake = _consumer(store, sub, [_msg(raw, 4)])
    assert rc.run_once(0) == 1
    assert store.rejects[0][3] == 4
    assert store.rejects[0][4].startswith("invalid-request: input cannot be read as JSON")
    assert sub.calls == [] and fake.commits == [(0, 4)]


def test_a_reject_that_cannot_be_stored_holds_the_record():
    # Each pass tries twice: the record's own reject, then the internal-error reject.
    store = BrokenRejects(failures=2)
    rc, fake = _consumer(
        store, FakeSubmitter(Outcome(ok=True)), [_msg(b"\xff", 8), _msg(b"\xff", 9)]
    )
    assert rc.run_once(0) == 0 and rc._backoff_s > 0
    assert fake.commits == [] and len(fake.messages) == 1  # the next record was not read
    assert rc.run_once(0) == 1
    assert fake.commits == [(0, 8)]
    assert [(r[3], r[4].split(":")[0]) for r in store.rejects] == [(8, "undecodable")]


def test_a_failing_reject_is_retried_as_an_internal_error_reject():
    store = BrokenRejects(failures=1)
    rc, fake = _consumer(store, FakeSubmitter(Outcome(ok=True)), [_msg(b"\xff", 3)])
    assert rc.run_once(0) == 1
    assert fake.commits == [(0, 3)]
    assert store.rejects[0][4] == "internal-error: RuntimeError: a defect in the reject insert"


def test_a_store_error_from_the_reject_still_holds_the_record():
    store = FakeStore()
    store.fail_next = 1
    rc, fake = _consumer(store, FakeSubmitter(StoreError("down")), [_msg(_request(), 2)])
    assert rc.run_once(0) == 0
    assert fake.commits == []
