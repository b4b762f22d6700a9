"""Approvals: the approval park and ``approve-step``'s votes under the run's row lock.

A run reaches an approval step and parks on it with one fenced statement
(``job_park_approval``: WAITING, ``outstanding_step`` the step, ``wait_kind = 'approval'``,
``wait_seq`` the seq of that park's transition).
The step is open from that statement on: a vote before it is ``not-open``, deterministically.

A vote is one transaction (:meth:`ApprovalMixin.approval_vote`):

1. ``job_lock``: the run's row ``FOR UPDATE``. A cancel, a pause, another vote and a
   ``complete-step`` take the same lock, so each sees the others whole: a run ends with
   exactly one decision or one cancel.
2. The gate: the run is not WAITING on that step for approval and the step has a checkpoint
   -> ``already-decided`` (its latest entry; a loop body's step opens again in each iteration,
   its older entries then say nothing); not WAITING on it -> ``not-open``; the voter voted on
   a ``distinctFrom`` step of this run -> ``distinct-from``.
3. ``approval_vote_insert``: the vote (primary key ``(job_id, step, opened_seq, principal)``:
   a second vote of one principal inserts nothing and counts once) and its ``vote``
   transition in the run's hash-chained log.
4. The tally (``approval_votes``): distinct principals per decision for this opening of the
   step (``wait_seq``: the seq of the park transition that opened it, so a step opened again
   by retry-step never counts an earlier opening's votes). A ``veto`` vote decides at once;
   otherwise the first decision with ``quorum`` voters decides.
5. On a decision, ``approval_decide``: the step's checkpoint entry (built by the caller from
   the decision, the tally and the voters), WAITING -> QUEUED, attempt reset, a ``decision``
   transition, and its APPROVAL_DECIDED event with ``NOTIFY``: a worker claims the run and
   goes on along the decision's edge.

Timers (``expires``, ``escalate``): the park stamps them with the database's ``now()``
(``wait_timers``, ``wake_at`` the first); :meth:`ApprovalMixin.approval_timers_sweep` (the
sweeper's pass) locks the runs whose ``wake_at`` passed (``FOR UPDATE SKIP LOCKED`` over the
partial index ``idx_workflow_run_wake``) and fires what is due: an escalation is marked fired
(an ``escalate`` transition, APPROVAL_ESCALATED), an expiry decides ``reject`` or ends the run
FAILED or PAUSED (never an accept). A decision clears the timers.

Who may vote (the approvers, widened by fired escalations; the submitter) is the verb's to
decide before it calls here; the store counts. :class:`ApprovalMixin` is one of :class:`~protomolt_jobs.store.store.JobStore`'s
concern mixins.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from protomolt_jobs.errors import NotFound, StoreError
from protomolt_jobs.store import checks, db
from protomolt_jobs.store.events import EventType
from protomolt_jobs.store.records import JobRecord, Lease
from protomolt_jobs.store.scrub import scrub_text

__all__ = ["APPROVAL_WAIT", "ApprovalMixin", "TimerSweep", "Vote", "VoteOutcome"]

log = logging.getLogger("protomolt_jobs.store")

#: ``wait_kind`` of a run waiting on an approval step.
APPROVAL_WAIT = "approval"

VoteResult = Literal[
    "counted", "decided", "duplicate", "not-open", "already-decided", "distinct-from"
]


@dataclass(frozen=True, slots=True)
class Vote:
    """One vote as stored: ``principal``, ``decision``, ``comment`` (None when absent)."""

    principal: str
    decision: str
    comment: str | None = None


@dataclass(frozen=True, slots=True)
class VoteOutcome:
    """What :meth:`ApprovalMixin.approval_vote` found and did.

    :ivar result: ``counted`` (recorded, no decision yet), ``decided`` (this vote decided),
        ``duplicate`` (this principal had voted: counted once), ``not-open`` (the run is not
        waiting on that step for approval), ``already-decided`` (the step has its decision),
        ``distinct-from`` (the voter voted on a ``distinctFrom`` step; ``detail`` names it).
    :ivar status: the run's status after the call.
    :ivar tally: decision -> distinct voters (this opening's votes).
    :ivar decision: the step's decision, once decided.
    :ivar outstanding_step: the step the run waits on (for ``not-open``).
    """

    result: VoteResult
    status: str
    tally: dict[str, int] = field(default_factory=dict)
    decision: str | None = None
    outstanding_step: str | None = None
    detail: str = ""


#: ``(decision, tally, votes) -> the step's checkpoint entry`` (its ``name`` is the step).
EntryBuilder = Callable[[str, dict[str, int], list[Vote]], dict[str, Any]]
#: ``(step, decision, tally, votes) -> the step's checkpoint entry`` (the timer sweep's).
DecisionEntry = Callable[[str, str, dict[str, int], list[Vote]], dict[str, Any]]


@dataclass(frozen=True, slots=True)
class TimerSweep:
    """What one approval timer pass did: escalations fired, waits expired."""

    escalated: int = 0
    expired: int = 0


class ApprovalMixin(db.Database):
    """``JobStore``'s approvals: the approval park and counted votes."""

    @db.translated
    def job_park_approval(
        self, lease: Lease, step: str, timers: Sequence[dict[str, Any]] = ()
    ) -> str:
        """Park the job on an approval step, with its WAITING event.

        SQL: fenced ``UPDATE ... SET status='WAITING', outstanding_step=step, wait_kind=
        'approval', wait_seq`` (this park's transition), the step's timers stamped with the
        database's ``now()`` and ``wake_at`` the first of them, lease cleared, and its outbox
        row (WAITING; CANCELLED or PAUSED when the trigger applied a pending request), in one
        statement (autocommit).

        :param timers: offsets from the park (``{"kind", "afterS", ...}``; none: no timer).
        :returns: the status the row ends in.
        :raises LeaseLost: when the fence matches no row (nothing changed, no event).
        :raises ValueError: for a blank step.
        :raises StoreError: on a database failure.
        """
        checks.text("step", step)
        params: dict[str, Any] = {"step": scrub_text(step), "timers": None, "wake_s": None}
        if timers:
            params["timers"] = checks.jsonb("timers", list(timers), list)
            params["wake_s"] = min(float(t["afterS"]) for t in timers)
        with self._connection() as conn:
            row = db.fenced(conn, "job_park_approval", lease, params)
        return str(row["status"])

    @db.translated
    def approval_timers_sweep(self, entry: DecisionEntry, *, limit: int = 100) -> TimerSweep:
        """Fire the approval timers that are due by the database clock (the sweeper's pass).

        SQL: one transaction: ``approval_timers_due`` locks up to ``limit`` WAITING approval
        runs whose ``wake_at`` passed (``FOR UPDATE SKIP LOCKED``: several sweepers share the
        work) and names their due timers; per run, each due escalation is an
        ``approval_escalate`` (fired, an ``escalate`` transition, an APPROVAL_ESCALATED
        event); a due expiry ends the wait by its ``onExpire``: ``reject`` is the step's
        decision (``approval_decide`` with the votes so far, actor ``sweeper``, an
        APPROVAL_DECIDED event and NOTIFY), ``fail`` and ``pause`` are ``approval_expire``
        (FAILED or PAUSED, an ``expire`` transition and its event). An expiry never accepts.

        :param entry: builds the checkpoint entry of an expiry's ``reject`` decision.
        :returns: ``TimerSweep(escalated, expired)``.
        :raises StoreError: on a database failure.
        """
        escalated = expired = 0
        with self._connection() as conn, conn.transaction():
            for row in db.rows(conn, "approval_timers_due", {"limit": limit}):
                timers = json.loads(row["wait_timers"] or "[]")
                due = json.loads(row["due"] or "[]")
                step = str(row["outstanding_step"])
                key = row["job_id"]
                written = 0  # this job's events so far in the transaction, in order
                for i in due:
                    timer = timers[i]
                    if timer.get("kind") != "escalate":
                        continue
                    timer["fired"] = True
                    added = [f"role {r}" for r in timer.get("addRoles", [])] + [
                        f"principal {p}" for p in timer.get("addPrincipals", [])
                    ]
                    reason = "escalated: may vote now: " + ", ".join(added)
                    changed = db.one(
                        conn,
                        "approval_escalate",
                        {
                            "job_id": key,
                            "step": step,
                            "timers": checks.jsonb("timers", timers, list),
                            "reason": reason,
                        },
                    )
                    if changed is not None:
                        self._outbox_txn(
                            conn,
                            changed,
                            EventType.TYPE_APPROVAL_ESCALATED,
                            step=step,
                            verdict=reason[:500],
                            later=written,
                        )
                        written += 1
                        escalated += 1
                expiry = next((timers[i] for i in due if timers[i].get("kind") == "expire"), None)
                if expiry is not None:
                    self._expire_txn(
                        conn, key, step, row["wait_seq"] or 0, expiry, entry, later=written
                    )
                    expired += 1
        if escalated or expired:
            log.info(
                "approval timers fired: %d escalated, %d expired",
                escalated,
                expired,
                extra={"action": "approval_timers", "escalated": escalated, "expired": expired},
            )
        return TimerSweep(escalated, expired)

    def _expire_txn(
        self,
        conn: Any,
        key: uuid.UUID,
        step: str,
        opened_seq: int,
        expiry: dict[str, Any],
        entry: DecisionEntry,
        later: int = 0,
    ) -> None:
        """End an expired approval wait by its ``onExpire`` (the caller holds the row lock).
        ``later``: the job's events the transaction wrote before (``_outbox_txn``)."""
        how = expiry.get("onExpire", "reject")
        if how == "reject" and expiry.get("gate") == "grant":
            # a grant gate's reject: the step's grant is refused (no checkpoint: it never ran)
            row = db.one(
                conn,
                "approval_grant_decide",
                {
                    "job_id": key,
                    "step": step,
                    "actor": "sweeper",
                    "reason": "expired: decided reject",
                },
            )
            if row is not None:
                self._outbox_txn(
                    conn,
                    row,
                    EventType.TYPE_APPROVAL_DECIDED,
                    step=step,
                    verdict="reject",
                    notify=True,
                    later=later,
                )
            return
        if how == "reject":
            votes = [
                Vote(r["principal"], r["decision"], r["comment"])
                for r in db.rows(
                    conn, "approval_votes", {"job_id": key, "step": step, "opened_seq": opened_seq}
                )
            ]
            tally: dict[str, int] = {}
            for v in votes:
                tally[v.decision] = tally.get(v.decision, 0) + 1
            built = entry(step, "reject", tally, votes)
            iteration = expiry.get("iteration")
            if isinstance(iteration, int) and not isinstance(iteration, bool) and iteration > 0:
                built["iteration"] = iteration  # the loop iteration the step was opened in
            row = db.one(
                conn,
                "approval_decide",
                {
                    "job_id": key,
                    "step": step,
                    "entry": checks.jsonb("entry", built, dict),
                    "actor": "sweeper",
                    "reason": "expired: decided reject",
                },
            )
            if row is not None:
                self._outbox_txn(
                    conn,
                    row,
                    EventType.TYPE_APPROVAL_DECIDED,
                    step=step,
                    verdict="reject",
                    notify=True,
                    later=later,
                )
            return
        status = "FAILED" if how == "fail" else "PAUSED"
        error = str(expiry.get("error") or f"APPROVAL: approval step '{step}' expired")
        row = db.one(
            conn,
            "approval_expire",
            {"job_id": key, "step": step, "status": status, "error": error},
        )
        if row is not None:
            event = EventType.TYPE_FAILED if status == "FAILED" else EventType.TYPE_PAUSED
            self._outbox_txn(conn, row, event, step=step, error=error, later=later)

    @db.translated
    def approval_votes_open(self, job_id: uuid.UUID | str, step: str) -> list[Vote]:
        """The votes cast so far on the current opening of an approval step (oldest first;
        empty when the run does not wait on it). One statement, no lock.

        :raises ValueError: for a malformed id or a blank step.
        :raises StoreError: on a database failure.
        """
        key = checks.uuid("job_id", job_id)
        checks.text("step", step)
        with self._connection() as conn:
            rows = db.rows(conn, "approval_votes_open", {"job_id": key, "step": scrub_text(step)})
        return [Vote(r["principal"], r["decision"], r["comment"]) for r in rows]

    @db.translated
    def job_submitted_groups(self, job_id: uuid.UUID | str) -> tuple[str, ...] | None:
        """The groups recorded with the run at submit (``submitted_groups``, migration 0017),
        or None when none were (or the job does not exist). One statement, no lock (the
        worker asks only for a step that declares capabilities).

        :raises ValueError: for a malformed id.
        :raises StoreError: on a database failure.
        """
        key = checks.uuid("job_id", job_id)
        with self._connection() as conn:
            row = db.one(conn, "job_submitted_groups", {"job_id": key})
        if row is None or row["submitted_groups"] is None:
            return None
        return tuple(str(g) for g in row["submitted_groups"])

    @db.translated
    def grant_gate_decision(
        self, job_id: uuid.UUID | str, step: str
    ) -> tuple[str, str, int] | None:
        """The decision of ``step``'s latest grant gate: ``(decision, actor, transition seq)``,
        or None when it is not decided. One statement, no lock (asked only for a step whose
        grant needs an approval).

        :raises ValueError: for a malformed id or a blank step.
        :raises StoreError: on a database failure.
        """
        key = checks.uuid("job_id", job_id)
        checks.text("step", step)
        with self._connection() as conn:
            row = db.one(conn, "grant_gate_decision", {"job_id": key, "step": scrub_text(step)})
        if row is None:
            return None
        return _decided(row["reason"]), str(row["actor"]), int(row["seq"])

    @db.translated
    def approval_vote(
        self,
        job_id: uuid.UUID | str,
        step: str,
        *,
        principal: str,
        groups: Sequence[str],
        decision: str,
        comment: str | None,
        quorum: int,
        veto: Sequence[str],
        distinct_from: Sequence[str],
        entry: EntryBuilder,
        policy_sha256: str | None = None,
        grant_gate: bool = False,
    ) -> VoteOutcome:
        """Count one principal's vote on an approval step (the module docstring's five moves).

        Transaction: one, under the run's row lock (``job_lock``).

        :param groups: the voter's groups, stored with the vote.
        :param quorum: distinct voters one decision needs (>= 1).
        :param veto: decisions one vote of which decides at once.
        :param distinct_from: approval steps whose voters may not vote on ``step``.
        :param entry: builds the step's checkpoint entry once it is decided.
        :param policy_sha256: the hash of the node policy floors the vote is counted under
            (None: none apply): appended to the ``vote`` and ``decision`` transitions' reasons
            (``(policy <hex>)``), so the hash-chained log holds it with the votes.
        :param grant_gate: the step waits on its grant gate, not an approval step: the
            decision requeues the run without a checkpoint (``approval_grant_decide``).
        :returns: a :class:`VoteOutcome`.
        :raises NotFound: for an unknown job id.
        :raises ValueError: for a malformed id, a blank step, principal or decision.
        :raises StoreError: on a database failure or unreadable stored checkpoints.
        """
        key = checks.uuid("job_id", job_id)
        checks.text("step", step)
        checks.text("principal", principal)
        checks.text("decision", decision)
        step, principal = scrub_text(step), scrub_text(principal)
        with self._connection() as conn, conn.transaction():
            row = db.one(conn, "job_lock", {"job_id": key})
            if row is None:
                raise NotFound(f"workflow run not found: {key}")
            record = JobRecord.from_row(row)
            if record.checkpoints is None:
                raise StoreError(
                    f"stored checkpoints of job {key} are unreadable: {record.unreadable}"
                )
            is_open = (
                record.status == "WAITING"
                and record.outstanding_step == step
                and record.wait_kind == APPROVAL_WAIT
            )
            if not is_open and grant_gate:
                # decided, its step not run yet (the run is QUEUED or RUNNING): the decision
                # stands (the latest: before any entry of an earlier run of the step)
                gate = db.one(conn, "grant_gate_decision", {"job_id": key, "step": step})
                if gate is not None:
                    return VoteOutcome(
                        "already-decided", record.status, {}, _decided(gate["reason"])
                    )
            # A step open again (a loop's next iteration) has older entries: only a step that
            # is not open is already decided, by its latest entry.
            for c in reversed(record.checkpoints) if not is_open else ():
                if isinstance(c, dict) and c.get("name") == step:
                    stored = c.get("tally")
                    counts = dict(stored) if isinstance(stored, dict) else {}
                    decided = c.get("decision") if isinstance(c.get("decision"), str) else None
                    if decided is None and grant_gate:
                        decided = _gate_decision(c)
                    return VoteOutcome("already-decided", record.status, counts, decided)
            if not is_open:
                return VoteOutcome(
                    "not-open", record.status, outstanding_step=record.outstanding_step
                )
            opened_seq = record.wait_seq or 0
            if distinct_from:
                other = db.one(
                    conn,
                    "approval_voted_elsewhere",
                    {"job_id": key, "steps": list(distinct_from), "principal": principal},
                )
                if other is not None:
                    return VoteOutcome("distinct-from", record.status, detail=str(other["step"]))
            reason = f"{decision}: {comment}" if comment else decision
            under = f" (policy {policy_sha256})" if policy_sha256 else ""
            reason += under
            inserted = db.one(
                conn,
                "approval_vote_insert",
                {
                    "job_id": key,
                    "step": step,
                    "opened_seq": opened_seq,
                    "principal": principal,
                    "groups": [scrub_text(g) for g in groups],
                    "decision": scrub_text(decision),
                    "comment": scrub_text(comment) if comment else None,
                    "reason": scrub_text(reason),
                },
            )
            votes = [
                Vote(r["principal"], r["decision"], r["comment"])
                for r in db.rows(
                    conn,
                    "approval_votes",
                    {"job_id": key, "step": step, "opened_seq": opened_seq},
                )
            ]
            tally: dict[str, int] = {}
            for v in votes:
                tally[v.decision] = tally.get(v.decision, 0) + 1
            if inserted is None:
                return VoteOutcome("duplicate", record.status, tally)
            if decision not in veto and tally.get(decision, 0) < quorum:
                return VoteOutcome("counted", record.status, tally)
            params: dict[str, Any] = {
                "job_id": key,
                "step": step,
                "actor": principal,
                "reason": f"decided {decision}" + (" (veto)" if decision in veto else "") + under,
            }
            if grant_gate:
                decided_row = db.one(conn, "approval_grant_decide", params)
            else:
                params["entry"] = checks.jsonb("entry", entry(decision, tally, votes), dict)
                decided_row = db.one(conn, "approval_decide", params)
            if decided_row is None:  # pragma: no cover - the row lock makes the gate hold
                raise StoreError(f"job {key} changed under its row lock")
            self._outbox_txn(
                conn,
                decided_row,
                EventType.TYPE_APPROVAL_DECIDED,
                step=step,
                verdict=decision,
                notify=True,
            )
        log.info(
            "approval step %s of job %s decided %s",
            step,
            key,
            decision,
            extra={"action": "approval_decided", "job_id": str(key), "step": step},
        )
        return VoteOutcome("decided", "QUEUED", tally, decision)


def _gate_decision(entry: dict[str, Any]) -> str | None:
    """The grant gate's decision a step's checkpoint entry used (None: the entry used none):
    ``accept`` when the step ran under the gate's grant (``grant.decisionId`` ``gate:<seq>``),
    ``reject`` when it failed by the gate (its ``failed.message`` ends ``(decision
    gate:<seq>)``), the same marks ``grant_gate_decision`` reads."""
    grant = entry.get("grant")
    if isinstance(grant, dict) and str(grant.get("decisionId", "")).startswith("gate:"):
        return "accept"
    failed = entry.get("failed")
    if isinstance(failed, dict) and "(decision gate:" in str(failed.get("message", "")):
        return "reject"
    return None


def _decided(reason: object) -> str:
    """The decision a ``decision`` transition's reason names: ``decided <decision>``,
    ``decided <decision> (veto)`` or, the sweeper's, ``expired: decided reject`` ("" when
    it names none)."""
    words = str(reason or "").split()
    at = words.index("decided") + 1 if "decided" in words else len(words)
    return words[at] if at < len(words) else ""
