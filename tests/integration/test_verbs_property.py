"""Property: any JSON object given to a verb gets an answer or ``invalid-input``, never another
error, and a refused input writes no row (real PostgreSQL, 2,000 objects per verb).

The objects mix the verb's own field names (with plausible, edge and random values) with
random keys, so most examples reach deep into the verb, not only the unknown-field check.
"""

from __future__ import annotations

import uuid

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from protomolt_jobs.errors import ActionError, InvalidInput
from tests.integration.test_verbs import make_verbs
from tests.support import pg
from tests.support.grpc_servers import TestServices

EXAMPLES = 2_000
pytestmark = pytest.mark.slow

scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=12)
)
json_values = st.recursive(
    scalars,
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=6), children, max_size=3)
    ),
    max_leaves=8,
)


@pytest.fixture(scope="module")
def world(pg_template):
    # A database of the module's own: the row counts below must see only this module's
    # writes, and `parked()` claims the oldest QUEUED row, which in a shared database may
    # be another test's.
    name = pg.new_name()
    dsn = pg.create_database(name, template=pg_template)
    services = TestServices().start()
    verbs = make_verbs(dsn, services.target)
    try:
        parked = verbs.parked()
        known_ids = [str(parked), str(uuid.uuid4())]
        yield verbs, services, known_ids
    finally:
        verbs.close()
        services.stop()
        pg.drop_database(name)


def objects(fields: dict[str, st.SearchStrategy]) -> st.SearchStrategy[dict]:
    keys = st.sampled_from(sorted(fields)) | st.text(max_size=8)

    def value_for(key: str) -> st.SearchStrategy:
        return fields.get(key, json_values) | json_values

    return st.lists(keys, max_size=5, unique=True).flatmap(
        lambda ks: st.fixed_dictionaries({k: value_for(k) for k in ks})
    )


def check(verbs, verb: str, body: dict) -> None:
    before = verbs.counts()
    try:
        answer = verbs(verb, body)
    except InvalidInput:
        assert verbs.counts() == before, f"{verb} refused {body!r} but wrote rows"
        return
    except ActionError as exc:  # pragma: no cover - the failure message is the point
        pytest.fail(f"{verb} raised {exc.code}: {exc.message} for {body!r}")
    assert isinstance(answer, dict) and isinstance(answer.get("ok"), bool), answer
    if answer["ok"] is False and verb != "complete-step":
        assert verbs.counts() == before, f"{verb} answered ok:false to {body!r} but wrote rows"


def property_settings():
    return settings(
        max_examples=EXAMPLES,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    )


def test_submit_workflow_never_fails_unexpectedly(world):
    verbs, _, known_ids = world
    workflow = st.just(verbs.workflow) | st.builds(
        lambda extra: {**verbs.workflow, **extra},
        st.dictionaries(st.text(max_size=6), json_values, max_size=2),
    )
    fields = {
        "workflow": workflow,
        "workflowName": st.sampled_from(["seed-review", "nope", "broken", "", " "]),
        "input": st.just({"text": "hello"})
        | st.dictionaries(
            st.sampled_from(["text", "fail", "meta", "lang", "zzz"]), json_values, max_size=3
        ),
        "jobId": st.sampled_from(known_ids) | st.uuids().map(str),
    }

    @property_settings()
    @given(objects(fields))
    def run(body):
        check(verbs, "submit-workflow", body)

    run()


def test_get_job_never_fails_unexpectedly(world):
    verbs, _, known_ids = world
    fields = {"jobId": st.sampled_from(known_ids) | st.uuids().map(str)}

    @property_settings()
    @given(objects(fields))
    def run(body):
        check(verbs, "get-job", body)

    run()


def test_list_jobs_never_fails_unexpectedly(world):
    verbs, _, _ = world
    fields = {
        "status": st.sampled_from(["QUEUED", "RUNNING", "WAITING", "COMPLETED", "FAILED", "DEAD"]),
        "workflowName": st.sampled_from(["seed-review", "inline"]),
        "limit": st.integers(min_value=-5, max_value=2**70),
        "offset": st.integers(min_value=-5, max_value=2**70),
    }

    @property_settings()
    @given(objects(fields))
    def run(body):
        check(verbs, "list-jobs", body)

    run()


def test_complete_step_never_fails_unexpectedly(world):
    verbs, _, known_ids = world
    fields = {
        "jobId": st.sampled_from(known_ids) | st.uuids().map(str),
        "stepName": st.sampled_from(["review", "embed", "tokenize", "ghost"]),
        "response": st.dictionaries(
            st.sampled_from(["approved", "note", "extra"]), json_values, max_size=3
        ),
    }

    @property_settings()
    @given(objects(fields))
    def run(body):
        check(verbs, "complete-step", body)

    run()
