"""Scheduling in the store on real PostgreSQL: priority, fairness passes, queues, dedup keys.

These are about claim order, so rows go in through the insert statement in one transaction
(``executemany``: the same SQL as ``job_insert``, minus a round trip per row) and come out
through ``job_claim``.
"""

from __future__ import annotations

import threading
import uuid

import psycopg
import pytest
from psycopg.types.json import Jsonb

from protomolt_jobs.store import JobStore
from protomolt_jobs.store.queries import QUERIES
from tests.support.factories import minimal_definition, new_job


@pytest.fixture
def store(fresh_dsn):
    s = JobStore.open(fresh_dsn, max_size=60)
    try:
        yield s
    finally:
        s.close()


def bulk_insert(dsn: str, rows: list[dict]) -> list[uuid.UUID]:
    """Insert rows with the job_insert statement itself, in one transaction."""
    definition = Jsonb(minimal_definition("bulk"))
    params = []
    ids = []
    for r in rows:
        job_id = uuid.uuid4()
        ids.append(job_id)
        params.append(
            {
                "job_id": job_id,
                "workflow_name": r.get("workflow_name", "bulk"),
                "workflow_definition": definition,
                "input": Jsonb({}),
                "status": "QUEUED",
                "max_attempts": 3,
                "error": None,
                "priority": r.get("priority", 3),
                "queue": r.get("queue", "default"),
                "fairness_key": r.get("fairness_key", "default"),
                "stride": 1.0 / r.get("weight", 1.0),
                "dedup_key": None,
                "deadline_s": None,
                "trace_context": None,
                "actor": "api",
                "groups": None,
                "retention": None,
            }
        )
    with psycopg.connect(dsn) as conn, conn.cursor() as cur:
        cur.executemany(QUERIES["job_insert"], params)
    return ids


def claim_order(store: JobStore, n: int, **kw) -> list:
    out = []
    for _ in range(n):
        job = store.job_claim("w", 60, **kw)
        if job is None:
            break
        out.append(job)
    return out


def test_defaults_claim_in_submit_order_as_before(store, fresh_dsn):
    ids = bulk_insert(fresh_dsn, [{} for _ in range(50)])
    claimed = claim_order(store, 60)
    assert [j.job_id for j in claimed] == ids
    assert {(j.priority, j.queue, j.fairness_key) for j in claimed} == {(3, "default", "default")}


def test_rows_queued_before_the_migration_keep_their_order_ahead_of_new_ones(store, fresh_dsn):
    # A row as 0001 wrote it (no scheduling columns given): pass 0, so it goes first.
    old = uuid.uuid4()
    with psycopg.connect(fresh_dsn, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO workflow_run (job_id, workflow_name, workflow_definition, input, status,"
            " created_at) VALUES (%s, 'old', '{}', '{}', 'QUEUED', now() - interval '1 hour')",
            (old,),
        )
    new = bulk_insert(fresh_dsn, [{} for _ in range(3)])
    assert [j.job_id for j in claim_order(store, 10)] == [old, *new]


def test_priority_one_submitted_last_is_claimed_next(store, fresh_dsn):
    bulk_insert(fresh_dsn, [{} for _ in range(1000)])
    claim_order(store, 3)
    (urgent,) = bulk_insert(fresh_dsn, [{"priority": 1}])
    first_five = [j.job_id for j in claim_order(store, 5)]
    assert urgent in first_five
    assert first_five[0] == urgent


def test_a_flooding_tenant_does_not_delay_another_tenants_first_runs(store, fresh_dsn):
    a = bulk_insert(fresh_dsn, [{"fairness_key": "A"} for _ in range(5000)])
    b = bulk_insert(fresh_dsn, [{"fairness_key": "B"} for _ in range(50)])
    claimed = [j.job_id for j in claim_order(store, 200)]
    position = {job_id: i for i, job_id in enumerate(claimed)}
    assert all(job_id in position for job_id in b), "every B job within the first 200 claims"
    # Interleaved one for one while both have a backlog; A's own order kept.
    assert max(position[j] for j in b) <= 101
    a_claimed = [j for j in claimed if j not in set(b)]
    assert a_claimed == a[: len(a_claimed)]


def test_a_tenant_flooding_from_many_threads_still_interleaves_with_another(store, fresh_dsn):
    # Submits of one key do not lock each other (migration 0010): concurrent ones may share a
    # pass, which must not let a flood submitted from 8 threads crowd another key out.
    def flood(t: int) -> None:
        for _ in range(60):
            store.job_insert(new_job(fairness_key="A"))

    threads = [threading.Thread(target=flood, args=(t,)) for t in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    b = [store.job_insert(new_job(fairness_key="B")).job.job_id for _ in range(20)]
    claimed = [j.job_id for j in claim_order(store, 120)]
    position = {job_id: i for i, job_id in enumerate(claimed)}
    assert all(job_id in position for job_id in b), "every B job within the first 120 claims"
    # One for one while both have a backlog, give or take the passes A's threads shared.
    assert max(position[j] for j in b) <= 2 * len(b) + 8


def test_concurrent_default_submits_keep_passes_in_step_with_their_number(store, fresh_dsn):
    # 8 threads x 25 default submits: the passes handed out grow with the number of jobs
    # (ties only among submits that were in flight together), so a later tenant is not sent
    # behind the whole default backlog either.
    def submit() -> None:
        for _ in range(25):
            store.job_insert(new_job())

    threads = [threading.Thread(target=submit) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    with psycopg.connect(fresh_dsn) as conn:
        (distinct, top) = conn.execute(
            "SELECT count(DISTINCT fairness_pass), max(fairness_pass) FROM workflow_run"
        ).fetchone()
    assert 200 / 8 <= distinct <= 200 and top == distinct


def test_weights_share_claims_in_proportion(store, fresh_dsn):
    bulk_insert(fresh_dsn, [{"fairness_key": "heavy", "weight": 3.0} for _ in range(300)])
    bulk_insert(fresh_dsn, [{"fairness_key": "light"} for _ in range(300)])
    claimed = claim_order(store, 200)
    heavy = sum(1 for j in claimed if j.fairness_key == "heavy")
    assert 140 <= heavy <= 160, heavy  # 3:1 -> 150 of 200


def test_a_tenant_returning_after_others_flooded_is_not_sent_to_the_back(store, fresh_dsn):
    # A floods and drains; then B floods: A's next run interleaves with B's backlog (the base
    # of an empty queue is the largest pass handed out, so A's old pass cannot put it ahead
    # forever, and B's fresh key cannot push A behind B's whole flood).
    bulk_insert(fresh_dsn, [{"fairness_key": "A"} for _ in range(100)])
    claim_order(store, 100)
    bulk_insert(fresh_dsn, [{"fairness_key": "B"} for _ in range(100)])
    (a_next,) = bulk_insert(fresh_dsn, [{"fairness_key": "A"}])
    claimed = [j.job_id for j in claim_order(store, 10)]
    assert a_next in claimed


def test_workers_claim_only_the_queues_they_serve(store, fresh_dsn):
    (gpu,) = bulk_insert(fresh_dsn, [{"queue": "gpu"}])
    (cpu,) = bulk_insert(fresh_dsn, [{}])
    assert store.job_claim("w", 60, queues=["other"]) is None
    assert store.job_claim("w", 60, queues=["gpu"]).job_id == gpu
    assert store.job_claim("w", 60, queues=["gpu", "default"]).job_id == cpu


def test_a_queue_limited_after_a_worker_read_its_limits_is_not_claimed_past_its_cap(
    store, fresh_dsn
):
    # A worker learns the limited queues at start and every 30 s; a node that limits a queue
    # in between must not let the first worker exceed the cap meanwhile (limits are enforced
    # in the database, whatever a worker believes).
    bulk_insert(fresh_dsn, [{"queue": "gpu"} for _ in range(3)])
    first = store.job_claim("w", 60, queues=["gpu"])
    assert first is not None
    store.queue_limits_sync({"gpu": {"max_running": 1}})
    # The stale worker still says nothing is limited: it gets no second gpu job, by either
    # claim statement, and other queues are still served.
    (cpu,) = bulk_insert(fresh_dsn, [{}])
    assert store.job_claim("w", 60, queues=["gpu"]) is None
    assert store.job_claim("w", 60, queues=["gpu", "default"], limited=["other"]).job_id == cpu
    assert store.job_claim("w", 60, queues=["gpu"], limited=["other"]) is None
    # Knowing the limit, it claims through the permit: the slot frees when the first ends.
    store.job_complete(first.lease, {}, "done")
    assert store.job_claim("w", 60, queues=["gpu"], limited=["gpu"]) is not None
    assert store.job_claim("w", 60, queues=["gpu"], limited=["gpu"]) is None


def test_strict_priority_across_served_queues(store, fresh_dsn):
    bulk_insert(fresh_dsn, [{"queue": "default"} for _ in range(5)])
    (urgent_gpu,) = bulk_insert(fresh_dsn, [{"queue": "gpu", "priority": 1}])
    assert store.job_claim("w", 60, queues=["default", "gpu"]).job_id == urgent_gpu


def test_claim_plan_is_index_backed_with_many_queues(store, fresh_dsn):
    with psycopg.connect(fresh_dsn, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO workflow_run (job_id, workflow_name, workflow_definition, input, status,"
            " queue, fairness_key, fairness_pass)"
            " SELECT gen_random_uuid(), 'q', '{}', '{}', 'QUEUED', 'q' || (i % 10),"
            "  'k' || (i % 1000), i / 1000"
            " FROM generate_series(1, 20000) AS i"
        )
        conn.execute("ANALYZE workflow_run")
        params = {
            "worker_id": "w",
            "lease_s": 30.0,
            "queues": ["q1", "q2"],
            "limited": ["q2"],
            "skip_busy": True,
        }
        for name in ("job_claim", "job_claim_limited"):
            plan = "\n".join(
                r[0] for r in conn.execute("EXPLAIN " + QUERIES[name], params).fetchall()
            )
            assert "Seq Scan on workflow_run" not in plan, plan
            assert "idx_workflow_run_claim_sched" in plan, plan


def test_fifty_concurrent_submits_with_one_dedup_key_make_one_run(store):
    barrier = threading.Barrier(50)
    outcomes: list = []
    errors: list[BaseException] = []

    def submit() -> None:
        try:
            barrier.wait(timeout=30)
            outcomes.append(store.job_insert(new_job(dedup_key="nightly")))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=submit) for _ in range(50)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert errors == []
    assert len(outcomes) == 50
    run_ids = {o.job.job_id for o in outcomes}
    assert len(run_ids) == 1
    assert sum(o.created for o in outcomes) == 1
    assert sum(o.deduplicated for o in outcomes) == 49
    (run_id,) = run_ids
    # After the run ends, the key is free.
    job = store.job_claim("w", 60)
    assert job.job_id == run_id
    store.job_complete(job.lease, {}, "done")
    again = store.job_insert(new_job(dedup_key="nightly"))
    assert again.created and not again.deduplicated and again.job.job_id != run_id


def test_job_id_resubmit_wins_over_dedup(store):
    first = store.job_insert(new_job(dedup_key="k"))
    again = store.job_insert(new_job(job_id=first.job.job_id, dedup_key="k"))
    assert not again.created and not again.deduplicated
    assert again.job.job_id == first.job.job_id


def test_list_filters_by_queue_and_fairness_key(store):
    store.job_insert(new_job(queue="gpu", fairness_key="t1"))
    store.job_insert(new_job(queue="gpu", fairness_key="t2"))
    store.job_insert(new_job(fairness_key="t1"))
    assert len(store.job_list(queue="gpu")) == 2
    assert len(store.job_list(fairness_key="t1")) == 2
    assert len(store.job_list(queue="gpu", fairness_key="t2")) == 1


def test_bad_scheduling_values_are_refused_before_any_write(store):
    for kw, field in (
        ({"priority": 0}, "priority"),
        ({"priority": 6}, "priority"),
        ({"queue": " "}, "queue"),
        ({"fairness_key": ""}, "fairness_key"),
        ({"fairness_weight": 0}, "fairness_weight"),
        ({"dedup_key": ""}, "dedup_key"),
    ):
        with pytest.raises(ValueError, match=field):
            store.job_insert(new_job(**kw))
    assert store.job_list() == []


def test_the_default_keys_stamp_is_index_backed_and_takes_no_lock(store, fresh_dsn):
    bulk_insert(fresh_dsn, [{} for _ in range(200)] + [{"fairness_key": "A"}])
    with psycopg.connect(fresh_dsn) as conn:
        conn.execute("ANALYZE workflow_run")
        params = {
            "job_id": uuid.uuid4(),
            "workflow_name": "x",
            "workflow_definition": Jsonb({}),
            "input": Jsonb({}),
            "status": "QUEUED",
            "max_attempts": 3,
            "error": None,
            "priority": 3,
            "queue": "default",
            "fairness_key": "default",
            "stride": 1.0,
            "dedup_key": None,
            "deadline_s": None,
            "trace_context": None,
            "actor": "api",
            "groups": None,
            "retention": None,
        }
        conn.execute(QUERIES["job_insert"], params)
        # The default key wrote no counter row (so no submit of it waits on another's lock).
        keys = [r[0] for r in conn.execute("SELECT fairness_key FROM workflow_fairness")]
        assert keys == ["A"]
        plan = "\n".join(
            r[0] for r in conn.execute("EXPLAIN " + QUERIES["job_insert"], params).fetchall()
        )
        assert "idx_workflow_run_fairness_tail" in plan, plan
        assert "Seq Scan on workflow_run" not in plan, plan


def test_fifty_dedup_submits_racing_the_first_runs_completion_never_make_two_live_runs(store):
    # While 50 submits with one dedupKey are in flight, the first run is claimed and completed
    # as soon as it exists: every submit answers a run (created, or the live one), the key is
    # held by at most one live run at any time, and nothing fails.
    barrier = threading.Barrier(51)
    outcomes: list = []
    errors: list[BaseException] = []
    completed: list = []

    def submit() -> None:
        try:
            barrier.wait(timeout=30)
            outcomes.append(store.job_insert(new_job(dedup_key="race")))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    def finish_the_first() -> None:
        try:
            barrier.wait(timeout=30)
            for _ in range(2000):
                job = store.job_claim("w", 60)
                if job is not None:
                    store.job_complete(job.lease, {}, "done")
                    completed.append(job.job_id)
                    return
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=submit) for _ in range(50)]
    threads.append(threading.Thread(target=finish_the_first))
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert errors == []
    assert len(outcomes) == 50 and len(completed) == 1
    created = {o.job.job_id for o in outcomes if o.created}
    assert completed[0] in created
    # Every deduplicated answer names a run one of the submits created.
    assert {o.job.job_id for o in outcomes if o.deduplicated} <= created
    assert all(o.created != o.deduplicated for o in outcomes)
    live = [
        j
        for j in store.job_list(limit=500)
        if j.dedup_key == "race" and j.status in ("QUEUED", "RUNNING")
    ]
    assert len(live) <= 1
    # Runs that hold the key one after another: created runs other than the completed one are
    # at most one live run now (the others would have had to end, and nothing ended them).
    assert len(created) <= 2
