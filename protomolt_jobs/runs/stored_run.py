"""One loader for a stored run's definition: every door that reads a job's snapshotted workflow
(the worker's claim path, the verbs, the report, the inspector) reads it here.

A job row snapshots the definition it was submitted with (``workflow_definition``, a JSON object
in a ``jsonb`` column). :meth:`StoredRun.load` turns it into the parsed workflow, or raises one
exception, :class:`SnapshotError`, whose ``kind`` says what was wrong:

================ ===========================================================================
kind             the stored definition ...
================ ===========================================================================
``unreadable``   is JSON text that does not decode (a ``jsonb`` string holding broken JSON)
``not-object``   is not a JSON object (None when the store could not read the column, a list,
                 a number, ...); ``found`` names the Python type
``parse``        does not parse (``WorkflowParseError``, or nesting deep enough for a
                 ``RecursionError``); ``step`` names the step when the engine did
``verify``       parses but the verifier has findings (only with ``verify=True``); ``step`` is
                 the first finding's step
================ ===========================================================================

Each caller maps the error explicitly, because each door answers differently: the worker fails
the run (``WORKFLOW: ...``), a verb that must act on the definition answers ``job-corrupt``, a
read that only adds extras to an answer leaves them out.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from protomolt_jobs.errors import ProtomoltJobsError
from protomolt_jobs.store.records import is_shared_definition
from protomolt_jobs.workflow.envelope import WORKFLOW_CACHE_SIZE, parse_workflow
from protomolt_jobs.workflow.graph import ancestors
from protomolt_jobs.workflow.types import CompiledWorkflow, Runtime, WorkflowParseError
from protomolt_jobs.workflow.verifier import verify

__all__ = ["SnapshotError", "StoredRun"]


class SnapshotError(ProtomoltJobsError):
    """A job's stored definition cannot be used.

    :ivar kind: ``unreadable``, ``not-object``, ``parse`` or ``verify`` (module docstring).
    :ivar step: the step the problem is about, ``""`` when none.
    :ivar detail: the problem in words, without a kind prefix (the engine's own message for
        ``parse``; ``"(n finding[s]); [kind] step: error ..."`` for ``verify``).
    :ivar found: for ``not-object``, the Python type name of what the column held.
    """

    def __init__(self, kind: str, detail: str, *, step: str = "", found: str = "") -> None:
        super().__init__(detail)
        self.kind = kind
        self.step = step
        self.detail = detail
        self.found = found


@dataclass(frozen=True)
class StoredRun:
    """A job's snapshotted definition, decoded and parsed.

    :ivar definition: the stored JSON object.
    :ivar workflow: the parsed workflow (``workflow.graph`` tells a graph run from a sequential
        one).
    """

    definition: dict[str, Any]
    workflow: CompiledWorkflow

    @classmethod
    def load(cls, job: Any, runtime: Runtime, *, verified: bool = False) -> StoredRun:
        """Decode and parse ``job.workflow_definition`` against ``runtime``'s type pool.

        :param job: anything with a ``workflow_definition`` attribute (a ``JobRecord``).
        :param runtime: the engine's runtime (type pool, channels).
        :param verified: also run the verifier; findings raise ``SnapshotError("verify")``.
        :raises SnapshotError: the definition is unreadable, not an object, does not parse, or
            (with ``verified``) does not verify.
        """
        definition = decode_definition(getattr(job, "workflow_definition", None))
        try:
            workflow = _parsed(definition, runtime)
        except WorkflowParseError as exc:
            step = getattr(exc, "step", "") or ""
            raise SnapshotError("parse", _message(exc), step=step) from exc
        except RecursionError as exc:
            raise SnapshotError("parse", "the definition is nested too deeply") from exc
        if verified:
            findings = verify(workflow)
            if findings:
                n = len(findings)
                listed = "".join(f"; [{f.kind}] {f.step}: {f.error}" for f in findings)
                noun = "finding" if n == 1 else "findings"
                raise SnapshotError("verify", f"({n} {noun}){listed}", step=findings[0].step or "")
        return cls(definition, workflow)

    def step_names(self) -> list[str]:
        """The workflow's step names in definition order (compensation steps included)."""
        return [s.name for s in self.workflow.steps]

    def dependants(self) -> dict[str, set[str]]:
        """For each step, the steps that depend on it, transitively: in a graph workflow the
        steps it is an ancestor of; in a sequential one every later step (each step reads what
        the earlier ones produced). Dropping a step's checkpoint must drop theirs too."""
        order = self.step_names()
        out: dict[str, set[str]] = {name: set() for name in order}
        if not self.workflow.graph:
            for i, name in enumerate(order):
                out[name] = set(order[i + 1 :])
            return out
        for name, before in ancestors(self.workflow).items():
            for upstream in before:
                out.setdefault(upstream, set()).add(name)
        return out


def _parsed(definition: dict[str, Any], runtime: Runtime) -> CompiledWorkflow:
    """``parse_workflow(definition, runtime)``; for a definition the store shares between
    claims (read-only, :func:`~protomolt_jobs.store.records.is_shared_definition`) the result
    is kept on ``runtime`` by the object's identity, which skips ``parse_workflow``'s key (the
    canonical text of the definition's steps, ~13 us for the realistic workload's)."""
    if not is_shared_definition(definition):
        return parse_workflow(definition, runtime)
    key = (_SHARED, id(definition))
    cache = runtime.cache
    hit = cache.get(key)
    if hit is not None and hit[0] is definition:  # holding it keeps its id its own
        return hit[1]
    workflow = parse_workflow(definition, runtime)
    if len(cache) >= WORKFLOW_CACHE_SIZE:
        try:  # as parse_workflow bounds it: the oldest entry goes
            cache.pop(next(iter(cache)))
        except (StopIteration, KeyError, RuntimeError):
            pass
    cache[key] = (definition, workflow)
    return workflow


#: The first item of :func:`_parsed`'s keys on ``Runtime.cache`` (canonical texts are strings
#: or 3-tuples starting with ``"descriptorSetBase64"``: never this).
_SHARED = object()


def decode_definition(raw: Any) -> dict[str, Any]:
    """The stored definition as a JSON object (JSON text is decoded first).

    :raises SnapshotError: ``unreadable`` (text that is not JSON) or ``not-object``.
    """
    if isinstance(raw, (str, bytes, bytearray)):
        try:
            raw = json.loads(raw)
        except (ValueError, RecursionError) as exc:  # broken, or nested past the decoder
            raise SnapshotError("unreadable", str(exc) or type(exc).__name__) from exc
    if not isinstance(raw, dict):
        raise SnapshotError(
            "not-object", "the stored definition is not a JSON object", found=type(raw).__name__
        )
    return raw


def _message(exc: BaseException) -> str:
    return str(getattr(exc, "message", None) or exc)
