"""The outbox relay: PENDING outbox rows -> the events topic, marked PUBLISHED after the ack.

Model (at least once; consumers dedupe on ``event_id``):

- **Claim.** ``store.outbox_claim(limit, claim_s=...)`` hands out PENDING rows oldest first by
  ``seq`` and stamps a claim lease (``claimed_until``) on them, skipping rows another relay
  holds and any row whose job still has an earlier PENDING row. So two relays never publish
  the same row at once, and a job's later event is never handed out before its earlier one
  is PUBLISHED or FAILED. The claim lease is longer than the longest pass
  (``message.timeout.ms`` plus the wait for delivery reports), so it cannot lapse under a
  relay that is still waiting for its acks.
- **Check.** Each payload is decoded as a ``WorkflowRunEvent`` and checked against the
  contract's rules in plain Python (``events.event_violations``; ``events.build_event``, the
  writer of stored payloads, already refuses to build a broken event, so no CEL is interpreted
  here), and its ``job_id`` must equal the row's key. A row stored as columns (the
  one-statement fenced writes, migration 0005) arrives with the bytes ``events.column_payload``
  encoded when the store read it, and is checked the same way. A
  row that fails is a recorded failure (``outbox_mark_failed(event_id, "<rule>: ...")``),
  never a crash; the row's later events in the batch are held back.
- **Publish.** The protobuf bytes, Confluent-framed unless ``jobs.events_wire = "raw"``
  (:mod:`protomolt_jobs.kafka.framing`), go to ``config.events_topic`` keyed by the job id, with
  an idempotent ``acks=all`` producer and the ``murmur2_random`` partitioner (the partition a
  Java client picks for the same key). With ``jobs.event_types = "upstream"`` an event whose
  type upstream's contract does not define (7 and above) goes to ``<events topic>.extended``
  instead, same key, same framing. The whole batch is produced, then the relay waits for
  every delivery report. The rest of the producer's librdkafka settings come from
  ``[jobs.kafka.producer]`` (:func:`~protomolt_jobs.config.kafka_client_settings`).
- **Schema id.** With a Schema Registry, the id is looked up (and its schema checked to
  frame ``WorkflowRunEvent`` as index ``[0]``) at start and, until it is known, before a pass
  claims anything: under ``jobs.registry_failure = "halt"`` a registry that cannot answer
  leaves every row PENDING and unclaimed; under ``"fallback-id-0"`` the pass frames with id 0.
  A registered schema whose first message is another refuses the start (and, found later,
  halts publishing whatever the policy).
- **Mark.** Acked rows become PUBLISHED in one statement. A delivery failure caused by the
  event itself (too large, refused as invalid) is recorded with ``outbox_mark_failed``:
  attempts + 1, ``last_error``, and FAILED (the DLQ) at the 10th. A failure caused by the
  broker lane (unreachable, timed out, fatal producer state) does not count against the
  event: nothing is written, the producer is rebuilt (an idempotent producer livelocks after
  a broker restart, LIBRARIES.md section 1), the claim lease runs out, and the rows are
  claimed again after a backoff. A broker outage therefore delays events and never
  dead-letters them.
- **Crash.** Killed between the publish and the mark (crash point ``after_publish``), the
  rows stay PENDING; once their claim lease runs out they are published again.

Per-job order on the topic follows state order: one job's events share a key and a
partition, the idempotent producer keeps their order in the partition, and the claim never
hands out an event before its predecessor is settled.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Producer
from google.protobuf.message import DecodeError

from protomolt_jobs import crashpoints
from protomolt_jobs.config import (
    UPSTREAM_EVENT_TYPES,
    ConfigError,
    JobsConfig,
    kafka_client_settings,
)
from protomolt_jobs.errors import StoreError
from protomolt_jobs.kafka.framing import EventFraming, RegistryError, RegistrySchemaMismatch
from protomolt_jobs.pb.ai.pipestream.proto.jobs.v1.jobs_pb2 import WorkflowRunEvent
from protomolt_jobs.service import Backoff, Service
from protomolt_jobs.store.events import event_violations
from protomolt_jobs.telemetry import metrics

__all__ = [
    "Relay",
    "check_payload",
    "inspect_payload",
    "is_lane_failure",
]

log = logging.getLogger("protomolt_jobs.relay")

#: Bound on one Schema Registry lookup, seconds: half the stop bound (``stop_timeout_s``), so a
#: stop never waits on a registry that accepts the connection and never answers.
REGISTRY_LOOKUP_S = 5.0
#: Extra time beyond ``message.timeout.ms`` the relay waits for the last delivery reports.
REPORT_MARGIN_S = 5.0
#: Waits of the loop after a failed pass, seconds (doubling up to the max).
BACKOFF_MIN_S = 0.5
BACKOFF_MAX_S = 10.0


#: Delivery errors that are the event's own fault: retrying the same bytes cannot succeed, so
#: they count against the row (10 make it FAILED). Every other error blames the broker lane
#: (outage, timeout, producer or idempotence state, errors this list does not know): the row
#: stays PENDING without an attempt counted, so a long outage never dead-letters good events.
_EVENT_CODES = frozenset(
    {
        KafkaError.MSG_SIZE_TOO_LARGE,
        KafkaError.INVALID_MSG_SIZE,
        KafkaError.RECORD_LIST_TOO_LARGE,
        KafkaError.INVALID_MSG,
        KafkaError.INVALID_RECORD,
        KafkaError.INVALID_TIMESTAMP,
        KafkaError.UNSUPPORTED_COMPRESSION_TYPE,
        KafkaError._BAD_MSG,
        KafkaError._INVALID_ARG,
        KafkaError._INVALID_TYPE,
        KafkaError._KEY_SERIALIZATION,
        KafkaError._VALUE_SERIALIZATION,
    }
)
#: Lane failures after which the producer is replaced (its idempotence state is suspect).
_REBUILD_CODES = frozenset(
    {
        KafkaError._MSG_TIMED_OUT,
        KafkaError._FATAL,
        KafkaError.UNKNOWN_PRODUCER_ID,
        KafkaError.OUT_OF_ORDER_SEQUENCE_NUMBER,
        KafkaError.INVALID_PRODUCER_EPOCH,
    }
)


def is_lane_failure(err: KafkaError) -> bool:
    """True when a delivery error blames the broker lane (outage, timeout, producer state)
    rather than the event; such failures are not counted against the row."""
    return err.code() not in _EVENT_CODES or err.fatal() or err.retriable()


def check_payload(payload: bytes, kafka_key: str) -> str | None:
    """:func:`inspect_payload` without the decoded event.

    :returns: None when publishable, else the failure text for ``last_error``.
    """
    return inspect_payload(payload, kafka_key)[1]


def inspect_payload(payload: bytes, kafka_key: str) -> tuple[WorkflowRunEvent | None, str | None]:
    """Decode and check one outbox payload before it is published.

    ``events.build_event`` (stored payloads) and ``events.column_payload`` (rows stored as
    columns) are our writers of outbox payloads, and our statements fill the columns with a
    row's facts only, so the relay does not run the contract's CEL rules again
    (DESIGN.md section 17): it decodes the payload, runs the contract's rules in plain Python
    (:func:`protomolt_jobs.store.events.event_violations`, microseconds; the same rule ids as
    ``wire.validate_event``) and compares the job id with the row's key. A row that another
    writer (a hand-written INSERT, a restored dump) made unpublishable is still caught and
    dead-lettered.

    :param payload: the row's serialized ``WorkflowRunEvent``.
    :param kafka_key: the row's key (the job id string).
    :returns: ``(event, None)`` when publishable, else ``(event or None, problem)``: the
        failure text for ``last_error``, starting with the rule id
        (``"terminal-carries-error: ..."``), ``undecodable`` or ``key-mismatch``.
    """
    try:
        event = WorkflowRunEvent.FromString(payload)
    except (DecodeError, ValueError, RuntimeError) as exc:
        return None, (
            f"undecodable: the payload is not a WorkflowRunEvent: {exc or type(exc).__name__}"
        )
    violations = event_violations(event)
    if violations:
        return event, "; ".join(
            f"{v.rule_id}: {v.path or '(message)'}: {v.message}" for v in violations
        )
    if event.job_id != kafka_key:
        return event, (
            f"key-mismatch: the event's job_id {event.job_id!r} differs from the row's "
            f"kafka_key {kafka_key!r}"
        )
    return event, None


class Relay(Service):
    """Drains the outbox to ``config.events_topic`` (see the module doc).

    :param store: the job store (``outbox_claim``, ``outbox_mark_published``,
        ``outbox_mark_failed``).
    :param config: the jobs configuration; ``kafka_bootstrap`` must be set. Uses
        ``events_topic``, ``event_types``, ``events_wire``, ``schema_registry_url``,
        ``registry_failure``, ``kafka_producer``, ``relay_batch_size``,
        ``relay_poll_interval_ms`` and ``relay_linger_seconds``.
    :param producer_config: librdkafka settings merged over the configuration's (tests use it
        for a shorter ``message.timeout.ms``; the broker bounds of
        :func:`~protomolt_jobs.config.kafka_client_settings` do not apply to it). The keys in
        :data:`~protomolt_jobs.config.PRODUCER_OWNED` (``enable.idempotence``, ``acks``,
        ``partitioner`` ...) cannot be overridden: ordering and interop depend on them.
    :raises ConfigError: when no broker is configured or an override is refused.
    """

    name = "relay"
    #: A pass waiting for delivery reports gives up on stop, so a stop is quick.
    stop_timeout_s = 10.0

    def __init__(
        self,
        store: Any,
        *,
        config: JobsConfig,
        producer_config: dict[str, Any] | None = None,
    ) -> None:
        if not config.kafka_bootstrap:
            raise ConfigError("jobs.kafka_bootstrap is not set: the relay needs a broker")
        overrides = kafka_client_settings(
            "producer", producer_config or {}, broker_bounds=False, with_defaults=False
        )
        super().__init__(worker_id=config.worker_id)
        self._store = store
        self._config = config
        self.topic = config.events_topic
        #: Where event types upstream does not define go (``event_types = "upstream"``), or
        #: None: every event goes to :attr:`topic`.
        self.extended_topic = config.extended_topic
        self._settings: dict[str, Any] = {
            "client.id": f"protomolt-jobs-relay-{config.worker_id}",
            **config.producer_settings(),
            **overrides,
            "bootstrap.servers": config.kafka_bootstrap,
            "enable.idempotence": True,
            "acks": "all",
            "partitioner": "murmur2_random",
            "error_cb": self._on_client_error,
        }
        try:
            message_timeout_s = int(self._settings["message.timeout.ms"]) / 1000.0
        except (TypeError, ValueError):
            message_timeout_s = 0.0
        if message_timeout_s <= 0:
            raise ConfigError("producer 'message.timeout.ms' must be a positive integer")
        #: Longest wait for a batch's delivery reports, seconds.
        self.report_wait_s = message_timeout_s + REPORT_MARGIN_S
        #: The claim lease on outbox rows, seconds: longer than a pass can take.
        self.claim_s = 2 * self.report_wait_s
        #: Framing applied at produce time (``jobs.events_wire``); the outbox stays raw.
        self._frame = EventFraming(
            config.events_wire,
            topic=config.events_topic,
            registry_url=config.schema_registry_url,
            on_failure=config.registry_failure,
            timeout_s=REGISTRY_LOOKUP_S,
        )
        self._producer: Producer | None = None
        self._fatal = False
        # Held for one pass (and while the producer is dropped): one pass at a time.
        self._pass_lock = threading.Lock()
        self._retry = Backoff(BACKOFF_MIN_S, BACKOFF_MAX_S)
        self._lane_trouble = False
        self._last_client_error: tuple[int, float] | None = None

    # -- lifecycle (start/stop/health: protomolt_jobs.service.Service) ----------------------

    def _started_fields(self) -> dict[str, Any]:
        return {
            "topic": self.topic,
            "extended_topic": self.extended_topic,
            "bootstrap": self._config.kafka_bootstrap,
            "batch": self._config.relay_batch_size,
            "idle_poll_ms": self._config.relay_poll_interval_ms,
            "linger_s": self._config.relay_linger_seconds,
            "registry_failure": self._config.registry_failure,
        }

    def start(self) -> None:
        """Check the Schema Registry's schema (when one is configured), then start the loop
        (see :class:`~protomolt_jobs.service.Service`).

        A registry that cannot answer now does not stop the start: ``jobs.registry_failure``
        decides at publish time, and the lookup is tried again.

        :raises ConfigError: the schema registered under ``<events topic>-value`` does not
            frame a ``WorkflowRunEvent`` as message index ``[0]`` (the relay refuses to start
            rather than stamp an id that names another message).
        """
        if self._frame.needs_registry:
            try:
                self._frame.check_registered()
            except RegistrySchemaMismatch as exc:
                raise ConfigError(f"jobs.schema_registry_url: {exc}") from exc
            except RegistryError as exc:
                log.warning(
                    "%s; the relay starts anyway (jobs.registry_failure = %s)",
                    exc,
                    self._config.registry_failure,
                    extra={"action": "relay_registry_unreachable", "topic": self.topic},
                )
        super().start()

    def topic_for(self, event_type: int) -> str:
        """The topic an event of ``event_type`` (a ``WorkflowRunEvent.Type`` number) goes to:
        :attr:`extended_topic` for a type upstream's contract does not define when
        ``event_types = "upstream"``, else :attr:`topic`."""
        if self.extended_topic is not None and event_type not in UPSTREAM_EVENT_TYPES:
            return self.extended_topic
        return self.topic

    def _on_stopped(self) -> None:
        # A pass waiting for acks gave up on stop; its rows are claimed again later.
        with self._pass_lock:
            self._drop_producer()

    def stop(self, timeout_s: float | None = None) -> bool:
        """Stop the loop (see :class:`~protomolt_jobs.service.Service`), then close the
        producer, also for a relay only driven by :meth:`run_once` (never started): its
        librdkafka threads would otherwise keep reconnecting to the broker."""
        stopped = super().stop(timeout_s)
        if stopped:
            with self._pass_lock:
                self._drop_producer()
        return stopped

    # -- one pass ----------------------------------------------------------------------------

    def run_once(self) -> int:
        """Claim one batch, check, publish, wait for the acks and mark.

        :returns: rows this pass marked PUBLISHED.
        :raises StoreError: when the claim or a mark fails (published rows stay PENDING and
            are published again once their claim lease runs out).
        """
        with self._pass_lock:
            self._lane_trouble = False
            schema_id = self._schema_id()
            if schema_id is None:
                # No id and the policy halts: claim nothing, so every row stays PENDING and
                # is published as soon as the registry answers.
                self._lane_trouble = True
                return 0
            rows = self._store.outbox_claim(self._config.relay_batch_size, claim_s=self.claim_s)
            if not rows:
                return 0
            return self._relay(sorted(rows, key=lambda r: r.seq), schema_id)

    def _schema_id(self) -> int | None:
        """The schema id this pass frames with, or None when the pass must publish nothing
        (the registry cannot say it under ``halt``, or its schema does not fit)."""
        try:
            return self._frame.schema_id()
        except RegistrySchemaMismatch as exc:
            log.error(
                "%s; publishing nothing until the subject holds jobs.proto",
                exc,
                extra={"action": "relay_registry_mismatch", "topic": self.topic},
            )
        except RegistryError as exc:
            log.warning(
                "%s; events stay PENDING (jobs.registry_failure = halt)",
                exc,
                extra={"action": "relay_registry_failed", "topic": self.topic},
            )
        return None

    @property
    def settings(self) -> dict[str, Any]:
        """The librdkafka settings the producer is built with (callbacks included)."""
        return dict(self._settings)

    @property
    def lane_trouble(self) -> bool:
        """True when the last pass left rows unpublished because of the broker lane."""
        return self._lane_trouble

    # -- internals ---------------------------------------------------------------------------

    def _relay(self, rows: list[Any], schema_id: int) -> int:
        failures: list[tuple[Any, str]] = []
        held_keys: set[str] = set()
        reports: dict[Any, KafkaError | None] = {}
        produced: list[Any] = []
        unproduced = 0
        extended = 0
        producer = self._ensure_producer()

        for row in rows:
            if row.kafka_key in held_keys:
                continue  # an earlier event of this job failed here; keep state order
            event, problem = inspect_payload(row.payload, row.kafka_key)
            if problem is not None or event is None:
                failures.append((row, problem or "undecodable"))
                held_keys.add(row.kafka_key)
                continue
            topic = self.topic_for(event.type)
            value = self._frame.frame(row.payload, schema_id)
            if not self._produce(producer, topic, row, value, reports):
                held_keys.add(row.kafka_key)
                unproduced += 1
                continue
            produced.append(row)
            extended += topic != self.topic

        self._await_reports(producer, produced, reports)
        crashpoints.reached("after_publish")

        published: list[Any] = []
        rebuild = self._fatal
        lane_rows = unproduced
        for row in produced:
            err = reports.get(row.event_id)
            if row.event_id not in reports:
                lane_rows += 1  # no report: treated as a lane failure below
                rebuild = True
                continue
            if err is None:
                published.append(row)
                continue
            if is_lane_failure(err):
                lane_rows += 1
                rebuild = rebuild or err.code() in _REBUILD_CODES or err.fatal()
                continue
            failures.append((row, f"delivery refused: {err.name()}: {err.str()}"))

        if lane_rows and self._stopping():
            # Interrupted by stop(): not the broker's fault; the rows are claimed again later.
            rebuild = False
            log.info(
                "relay stopping: %d events left unacked; they stay PENDING",
                lane_rows,
                extra={"action": "relay_pass_interrupted", "events": lane_rows},
            )
        elif lane_rows:
            self._lane_trouble = True
            log.warning(
                "%d events not acked by %s (broker unreachable or timed out); they stay PENDING "
                "and are claimed again after their claim lease",
                lane_rows,
                self._config.kafka_bootstrap,
                extra={"action": "relay_lane_failed", "events": lane_rows, "topic": self.topic},
            )
        if rebuild:
            self._rebuild_producer()

        count = 0
        if published:
            count = self._store.outbox_mark_published([r.event_id for r in published])
            metrics.RELAY_PUBLISHED.inc(count)
            log.info(
                "published %d events to %s%s",
                len(published),
                self.topic,
                f" and {self.extended_topic} (types upstream does not define)" if extended else "",
                extra={
                    "action": "relay_published",
                    "events": len(published),
                    "topic": self.topic,
                    "extended_topic": self.extended_topic,
                    "frame_schema_id": schema_id,
                },
            )
        for row, error in failures:
            settled = self._store.outbox_mark_failed(row.event_id, error)
            dead = settled is not None and settled.status == "FAILED"
            log.warning(
                "event %s (%s, job %s) not published, attempt %d: %s%s",
                row.event_id,
                row.event_type,
                row.kafka_key,
                row.attempts + 1,
                error,
                "; the row is FAILED (outbox dead letter)" if dead else "",
                extra={
                    "action": "relay_event_dead" if dead else "relay_event_failed",
                    "event_id": str(row.event_id),
                    "job_id": row.kafka_key,
                    "attempt": row.attempts + 1,
                },
            )
        return count

    def _produce(
        self,
        producer: Producer,
        topic: str,
        row: Any,
        value: bytes,
        reports: dict[Any, KafkaError | None],
    ) -> bool:
        event_id = row.event_id

        def on_delivery(err: KafkaError | None, _msg: Any) -> None:
            reports[event_id] = err

        while True:
            try:
                producer.produce(topic, value=value, key=row.kafka_key, on_delivery=on_delivery)
                return True
            except BufferError:
                # The local queue is full: let deliveries drain it, then try again.
                producer.poll(0.1)
                if self._stopping():
                    return False
            except KafkaException as exc:
                err = exc.args[0] if exc.args else None
                if isinstance(err, KafkaError) and not is_lane_failure(err):
                    reports[event_id] = err
                    return True  # recorded as the event's failure with the other reports
                self._fatal = self._fatal or (isinstance(err, KafkaError) and err.fatal())
                return False

    def _await_reports(
        self, producer: Producer, produced: list[Any], reports: dict[Any, KafkaError | None]
    ) -> None:
        deadline = time.monotonic() + self.report_wait_s
        while any(r.event_id not in reports for r in produced):
            if self._stopping() or time.monotonic() > deadline:
                # Give up on this batch: purge what is queued so the reports arrive now
                # (as _PURGE_* lane failures) and nothing is sent after we return.
                try:
                    producer.purge(in_queue=True, in_flight=True, blocking=False)
                except KafkaException:
                    pass
                producer.poll(0.5)
                return
            producer.poll(0.05)

    def _stopping(self) -> bool:
        # Only a running loop is interrupted by stop(); a direct run_once() after stop()
        # (tests, a manual drain) still waits for its reports.
        return self._stop.is_set() and self._thread is not None

    def _ensure_producer(self) -> Producer:
        if self._producer is None:
            self._producer = Producer(self._settings)
            self._fatal = False
        return self._producer

    def _drop_producer(self) -> None:
        producer, self._producer = self._producer, None
        if producer is not None:
            try:
                producer.purge(in_queue=True, in_flight=True, blocking=False)
                producer.flush(0)
            except (KafkaException, RuntimeError):
                pass

    def _rebuild_producer(self) -> None:
        log.warning(
            "rebuilding the relay's producer after delivery timeouts or a fatal producer error",
            extra={"action": "relay_producer_rebuilt", "topic": self.topic},
        )
        self._drop_producer()

    def _on_client_error(self, err: KafkaError) -> None:
        if err.fatal():
            self._fatal = True
        # An outage repeats the same error every second; say it once per 30 s.
        now = time.monotonic()
        last = self._last_client_error
        if last is not None and last[0] == err.code() and now - last[1] < 30.0:
            return
        self._last_client_error = (err.code(), now)
        log.warning(
            "relay producer: %s",
            err,
            extra={"action": "relay_broker_error", "error_code": err.name(), "topic": self.topic},
        )

    def _run(self, stop: threading.Event) -> None:
        idle_s = self._config.relay_poll_interval_ms / 1000.0
        linger_s = self._config.relay_linger_seconds
        batch = self._config.relay_batch_size
        while not stop.is_set():
            self._checkpoint()
            try:
                published = self.run_once()
                failed = self._lane_trouble
            except StoreError as exc:
                log.warning(
                    "relay pass failed on the store: %s; retrying",
                    exc,
                    extra={"action": "relay_store_failed"},
                )
                published, failed = 0, True
            if failed:
                if self._sleep(self._retry.next()):
                    return
                continue
            self._retry.reset()
            self._progressed()
            if published == 0:
                if self._sleep(idle_s):
                    return
            elif published < batch and linger_s > 0 and self._sleep(linger_s):
                # A part batch: let events gather before the next pass (a full one goes on
                # at once, the outbox is behind).
                return
