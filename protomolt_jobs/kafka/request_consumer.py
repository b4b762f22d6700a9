"""The request-topic consumer: one ``WorkflowRunRequest`` record is one ``submit-workflow``.

Model (at least once, idempotent on ``job_id``):

- Group ``protomolt-jobs-worker`` (:data:`~protomolt_jobs.config.CONSUMER_GROUP`), auto commit
  off, ``auto.offset.reset = earliest``. Records are handled one at a time, in partition order.
  The other librdkafka settings are :data:`~protomolt_jobs.config.CONSUMER_DEFAULTS` (a 6 s
  session timeout, the least a stock Apache Kafka broker accepts) overlaid with
  ``[jobs.kafka.consumer]``.
- Each record ends in exactly one committed database write before its offset is committed:

  ======================================================= ==========================================
  the record                                              what is written
  ======================================================= ==========================================
  no value, undecodable, or breaks the request rules      a ``workflow_run_rejects`` row
  (an ``input`` holding NaN or an infinity included)
  breaks the verbs' input rule (``input_rules``: NUL,     a ``workflow_run_rejects`` row, reason
  lone surrogates, integers beyond +-2**53, depth)        ``invalid-input: <the verb's message>``
  handling failed unexpectedly (a defect)                 a ``workflow_run_rejects`` row
                                                          (``internal-error: ...``)
  submitter ``ok``                                        the job row (or nothing: it already exists)
  submitter reason ``unknown-workflow``, ``no-repository``, a FAILED row at birth with the loud error
  ``corrupt-workflow``                                    (idempotent on ``job_id``)
  submitter reason ``invalid-input``, ``invalid-job-id``,  a ``workflow_run_rejects`` row
  ``invalid-definition`` (or any other refusal)
  ======================================================= ==========================================

- The offset (``record offset + 1``) is committed synchronously only after that write commits.
  A crash in between (crash point ``after_row_commit``) replays the record: the job insert is
  idempotent, so there is still exactly one row (a reject may be stored twice).
- A :class:`~protomolt_jobs.errors.StoreError` (database outage) commits nothing: the record is
  held and handled again after a backoff; the loop never dies. A broker outage makes ``poll``
  return nothing (librdkafka reconnects on its own); a commit that fails for a transient reason
  is retried before the next record is read.

Values are raw protobuf bytes; a record in Confluent wire framing (magic byte 0, schema id,
message-index path ``[1]``, as Java ProtoMolt producers write it) is accepted as well: raw
protobuf never starts with a zero byte, so the two cannot be confused.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Message
from google.protobuf import json_format
from google.protobuf.message import DecodeError

from protomolt_jobs import crashpoints
from protomolt_jobs.config import CONSUMER_GROUP, ConfigError, JobsConfig, kafka_client_settings
from protomolt_jobs.errors import InvalidInput, StoreError
from protomolt_jobs.input_rules import check_json, check_text
from protomolt_jobs.kafka.framing import REQUEST_INDEX_PATH, unframe
from protomolt_jobs.kafka.wire import WorkflowRunRequest, validate_request
from protomolt_jobs.runs import scheduling
from protomolt_jobs.service import Service
from protomolt_jobs.store.records import NewJob

__all__ = [
    "FAIL_AT_BIRTH_REASONS",
    "RequestConsumer",
    "decode_request",
]

log = logging.getLogger("protomolt_jobs.request_consumer")

#: Submitter refusals that leave a FAILED row (the name cannot run), not a reject.
FAIL_AT_BIRTH_REASONS = frozenset({"unknown-workflow", "no-repository", "corrupt-workflow"})

#: First and largest wait after a store failure or a broker error, seconds.
BACKOFF_MIN_S = 0.2
BACKOFF_MAX_S = 5.0


#: Broker errors on which a failed offset commit is worth retrying (the others mean the
#: partition moved or the group changed: the record is redelivered and replays idempotently).
_RETRY_COMMIT = frozenset(
    {
        KafkaError._TRANSPORT,
        KafkaError._ALL_BROKERS_DOWN,
        KafkaError._TIMED_OUT,
        KafkaError.REQUEST_TIMED_OUT,
        KafkaError.COORDINATOR_NOT_AVAILABLE,
        KafkaError.NOT_COORDINATOR,
        KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
        KafkaError.NETWORK_EXCEPTION,
    }
)


def _unframe(raw: bytes) -> bytes:
    """Strip Confluent wire framing (``00 <schema id:4> <index path> <protobuf>``).

    :raises ValueError: when the frame is malformed or names another message than the request.
    """
    _schema_id, path, body = unframe(raw)
    if path != list(REQUEST_INDEX_PATH):
        raise ValueError(
            f"the frame names message index path {path}; WorkflowRunRequest is [1] in jobs.proto"
        )
    return body


def decode_request(raw: bytes | None) -> tuple[WorkflowRunRequest | None, str | None]:
    """Decode a request record's value.

    :param raw: the record value (raw protobuf, or Confluent-framed protobuf), or None.
    :returns: ``(WorkflowRunRequest, None)``, or ``(None, reason)`` where reason starts with
        ``undecodable:``. Never raises.
    """
    if raw is None:
        return None, "undecodable: the record has no value (a tombstone)"
    body = bytes(raw)
    if body[:1] == b"\x00":
        try:
            body = _unframe(body)
        except ValueError as exc:
            return None, f"undecodable: bad Confluent framing: {exc}"
    try:
        return WorkflowRunRequest.FromString(body), None
    except (DecodeError, ValueError, RuntimeError) as exc:
        return None, f"undecodable: not a WorkflowRunRequest: {exc or type(exc).__name__}"


def _summarize(violations: list[Any]) -> str:
    return "; ".join(f"{v.rule_id} at {v.path or '(message)'}: {v.message}" for v in violations)


class RequestConsumer(Service):
    """Reads ``config.effective_request_topic`` and submits each record (see the module doc).

    :param store: the job store (``job_insert``, ``reject_insert``).
    :param submitter: a :class:`~protomolt_jobs.runs.submitter.Submitter`.
    :param config: the jobs configuration; ``kafka_bootstrap`` must be set (uses
        ``kafka_consumer`` and ``max_attempts`` too).
    :param consumer_config: librdkafka settings merged over the configuration's (tests use it
        to shorten timeouts on the test broker; the broker bounds of
        :func:`~protomolt_jobs.config.kafka_client_settings` do not apply to it). The keys in
        :data:`~protomolt_jobs.config.CONSUMER_OWNED` (``group.id``, ``enable.auto.commit``
        ...) cannot be overridden.
    :raises ConfigError: when no broker or request topic is configured, or an override is
        refused.
    """

    name = "request_consumer"
    #: A pass polls for at most half a second; leaving the group may take a join's time.
    stop_timeout_s = 10.0

    def __init__(
        self,
        store: Any,
        *,
        submitter: Any,
        config: JobsConfig,
        consumer_config: dict[str, Any] | None = None,
    ) -> None:
        if not config.kafka_bootstrap:
            raise ConfigError(
                "jobs.kafka_bootstrap is not set: the request consumer needs a broker"
            )
        topic = config.effective_request_topic
        if not topic:
            raise ConfigError("jobs.request_topic is not set")
        super().__init__(worker_id=config.worker_id)
        self._store = store
        self._submitter = submitter
        self._config = config
        self.topic = topic
        overrides = kafka_client_settings(
            "consumer", consumer_config or {}, broker_bounds=False, with_defaults=False
        )
        self._settings: dict[str, Any] = {
            "client.id": f"protomolt-jobs-{config.worker_id}",
            **config.consumer_settings(),
            **overrides,
            "bootstrap.servers": config.kafka_bootstrap,
            "group.id": CONSUMER_GROUP,
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "error_cb": self._on_client_error,
        }
        self._consumer: Consumer | None = None
        # Held for one pass and while the consumer closes: one user of the client at a time.
        self._pass_lock = threading.RLock()
        #: A record whose write failed on a store error: handled again before the next poll.
        self._held: Message | None = None
        #: A handled record whose offset commit failed transiently: committed before the next.
        self._uncommitted: Message | None = None
        self._backoff_s = 0.0
        #: True between an assignment and the next revocation (a rebalance in flight).
        self._assigned = False
        self._last_client_error: tuple[int, float] | None = None
        #: Test hook: called with (outcome, message) after each record's offset is committed.
        self.on_handled: Callable[[str, Message], None] | None = None

    # -- lifecycle (start/stop/health: protomolt_jobs.service.Service) ----------------------

    def _started_fields(self) -> dict[str, Any]:
        return {
            "topic": self.topic,
            "bootstrap": self._config.kafka_bootstrap,
            "group": CONSUMER_GROUP,
            "session_timeout_ms": self._settings["session.timeout.ms"],
        }

    @property
    def settings(self) -> dict[str, Any]:
        """The librdkafka settings the consumer is built with (callbacks included)."""
        return dict(self._settings)

    def _on_stopped(self) -> None:
        """Leave the group and close the consumer once the loop has ended. Uncommitted
        records are redelivered to the next member (idempotent)."""
        with self._pass_lock:
            consumer, self._consumer = self._consumer, None
            self._held = None
            self._uncommitted = None
            if consumer is not None:
                self._settle_join(consumer)
        if consumer is not None:
            try:
                consumer.close()
            except (KafkaException, RuntimeError) as exc:
                log.warning(
                    "closing the request consumer failed: %s",
                    exc,
                    extra={"action": "request_consumer_close_failed"},
                )

    # -- one pass ----------------------------------------------------------------------------

    def run_once(self, timeout_s: float = 1.0) -> int:
        """Handle at most one record: a held one first, else the next polled one.

        :param timeout_s: how long ``poll`` may wait for a record, seconds.
        :returns: 1 when a record was handled and its offset committed (or the commit is
            queued for retry), else 0 (nothing arrived, a broker error, or a store failure:
            then the record is held for the next pass and a backoff is suggested).
        """
        with self._pass_lock:
            consumer = self._ensure_consumer()
            self._backoff_s = 0.0
            if self._uncommitted is not None and not self._commit(consumer, self._uncommitted):
                return 0
            message = self._held
            self._held = None
            if message is None:
                message = consumer.poll(timeout_s)
                if message is None:
                    return 0
                err = message.error()
                if err is not None:
                    self._on_message_error(err)
                    return 0
            try:
                try:
                    outcome = self._handle(message)
                except StoreError:
                    raise
                except Exception as exc:  # the consume loop must survive
                    # A defect in handling must neither kill the loop nor lose the record
                    # (committing the next offset would skip it): it is stored as a reject.
                    log.exception(
                        "request %s[%d]@%d could not be handled; storing it as a reject",
                        message.topic(),
                        message.partition(),
                        message.offset(),
                        extra={
                            "action": "request_handling_crashed",
                            "topic": message.topic(),
                            "partition": message.partition(),
                            "offset": message.offset(),
                        },
                    )
                    try:
                        outcome = self._reject(
                            message, f"internal-error: {type(exc).__name__}: {exc}"
                        )
                    except StoreError:
                        raise
                    except Exception as reject_exc:  # held as an outage, see below
                        # Not even the reject is stored: hold the record like an outage.
                        raise StoreError(
                            f"storing the reject failed: {type(reject_exc).__name__}: {reject_exc}"
                        ) from reject_exc
            except StoreError as exc:
                self._held = message
                self._backoff_s = BACKOFF_MIN_S
                log.warning(
                    "request %s[%d]@%d not handled, the store failed: %s; retrying the same record",
                    message.topic(),
                    message.partition(),
                    message.offset(),
                    exc,
                    extra={
                        "action": "request_store_failed",
                        "topic": message.topic(),
                        "partition": message.partition(),
                        "offset": message.offset(),
                    },
                )
                return 0
            crashpoints.reached("after_row_commit")
            self._commit(consumer, message)
            if self.on_handled is not None:
                self.on_handled(outcome, message)
            return 1

    # -- internals ---------------------------------------------------------------------------

    def _ensure_consumer(self) -> Consumer:
        if self._consumer is None:
            consumer = Consumer(self._settings)
            self._assigned = False
            consumer.subscribe([self.topic], on_assign=self._on_assign, on_revoke=self._on_revoke)
            self._consumer = consumer
        return self._consumer

    def _settle_join(self, consumer: Consumer) -> None:
        """Before leaving the group, let a join in flight finish (bounded).

        The Tansu broker (tests, LIBRARIES.md section 1) never completes another join of a
        group whose member left in the middle of a join: the whole group, every topic, stays
        without assignments for minutes. Waiting for the assignment costs at most a couple of
        session timeouts; records polled meanwhile are dropped uncommitted (redelivered).
        """
        if self._assigned:
            return
        session_s = int(self._settings["session.timeout.ms"]) / 1000.0
        deadline = time.monotonic() + 2 * session_s + 1.0
        while not self._assigned and time.monotonic() < deadline:
            try:
                consumer.poll(0.1)
            except (KafkaException, RuntimeError):
                return

    def _on_assign(self, _consumer: Consumer, _partitions: list[Any]) -> None:
        self._assigned = True

    def _on_revoke(self, _consumer: Consumer, partitions: list[Any]) -> None:
        self._assigned = False
        # A held or uncommitted record of a partition we no longer own belongs to its new
        # owner now, which reads it again from the committed offset.
        revoked = {(p.topic, p.partition) for p in partitions}
        for attr in ("_held", "_uncommitted"):
            m = getattr(self, attr)
            if m is not None and (m.topic(), m.partition()) in revoked:
                setattr(self, attr, None)

    def _commit(self, consumer: Consumer, message: Message) -> bool:
        try:
            consumer.commit(message=message, asynchronous=False)
        except KafkaException as exc:
            err = exc.args[0] if exc.args else None
            code = err.code() if isinstance(err, KafkaError) else None
            retry = code in _RETRY_COMMIT or (isinstance(err, KafkaError) and err.retriable())
            self._uncommitted = message if retry else None
            if retry:
                self._backoff_s = max(self._backoff_s, BACKOFF_MIN_S)
            log.warning(
                "offset commit of %s[%d]@%d failed: %s (%s)",
                message.topic(),
                message.partition(),
                message.offset(),
                err,
                "will retry" if retry else "the record may be redelivered; it replays idempotently",
                extra={
                    "action": "request_commit_failed",
                    "topic": message.topic(),
                    "partition": message.partition(),
                    "offset": message.offset(),
                    "retry": retry,
                },
            )
            return False
        self._uncommitted = None
        return True

    def _on_message_error(self, err: KafkaError) -> None:
        if err.code() == KafkaError._PARTITION_EOF:
            return
        self._backoff_s = BACKOFF_MIN_S
        self._log_client_error(err, "request_consumer_message_error")

    def _on_client_error(self, err: KafkaError) -> None:
        self._log_client_error(err, "request_consumer_broker_error")

    def _log_client_error(self, err: KafkaError, action: str) -> None:
        # An outage repeats the same error every second; say it once per 30 s.
        now = time.monotonic()
        last = self._last_client_error
        if last is not None and last[0] == err.code() and now - last[1] < 30.0:
            return
        self._last_client_error = (err.code(), now)
        log.warning(
            "request consumer: %s (waiting and retrying)",
            err,
            extra={"action": action, "error_code": err.name(), "topic": self.topic},
        )

    def _reject(self, message: Message, reason: str) -> str:
        self._store.reject_insert(
            message.value(), message.topic(), message.partition(), message.offset(), reason
        )
        log.warning(
            "request %s[%d]@%d rejected: %s",
            message.topic(),
            message.partition(),
            message.offset(),
            reason,
            extra={
                "action": "request_rejected",
                "topic": message.topic(),
                "partition": message.partition(),
                "offset": message.offset(),
                "reason": reason,
            },
        )
        return "rejected"

    def _handle(self, message: Message) -> str:
        """Write the record's one outcome; returns its name. Raises only StoreError."""
        request, problem = decode_request(message.value())
        if request is None:
            return self._reject(message, problem or "undecodable")
        violations = validate_request(request)
        if violations:
            return self._reject(message, f"invalid-request: {_summarize(violations)}")
        try:
            # The verbs' input rule (input_rules), field by field, as submit-workflow names them.
            check_text("jobId", request.job_id)
            check_text("workflowName", request.workflow_name)
        except InvalidInput as exc:
            return self._reject(message, f"invalid-input: {exc.message}")
        try:
            job_uuid = uuid.UUID(request.job_id)
        except ValueError:
            return self._reject(message, f"invalid-job-id: job_id {request.job_id!r} is not a uuid")
        try:
            input_json = json_format.MessageToDict(request.input)
        except (json_format.Error, ValueError, TypeError, RecursionError) as exc:
            # NaN and the infinities have no JSON form (nor a jsonb one).
            return self._reject(message, f"invalid-request: input cannot be read as JSON: {exc}")
        sched, problem = _scheduling_headers(message)
        if problem is not None:
            return self._reject(message, problem)
        try:
            check_json("input", input_json)
        except InvalidInput as exc:
            return self._reject(message, f"invalid-input: {exc.message}")
        try:
            outcome = self._submitter.submit(
                workflow_name=request.workflow_name,
                input=input_json,
                job_id=request.job_id,
                **sched,
                actor=f"kafka:{self.topic}",
            )
        except StoreError:
            raise
        except Exception as exc:  # the partition must not stall
            # A defect in the submission path must not stall the partition behind this record.
            log.exception(
                "submitting request job %s failed unexpectedly",
                request.job_id,
                extra={"action": "request_submit_crashed", "job_id": request.job_id},
            )
            return self._reject(message, f"internal-error: {type(exc).__name__}: {exc}")
        if outcome.ok:
            log.info(
                "request job %s %s (%s)",
                outcome.job_id,
                "submitted" if outcome.created else "already exists",
                request.workflow_name,
                extra={
                    "action": "request_submitted" if outcome.created else "request_duplicate",
                    "job_id": outcome.job_id,
                    "workflow_name": request.workflow_name,
                },
            )
            return "submitted" if outcome.created else "duplicate"
        reason = outcome.reason or "refused"
        if reason in FAIL_AT_BIRTH_REASONS:
            return self._fail_at_birth(job_uuid, request.workflow_name, input_json, outcome.error)
        detail = outcome.error or "the submitter refused the request"
        if outcome.failed_step:
            detail = f"step {outcome.failed_step}: {detail}"
        return self._reject(message, f"{reason}: {detail}")

    def _fail_at_birth(
        self, job_id: uuid.UUID, workflow_name: str, input_json: dict[str, Any], error: str
    ) -> str:
        error = error or f"workflow {workflow_name!r} cannot be run"
        inserted = self._store.job_insert(
            NewJob(
                job_id=job_id,
                workflow_name=workflow_name,
                workflow_definition={},
                input=input_json,
                max_attempts=self._config.max_attempts,
                status="FAILED",
                error=error,
                actor=f"kafka:{self.topic}",
            )
        )
        log.warning(
            "workflow run %s FAILED at birth: %s",
            job_id,
            error,
            extra={
                "action": "request_failed_at_birth",
                "job_id": str(job_id),
                "workflow_name": workflow_name,
                "row_created": inserted.created,
            },
        )
        return "failed_at_birth"

    def _run(self, stop: threading.Event) -> None:
        backoff = 0.0
        while not stop.is_set():
            self._checkpoint()
            self.run_once(0.5)
            wanted = self._backoff_s
            if wanted:
                backoff = min(BACKOFF_MAX_S, max(wanted, backoff * 2))
                if self._sleep(backoff):
                    return
            else:
                backoff = 0.0
                self._progressed()


#: Record headers that carry a submission's scheduling fields (the request proto has no fields
#: for them, and adding some could clash with upstream's numbering): header -> keyword.
SCHEDULING_HEADERS = {
    "priority": "priority",
    "queue": "queue",
    "fairnessKey": "fairness_key",
    "dedupKey": "dedup_key",
}


def _scheduling_headers(message: Any) -> tuple[dict[str, Any], str | None]:
    """The scheduling keywords from the record's headers (UTF-8 values), or a reject reason
    ``invalid-input: header '<name>' ...`` naming the header."""
    out: dict[str, Any] = {}
    try:
        headers = message.headers() or []
    except (AttributeError, TypeError):
        headers = []
    for name, raw in headers:
        keyword = SCHEDULING_HEADERS.get(name)
        if keyword is None:
            continue
        try:
            text = raw.decode("utf-8") if isinstance(raw, (bytes, bytearray)) else raw
            if keyword == "priority":
                out[keyword] = scheduling.parse_priority(name, text)
            else:
                out[keyword] = scheduling.parse_name(name, text)
        except UnicodeDecodeError:
            return {}, f"invalid-input: header '{name}' is not UTF-8"
        except scheduling.FieldError as exc:
            return {}, f"invalid-input: header {exc.message}"
    return out, None
