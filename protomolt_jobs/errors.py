"""The one errors module: the package's exception root, action errors with stable codes, and
the internal store signals.

The tree (every exception class of the package; engine errors keep ``ValueError`` as a second
base where callers catch that)::

    ProtomoltJobsError
    +-- ActionError                      a verb cannot answer (code table below)
    |   +-- InvalidInput, UnknownAction, PermissionDenied, ResourceExhausted,
    |   |   JobCorrupt, InternalError
    |   +-- Unavailable
    |       +-- StoreUnavailable         (also a StoreError)
    +-- StoreError                       store/: a database operation failed (internal)
    |   +-- StoreUnavailable
    |   +-- NotFound
    |   +-- LeaseLost                    a fenced write matched no row
    |   +-- MigrationError               store/migrate.py
    +-- ConfigError (ValueError)         config.py: a [jobs] key is malformed
    +-- FieldError (ValueError)          runs/scheduling.py: a scheduling/budget field is malformed
    +-- RegistryError (RuntimeError)     kafka/framing.py: the Schema Registry refused or failed
    +-- PermitCancelled                  worker/permits.py: a permit wait ended by a stop
    +-- BudgetExceeded                   worker/budget.py: a run spent its budget
    +-- RowError                         worker/claimed_run.py: a claimed row cannot be run
    +-- SnapshotError                    runs/stored_run.py: a stored definition cannot be used
    +-- WorkflowParseError (ValueError)  workflow/types.py: the envelope does not parse
    +-- WorkflowExecutionError           workflow/types.py: a step failed (kind, step, code)
    +-- MappingError (ValueError)        workflow/mapping.py
    +-- CelCompileError (ValueError)     workflow/celenv.py
    +-- CelError (ValueError)            workflow/cel.py
    +-- Unrepresentable                  workflow/celenv.py: the fast CEL path cannot answer
    +-- RuleError (ValueError)           workflow/validation.py
    +-- LoopRetryError (ValueError)      workflow/retry_scope.py: a retry a loop cannot keep apart
    +-- host/: UsageError, ActionFailed, NodeUnreachable (cli.py), DocumentRefused (parse.py),
        BodyFieldError (http_route.py), CorruptWorkflow (registry.py),
        EmbeddedPostgresError (embedded_pg.py)

Outside the root on purpose: ``hooks.ComposerError`` (the host contract imports nothing of
ours, so any host can implement it) and ``service.InjectedFailure`` (a test hook that must look
like any defect).

Action errors are what a verb raises when it cannot answer. Each class carries one ``code``
from the table in DESIGN.md section 4; every surface maps the code the same way:

=================== ================== ======
code                gRPC               HTTP
=================== ================== ======
invalid-input       INVALID_ARGUMENT   400
unknown-action      UNIMPLEMENTED      404
permission-denied   PERMISSION_DENIED  403
resource-exhausted  RESOURCE_EXHAUSTED 429
unavailable         UNAVAILABLE        503
job-corrupt         DATA_LOSS          500
internal-error      INTERNAL           500
=================== ================== ======

Results with ``ok: false`` (not found, wrong state, does not verify) are answers, not errors,
and are returned, never raised.

:class:`LeaseLost` and :class:`StoreError` are internal: they never leave a verb, except
:class:`StoreUnavailable`, which is an :class:`Unavailable` too.
"""

from __future__ import annotations

from typing import Any, ClassVar

__all__ = [
    "ERROR_CLASSES",
    "ActionError",
    "ControlApplied",
    "InternalError",
    "InvalidInput",
    "JobCorrupt",
    "LeaseLost",
    "NotFound",
    "PermissionDenied",
    "ProtomoltJobsError",
    "ResourceExhausted",
    "StoreError",
    "StoreUnavailable",
    "Unavailable",
    "UnknownAction",
    "error_for_code",
]


class ProtomoltJobsError(Exception):
    """Root of every exception this package defines (see the tree in the module docstring).

    ``except ProtomoltJobsError`` catches our errors and nothing of the libraries'."""


class ActionError(ProtomoltJobsError):
    """Base of every error a verb may raise: a stable kebab-case ``code``, a message, details.

    The JSON form every surface emits is ``{"error": code, "message": message, "details"?: {...}}``.
    """

    code: ClassVar[str] = "internal-error"
    #: gRPC status code name (``grpc.StatusCode`` member name) for this error.
    grpc_status: ClassVar[str] = "INTERNAL"
    #: HTTP status for this error on the actions route.
    http_status: ClassVar[int] = 500

    def __init__(self, message: str, details: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.details = dict(details) if details else None

    def to_json(self) -> dict[str, Any]:
        """The error envelope: ``{"error": code, "message": str, "details"?: object}``."""
        body: dict[str, Any] = {"error": self.code, "message": self.message}
        if self.details:
            body["details"] = self.details
        return body

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.message!r})"


class InvalidInput(ActionError):
    """Raised when a verb's input is malformed; the message names the offending field."""

    code = "invalid-input"
    grpc_status = "INVALID_ARGUMENT"
    http_status = 400


class UnknownAction(ActionError):
    """Raised by the catalog for a verb it does not hold; details list the available ones."""

    code = "unknown-action"
    grpc_status = "UNIMPLEMENTED"
    http_status = 404


class PermissionDenied(ActionError):
    """Raised when the caller lacks the verb's scope."""

    code = "permission-denied"
    grpc_status = "PERMISSION_DENIED"
    http_status = 403


class ResourceExhausted(ActionError):
    """Raised when a budget (rate or payload size) refuses the call."""

    code = "resource-exhausted"
    grpc_status = "RESOURCE_EXHAUSTED"
    http_status = 429


class Unavailable(ActionError):
    """Raised when the verb's backing service is not configured or not reachable."""

    code = "unavailable"
    grpc_status = "UNAVAILABLE"
    http_status = 503


class JobCorrupt(ActionError):
    """Raised when a stored job row cannot be read back (unparseable snapshot or checkpoints)."""

    code = "job-corrupt"
    grpc_status = "DATA_LOSS"
    http_status = 500


class InternalError(ActionError):
    """Raised for a defect: anything a verb did not expect. Surfaces never leak a traceback."""

    code = "internal-error"
    grpc_status = "INTERNAL"
    http_status = 500


#: Every action error class by its code.
ERROR_CLASSES: dict[str, type[ActionError]] = {
    cls.code: cls
    for cls in (
        InvalidInput,
        UnknownAction,
        PermissionDenied,
        ResourceExhausted,
        Unavailable,
        JobCorrupt,
        InternalError,
    )
}


def error_for_code(code: str, message: str, details: dict[str, Any] | None = None) -> ActionError:
    """Build the action error of ``code`` (an unknown code becomes ``internal-error``)."""
    return ERROR_CLASSES.get(code, InternalError)(message, details)


class StoreError(ProtomoltJobsError):
    """A store operation failed (connection lost, statement error). The driver's exception is
    the ``__cause__``. Raised by ``protomolt_jobs.store``; nothing above ``store/`` imports
    psycopg's error classes."""


class StoreUnavailable(StoreError, Unavailable):
    """The store could not get a healthy database connection within its bound
    (``jobs.connect_timeout_seconds``), or the connection broke during the call: the database
    is down, unreachable, refusing connections, or every pooled connection stayed busy.

    It is both a :class:`StoreError` (background duties treat it as an outage and retry) and
    an :class:`Unavailable` (a verb that meets it answers ``unavailable``, 503 / UNAVAILABLE,
    with no translation on the way).
    """


class NotFound(StoreError):
    """The job the operation names does not exist."""


class LeaseLost(StoreError):
    """A fenced write matched no row: the job is no longer ``RUNNING`` under this worker's
    ``(lease_owner, attempt)``. The worker abandons the run and writes nothing more."""

    def __init__(self, job_id: object, owner: str, attempt: int, operation: str) -> None:
        super().__init__(
            f"lease lost on job {job_id} (owner {owner!r}, attempt {attempt}) during {operation}"
        )
        self.job_id = job_id
        self.owner = owner
        self.attempt = attempt
        self.operation = operation


class ControlApplied(LeaseLost):
    """A fenced checkpoint (or stop) write committed and, in the same statement, honoured an
    operator's pending request: the job is now ``status`` (CANCELLED or PAUSED) and no longer
    leased. The worker stops like on a lost lease (nothing more to write), but its last write
    did commit."""

    def __init__(self, job_id: object, owner: str, attempt: int, operation: str, status: str):
        super().__init__(job_id, owner, attempt, operation)
        self.args = (f"job {job_id} is {status} by operator request (applied at {operation})",)
        self.status = status
