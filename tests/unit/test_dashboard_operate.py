"""The dashboard's operator actions (issue 31 item 2): the table of what applies to which
status comes from the verbs themselves (their published ``x-jobStatuses``), the form envelope
refuses what the dashboard reads itself naming the field, and a resume time goes to the verb
with its zone (the database resolves it, as at every door). The store's SQL is held to the same table by
``tests/integration/test_dashboard_actions.py::test_each_verb_accepts_exactly_the_statuses_it_publishes``.
"""

from __future__ import annotations

import pytest

from protomolt_jobs.host.catalog import Catalog
from protomolt_jobs.host.dashboard import operate, times
from protomolt_jobs.host.dashboard.flash import TEXT_CHARS, Flash, Flashes
from protomolt_jobs.verbs import JobsBackend, jobs_actions
from protomolt_jobs.verbs.base import ControlVerb
from protomolt_jobs.workflow import Runtime

STATUSES = (
    "QUEUED",
    "RUNNING",
    "WAITING",
    "PAUSED",
    "RECOVERY_REQUIRED",
    "COMPLETED",
    "FAILED",
    "DEAD",
    "CANCELLED",
)


@pytest.fixture(scope="module")
def verbs():
    catalog = Catalog()
    actions = list(jobs_actions(JobsBackend(configured=True), Runtime()))
    for action in actions:
        catalog.register(action)
    return catalog, {a.name: a for a in actions}


def test_the_dashboard_table_is_what_each_verb_accepts_for_each_status(verbs):
    catalog, by_name = verbs
    table = operate.status_table(catalog.manifest())
    assert set(table) == set(operate.OPERATOR_VERBS)
    for verb in operate.OPERATOR_VERBS:
        action = by_name[verb]
        assert isinstance(action, ControlVerb)
        assert action.statuses, verb
        for status in STATUSES:
            offered = operate.offered(table, status, loops=True)
            assert (verb in offered) == (status in action.statuses), (
                verb,
                status,
            )


def test_a_waiting_job_is_offered_neither_resume_nor_requeue(verbs):
    table = operate.status_table(verbs[0].manifest())
    assert operate.offered(table, "WAITING") == ["cancel-job", "pause-job"]
    assert operate.offered(table, "RECOVERY_REQUIRED") == [
        "cancel-job",
        "reconcile-step",
        "migrate-checkpoint",
    ]
    assert operate.offered(table, "PAUSED") == ["cancel-job", "resume-job", "retry-step"]
    assert operate.offered(table, "DEAD") == ["requeue-job", "retry-step"]
    assert operate.offered(table, "COMPLETED") == ["retry-step"]


def test_a_caller_without_the_scope_is_offered_nothing():
    from protomolt_jobs.host.catalog import Caller

    catalog = Catalog()
    for action in jobs_actions(JobsBackend(configured=True), Runtime()):
        catalog.register(action)
    reader = Caller("reader-1", scopes=frozenset({"service-invoke"}))
    assert operate.offered(operate.status_table(catalog.manifest(reader)), "WAITING") == []


def test_every_action_needs_its_confirm_box():
    with pytest.raises(times.FormError) as caught:
        operate.envelope("cancel-job", "j", {"reason": "x"})
    assert caught.value.field == "confirm"
    assert str(caught.value).startswith("invalid-input: 'confirm' must be ticked")
    assert operate.envelope("cancel-job", "j", {"confirm": "on", "reason": " why "}) == {
        "jobId": "j",
        "reason": "why",
    }


@pytest.mark.parametrize(
    ("verb", "form", "field"),
    [
        ("cancel-job", {"compensate": "maybe"}, "compensate"),
        ("resume-job", {"at": "2026-01-01T10:00", "clock": "22:00"}, "clock"),
        ("resume-job", {"clock": "10 pm"}, "clock"),
        ("resume-job", {"clock": "22:00\x00"}, "clock"),
        ("reconcile-step", {"outcome": "done", "response": "{not json"}, "response"),
        ("migrate-checkpoint", {"action": "replace", "response": "[1, 2]"}, "response"),
    ],
)
def test_bad_form_values_are_refused_naming_the_field(verb, form, field):
    with pytest.raises(times.FormError) as caught:
        operate.envelope(verb, "j", {"confirm": "on", **form})
    assert caught.value.field == field
    assert f"'{field}'" in str(caught.value)


def test_forms_become_the_verbs_envelopes():
    confirm = {"confirm": "on"}
    # the local time goes to the verb with its zone: the database resolves it (the verb's
    # refusals of a bad time or zone are tests/integration/test_resume_local_time.py's)
    assert operate.envelope(
        "resume-job", "j", {**confirm, "at": "2026-07-01T09:30", "zone": "Europe/Berlin"}
    ) == {"jobId": "j", "at": "2026-07-01T09:30", "zone": "Europe/Berlin"}
    assert operate.envelope("resume-job", "j", {**confirm, "at": "2026-07-01T09:30"}) == {
        "jobId": "j",
        "at": "2026-07-01T09:30",
        "zone": "UTC",
    }
    assert operate.envelope("resume-job", "j", {**confirm, "at": "", "zone": "UTC"}) == {
        "jobId": "j"
    }
    # a time of day on a relative day (the select's value; "next" when none)
    assert operate.envelope(
        "resume-job",
        "j",
        {**confirm, "at": "", "clock": "22:00", "day": "tomorrow", "zone": "Europe/Warsaw"},
    ) == {"jobId": "j", "at": "22:00", "day": "tomorrow", "zone": "Europe/Warsaw"}
    assert operate.envelope("resume-job", "j", {**confirm, "clock": "06:30:15"}) == {
        "jobId": "j",
        "at": "06:30:15",
        "day": "next",
        "zone": "UTC",
    }
    assert operate.envelope(
        "reconcile-step",
        "j",
        {**confirm, "stepName": "s", "outcome": "done", "response": '{"count": 1}'},
    ) == {"jobId": "j", "stepName": "s", "outcome": "done", "response": {"count": 1}}
    assert operate.envelope(
        "migrate-checkpoint", "j", {**confirm, "stepName": "s", "action": "discard"}
    ) == {"jobId": "j", "stepName": "s", "action": "discard"}
    assert operate.envelope("cancel-job", "j", {**confirm, "compensate": "false"}) == {
        "jobId": "j",
        "compensate": False,
    }


def test_the_resume_form_offers_every_zone_utc_first():
    assert times.zones()[0] == "UTC" and "Europe/Berlin" in times.zones()


def test_relative_times_and_durations():
    import datetime

    now = datetime.datetime(2026, 12, 1, 12, 0, tzinfo=datetime.UTC)
    assert times.relative("2026-12-01T11:57:00Z", now) == "3 min ago"
    assert times.relative("2026-12-01T14:00:00Z", now) == "in 2 h"
    assert times.relative("2026-12-01T12:00:00Z", now) == "just now"
    assert times.relative("2026-12-01T11:59:55Z", now) == "5 s ago"
    assert times.relative("not a time", now) == ""
    assert times.between("2026-12-01T12:00:00Z", "2026-12-01T12:00:00.400Z") == "0.4 s"
    assert times.between("2026-12-01T12:00:00Z", "2026-12-02T15:00:00Z") == "1 d 3 h"
    assert times.between("2026-12-01T12:00:00Z", None) == ""
    assert times.relative("2030-07-01T07:30:00Z", now) == "in 3 y 212 d"


def test_outcome_sentences_name_the_state_the_job_is_in():
    assert operate.outcome("cancel-job", {"ok": True, "status": "CANCELLED"}, "") == (
        True,
        "cancel-job: now CANCELLED",
    )
    ok, text = operate.outcome(
        "cancel-job",
        {"ok": False, "status": "COMPLETED", "error": "job x is COMPLETED; only ..."},
        "",
    )
    assert not ok and "COMPLETED" in text
    ok, text = operate.outcome(
        "resume-job", {"ok": True, "status": "QUEUED", "runAfter": "2026-12-01T12:00:00Z"}, ""
    )
    assert ok and text == "resume-job: now QUEUED, to run after 2026-12-01T12:00:00Z"
    ok, text = operate.outcome("reconcile-step", {}, "invalid-input: Field 'outcome' ...")
    assert not ok and "invalid-input" in text


def test_a_flash_is_shown_once():
    flashes = Flashes(capacity=2)
    key = flashes.put(Flash("message", "done"))
    assert flashes.take(key) == Flash("message", "done")
    assert flashes.take(key) is None
    assert flashes.take("forged") is None and flashes.take(None) is None
    keys = [flashes.put(Flash("message", str(i))) for i in range(3)]
    assert flashes.take(keys[0]) is None  # pushed out by newer ones
    assert flashes.take(keys[2]).text == "2"


def test_flashes_are_bounded_by_characters_and_a_long_sentence_is_cut():
    flashes = Flashes(capacity=100, max_chars=10_000)
    cut = flashes.take(flashes.put(Flash("error", "z" * (TEXT_CHARS + 50))))
    assert len(cut.text) == TEXT_CHARS and cut.text.endswith("…")
    # four forms of 4,000 typed characters each: the oldest go once 10,000 are held
    keys = [flashes.put(Flash("error", "refused", form={"response": "x" * 4000})) for _ in range(4)]
    assert [flashes.take(k) is not None for k in keys] == [False, False, True, True]
    # taking a message gives its characters back: two more fit again
    again = [
        flashes.put(Flash("error", "refused", form={"response": "y" * 4000})) for _ in range(2)
    ]
    assert all(flashes.take(k) is not None for k in again)


def test_extend_loop_is_offered_only_for_a_run_with_a_loop_and_its_form_builds_the_input(verbs):
    table = operate.status_table(verbs[0].manifest())
    assert "extend-loop" not in operate.offered(table, "PAUSED")
    assert "extend-loop" in operate.offered(table, "PAUSED", loops=True)
    assert "extend-loop" not in operate.offered(table, "COMPLETED", loops=True)
    job = {
        "graph": {
            "edges": [
                {"from": "a", "to": "b", "kind": "after"},
                {"from": "d", "to": "b", "kind": "loop"},
            ]
        }
    }
    assert operate.loop_steps(job) == ["d"]
    assert operate.loop_steps({"graph": None}) == []
    form = {"confirm": "on", "step": "d", "by": "2", "reason": "one more"}
    assert operate.envelope("extend-loop", "J", form) == {
        "jobId": "J",
        "step": "d",
        "by": 2,
        "reason": "one more",
    }
    # not a number: sent as typed, so the verb names the field
    assert operate.envelope("extend-loop", "J", {**form, "by": "two"})["by"] == "two"
    ok, text = operate.outcome(
        "extend-loop",
        {"ok": True, "status": "QUEUED", "step": "d", "max": 2, "extendedBy": 1},
        "",
    )
    assert ok and text == "extend-loop: now QUEUED; loop 'd' may now re-run 2 times"


def test_the_migrate_form_offers_a_step_stopped_on_its_saved_progress():
    from protomolt_jobs.workflow.resumable import PROGRESS_MISMATCH

    assert operate.PROGRESS_MISMATCH == PROGRESS_MISMATCH
    names = ["prepare", "render", "publish"]
    stopped = {
        "error": "progress-mismatch: step 'render' adapterVersion changed (was 'a', now 'b')",
        "outstandingStep": "render",
    }
    assert operate.migratable(stopped, names, {"prepare"}) == ["prepare", "render"]
    # a checkpoint-mismatch offers the checkpointed steps only
    other = {"error": "checkpoint-mismatch: step 'prepare' descriptorSha256 changed"}
    assert operate.migratable({**other, "outstandingStep": "prepare"}, names, {"prepare"}) == [
        "prepare"
    ]


def test_promote_artifact_takes_an_artifact_of_the_page_s_job_and_its_reason(verbs):
    from protomolt_jobs.hooks.contract import artifact_id

    job = "3f1c2a9e-0000-4000-8000-000000000001"
    aid = artifact_id(job, "a", 0, "response", 0, "ab" * 32)
    form = {"artifactId": aid, "reason": " signed off ", "confirm": "on"}
    # no jobId: the verb takes the artifact's id and a reason only
    assert operate.envelope("promote-artifact", job, form) == {
        "artifactId": aid,
        "reason": "signed off",
    }
    # a blank reason goes to the verb, which names 'reason'
    assert operate.envelope("promote-artifact", job, {**form, "reason": " "})["reason"] == ""
    other = artifact_id("9a9a9a9a-0000-4000-8000-000000000002", "a", 0, "response", 0, "ab")
    for bad, says in (
        ({**form, "artifactId": other}, "is not one of this job's"),
        ({**form, "artifactId": "nope"}, "must be an artifact id"),
        ({"artifactId": aid, "reason": "x"}, "'confirm' must be ticked"),
    ):
        with pytest.raises(times.FormError) as info:
            operate.envelope("promote-artifact", job, bad)
        assert says in str(info.value)
        assert info.value.field == ("confirm" if "confirm" not in bad else "artifactId")
    with pytest.raises(times.FormError):
        operate.envelope("promote-artifact", "not-a-uuid", form)
    # its scope is declared on the form like the operator verbs'
    assert operate.scopes(verbs[0].manifest())["promote-artifact"] == "job-control"
    assert "promote-artifact" not in operate.status_table(verbs[0].manifest())


def test_promote_artifact_s_outcome_names_the_artifact_and_its_state():
    aid = "3f1c2a9e-0000-4000-8000-00000000abcd"
    done = {"ok": True, "artifactId": aid, "state": "promoted", "changed": True}
    assert operate.outcome("promote-artifact", done, "") == (
        True,
        f"promote-artifact: artifact {aid} is now promoted",
    )
    refused = {
        "ok": False,
        "artifactId": aid,
        "state": "draft",
        "errorKind": "not-verified",
        "error": f"not-verified: artifact {aid} is draft; only a verified artifact can be promoted",
    }
    assert operate.outcome("promote-artifact", refused, "") == (
        False,
        f"promote-artifact refused: {refused['error']}",
    )
