"""The ``registry`` role: named workflow definitions in files, and their HTTP endpoints.

Storage: one file per workflow, ``<data_dir>/workflows/<name>.json``, holding the definition
(the JSON envelope ``run-workflow`` accepts). Names match :data:`NAME_PATTERN` (lower case,
so names mean the same on case-insensitive file systems). A write goes to a temporary file
that replaces the old one, so a reader never sees half a definition.

The role requires nothing. At wire it contributes:

- a :class:`~protomolt_jobs.hooks.contract.WorkflowRepository` (:class:`WorkflowStore`). A stored
  file that is not JSON, or not a JSON object, raises :class:`CorruptWorkflow`: it is never
  "not found", so a submit by that name fails loudly instead of quietly.
- :class:`~protomolt_jobs.host.http_route.HttpRoute` values for the actions route; a caller
  without the route's scope gets 403 ``permission-denied`` naming it (docs/configuration.md,
  ``[node.scopes]``):

  - ``GET /protomolt/workflows`` (scope ``schema-read``): the sorted names (JSON array).
  - ``GET /protomolt/workflows/{name}`` (scope ``schema-read``): the stored JSON verbatim,
    with the header ``ProtoMolt-Retention`` when it has a ``retention`` key (the effective
    retention of its runs per final status, JSON, from ``check-workflow``; without the key, or
    without a jobs role, no header: the node-wide ``jobs.run_retention_seconds``), and the
    headers ``ProtoMolt-Version`` (the stored version's number) and ``ProtoMolt-Last-Test``
    (its last test result, compact JSON) when it has a version record; 404 ``not-found``
    when absent; 500 ``workflow-corrupt`` when the file does not read as a JSON object.
  - ``PUT /protomolt/workflows/{name}`` (scope ``workflow-write``): the name must match
    :data:`NAME_PATTERN` and the body must be a JSON object (else **422** ``invalid-input``,
    also for a body nested too deep or holding a lone surrogate escape). The definition is
    verified first with the catalog's ``check-workflow`` (run in-process, whatever the caller's
    other scopes); one that does not verify is refused with **422**
    ``{"error": "does-not-verify", "message", "findings": [{step, kind, error}]}`` and nothing
    is stored. Without ``check-workflow`` in the catalog (no jobs role mounted) the PUT is
    refused with 503 ``unavailable``, never stored unchecked. Then its ``tests`` run
    (``test-workflow``, in-process): with the node's ``jobs.require_workflow_tests`` (the
    jobs role's :class:`~protomolt_jobs.hooks.contract.WorkflowActivation`) a failing case,
    or no tests, is refused with **422** ``{"error": "tests-failed", "message" (the first
    failing case and its first difference), "tests"}`` and nothing is stored. Success: 200
    ``{"name", "version", "tests"}``; the result is recorded as the new version's
    ``lastTest`` (``workflow_versions.py``: files beside the definitions).

Errors carry upstream's registry codes too (the Java ProtoMolt serves these routes on its
schema registry, Confluent style): ``error_code`` 40401 (no such workflow), 42201 (a bad
name or body), 42202 (does not verify), 50001 (a stored file that cannot be read), beside
this project's ``error`` and ``message``. The 503 has no upstream counterpart (upstream
stores the workflow unchecked when no action catalog is mounted), nor has 42203
(``tests-failed``, ours: upstream has no tests in a definition).
"""

from __future__ import annotations

import json
import logging
import re
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from protomolt_jobs.errors import ActionError, ProtomoltJobsError, UnknownAction
from protomolt_jobs.hooks.contract import (
    InertMount,
    Mount,
    WireContext,
    WorkflowActivation,
    WorkflowRepository,
)
from protomolt_jobs.hooks.hookspecs import hookimpl
from protomolt_jobs.host.catalog import Caller
from protomolt_jobs.host.http_route import (
    BodyFieldError,
    HttpRequest,
    HttpResponse,
    HttpRoute,
    error_response,
)
from protomolt_jobs.host.workflow_versions import Versions, summary_of_tests, write_atomically

__all__ = [
    "NAME_PATTERN",
    "CorruptWorkflow",
    "RegistryModule",
    "WorkflowStore",
    "protomolt_role_module",
    "workflow_routes",
]

log = logging.getLogger("protomolt_jobs.registry")

#: The scope the registry's reads need (``GET /protomolt/workflows[/{name}]``).
READ_SCOPE = "schema-read"
#: The scope storing a workflow needs (``PUT /protomolt/workflows/{name}``).
WRITE_SCOPE = "workflow-write"

#: Upstream's (Confluent-style) ``error_code`` of each refusal of these routes.
ERROR_CODES = {
    "not-found": 40401,
    "invalid-input": 42201,
    "does-not-verify": 42202,
    "tests-failed": 42203,
    "workflow-corrupt": 50001,
}

#: What a stored workflow's name looks like.
NAME_PATTERN = re.compile(r"[a-z0-9][a-z0-9._-]{0,199}")


def _is_name(name: Any) -> bool:
    # fullmatch: ``$`` would accept a trailing newline ("nl\n" -> a file "nl\n.json").
    return isinstance(name, str) and NAME_PATTERN.fullmatch(name) is not None


class CorruptWorkflow(ProtomoltJobsError, RuntimeError):
    """A stored workflow file exists but does not read as a JSON object. Raised by
    :meth:`WorkflowStore.workflow`; the message names the workflow and the file."""

    def __init__(self, name: str, path: Path, reason: str) -> None:
        super().__init__(f"Stored workflow '{name}' {reason} ({path})")
        self.name = name
        self.path = path


def _check_name(name: Any) -> str:
    if not _is_name(name):
        raise ValueError(
            f"workflow names match {NAME_PATTERN.pattern} (lower case letters, digits, '.', "
            f"'_', '-'; at most 200 characters); got {name!r}"
        )
    return name


class WorkflowStore:
    """Workflow definitions as ``<directory>/<name>.json`` files (a WorkflowRepository).

    :param directory: where the files live; created when missing.
    """

    def __init__(self, directory: Path) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self._lock = threading.RLock()
        self.versions = Versions(self.directory)

    def path_of(self, name: str) -> Path:
        """The file of workflow ``name``.

        :raises ValueError: ``name`` does not match :data:`NAME_PATTERN`.
        """
        return self.directory / f"{_check_name(name)}.json"

    def read_text(self, name: str) -> str | None:
        """The stored text of ``name`` verbatim, or None when absent or not a valid name.

        :raises CorruptWorkflow: the file exists but cannot be read.
        """
        if not _is_name(name):
            return None
        path = self.path_of(name)
        try:
            return path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return None
        except (OSError, UnicodeDecodeError) as exc:
            raise CorruptWorkflow(name, path, f"cannot be read: {exc}") from exc

    def workflow(self, name: str) -> dict[str, Any] | None:
        """The definition stored as ``name``; None when there is none.

        :raises CorruptWorkflow: the stored file is not JSON or not a JSON object.
        """
        text = self.read_text(name)
        if text is None:
            return None
        return self._parse(name, text)

    def _parse(self, name: str, text: str) -> dict[str, Any]:
        """``text`` (the stored file of ``name``) as a JSON object.

        :raises CorruptWorkflow: not JSON, or not an object.
        """
        path = self.path_of(name)
        try:
            value = json.loads(text)
        except ValueError as exc:  # JSONDecodeError, and an integer over Python's digit limit
            raise CorruptWorkflow(name, path, f"is not valid JSON: {exc}") from exc
        except RecursionError as exc:
            raise CorruptWorkflow(
                name, path, "is nested deeper than the JSON parser allows"
            ) from exc
        if not isinstance(value, dict):
            raise CorruptWorkflow(name, path, "is not a JSON object")
        return value

    def names(self) -> list[str]:
        """Every stored name, sorted."""
        return sorted(
            p.stem for p in self.directory.glob("*.json") if p.is_file() and _is_name(p.stem)
        )

    def remove(self, name: str) -> bool:
        """Delete the stored workflow ``name``; jobs already submitted keep their snapshot.

        :returns: True when a file was removed, False when none was stored.
        :raises ValueError: a bad name.
        """
        path = self.path_of(name)
        with self._lock:
            try:
                path.unlink()
            except FileNotFoundError:
                return False
        log.info(
            "removed workflow %s",
            name,
            extra={"action": "workflow_removed", "workflow_name": name},
        )
        return True

    def put(
        self,
        name: str,
        definition: dict[str, Any],
        *,
        by: str = "operator",
        test: dict[str, Any] | None = None,
    ) -> int:
        """Store (replace) ``definition`` as ``name``, atomically, as its next version.

        :param by: the principal storing it (the version's ``storedBy``).
        :param test: the version's test result (``workflow_versions.summary_of_tests``), or None.
        :returns: the new version's number (1 for the first).
        :raises ValueError: a bad name.
        :raises TypeError: a definition that is not a JSON object.
        """
        path = self.path_of(name)
        if not isinstance(definition, dict):
            raise TypeError(f"workflow '{name}' must be a JSON object")
        text = json.dumps(definition, indent=2, ensure_ascii=False) + "\n"
        with self._lock:
            # the version's record first: a crash before the replace leaves the old one current
            version = self.versions.add(name, text, by=by, test=test)
            write_atomically(self.directory, path.name, text)
        log.info(
            "stored workflow %s version %d",
            name,
            version,
            extra={
                "action": "workflow_stored",
                "workflow_name": name,
                "version": version,
                "principal": by,
            },
        )
        return version

    def stored(self, name: str, version: int | None = None) -> dict[str, Any] | None:
        """``{"name", "version", "definition", "storedAt", "storedBy", "lastTest",
        "latestVersion"}`` of ``version`` (None: the current one); None when there is no such
        workflow or version (``WorkflowVersions``).

        :raises CorruptWorkflow: the current file cannot be read as a JSON object.
        """
        with self._lock:
            text = self.read_text(name)  # one read of the current file, under the lock
            current = self._parse(name, text) if text is not None else None
            numbers = self.versions.numbers(name) if _is_name(name) else []
            now = self.versions.current(name, text) if text is not None else None
            if version is None:
                if current is None:
                    return None
                number, definition = now, current
            else:
                if version not in numbers:
                    return None
                number = version
                old = self.versions.definition_text(name, version)
                if old is None:
                    return None
                try:
                    definition = json.loads(old)
                except ValueError:
                    return None
            record = self.versions.record(name, number) if number is not None else None
        record = record or {}
        return {
            "name": name,
            "version": number,
            "latestVersion": numbers[-1] if numbers else None,
            "current": number is not None and number == now,
            "definition": definition,
            "storedAt": record.get("storedAt"),
            "storedBy": record.get("storedBy"),
            "lastTest": record.get("lastTest"),
        }

    def record_test(
        self, name: str, version: int, answer: dict[str, Any], *, by: str, via: str
    ) -> bool:
        """Replace version ``version``'s ``lastTest`` with the summary of ``answer`` (a
        ``test-workflow`` answer) run by ``by`` through ``via``; False when it is not
        recorded."""
        if not _is_name(name):
            return False
        with self._lock:
            return self.versions.set_test(name, version, summary_of_tests(answer, by=by, via=via))


def _summary(name: str, findings: list[dict[str, Any]]) -> str:
    n = len(findings)
    first = findings[0] if findings else {}
    where = f" (step '{first.get('step')}')" if first.get("step") else ""
    return (
        f"Workflow '{name}' does not verify ({n} finding{'s' if n != 1 else ''}); first: "
        f"[{first.get('kind', '?')}] {first.get('error', '')}{where}"
    )


def _refusal(status: int, code: str, message: str, **extra: Any) -> HttpResponse:
    """An error answer with this project's ``error`` and upstream's ``error_code``."""
    return error_response(status, code, message, error_code=ERROR_CODES[code], **extra)


#: The GET answer's header holding the stored workflow's effective retention.
RETENTION_HEADER = "ProtoMolt-Retention"
#: The GET answer's header holding the stored version's number.
VERSION_HEADER = "ProtoMolt-Version"
#: The GET answer's header holding the stored version's last test result (compact JSON).
LAST_TEST_HEADER = "ProtoMolt-Last-Test"


#: The longest ``ProtoMolt-Last-Test`` value; a longer result is sent without its cases.
LAST_TEST_HEADER_MAX = 4096


def _last_test_header(tested: dict[str, Any]) -> str:
    """The compact JSON of a version's last test result; past :data:`LAST_TEST_HEADER_MAX`
    characters (many cases, long differences) without ``cases`` and with ``"truncated":
    true`` (get-workflow has them all), so no proxy or client refuses the header."""
    compact = json.dumps(tested, separators=(",", ":"), sort_keys=True)
    if len(compact) <= LAST_TEST_HEADER_MAX:
        return compact
    short = {k: v for k, v in tested.items() if k not in ("cases", "error")}
    return json.dumps({**short, "truncated": True}, separators=(",", ":"), sort_keys=True)


def _principal(request: HttpRequest) -> str:
    return request.caller.name if isinstance(request.caller, Caller) else "operator"


def _run_tests(request: HttpRequest, definition: dict[str, Any], by: str) -> dict[str, Any]:
    """The definition's tests run by the catalog's ``test-workflow`` (in-process), as a
    version's ``lastTest``; a refusal or a failure of the verb is a result with ``error``."""
    try:
        answer = request.catalog.execute("test-workflow", {"workflow": definition})
    except UnknownAction:
        answer = {"ok": False, "error": "test-workflow is not mounted on this node"}
    except ActionError as exc:
        answer = {"ok": False, "error": f"{exc.code}: {exc}"}
    return summary_of_tests(answer, by=by, via="put")


def _gate_refusal(name: str, result: dict[str, Any]) -> HttpResponse:
    """422 ``tests-failed``: the first failing case named with its first difference, or why
    no case ran (no tests)."""
    failing = [c for c in result.get("cases", []) if not c.get("passed")]
    if failing:
        first = failing[0]
        where = f" (step '{first['step']}')" if first.get("step") else ""
        message = (
            f"Workflow '{name}' is refused: jobs.require_workflow_tests is on and test case "
            f"'{first['name']}' fails{where}: {first.get('difference', '')}"
            + (
                f" ({len(failing)} of {len(result['cases'])} cases fail)"
                if len(failing) > 1
                else ""
            )
        )
    elif not result.get("cases"):
        message = (
            f"Workflow '{name}' is refused: jobs.require_workflow_tests is on and it has no "
            "tests; add 'tests' cases to the definition (docs/workflows.md, Tests in the "
            "definition)"
        )
    else:
        message = (
            f"Workflow '{name}' is refused: jobs.require_workflow_tests is on and its tests "
            f"did not run: {result.get('error', '')}"
        )
    log.info(
        "refused workflow %s: its tests fail",
        name,
        extra={"action": "workflow_refused_tests", "workflow_name": name},
    )
    return _refusal(422, "tests-failed", message, tests=result)


def _retention_header(request: HttpRequest, name: str) -> tuple[tuple[str, str], ...]:
    """``ProtoMolt-Retention: <JSON>``: the effective retention of the stored workflow's
    runs per final status, as ``check-workflow`` answers it (run in-process; its parse and
    verification are cached per definition). None for a workflow without a ``retention`` key
    (its runs keep the node-wide setting) or when no jobs role is mounted."""
    try:
        definition = request.catalog.execute("check-workflow", {"workflowName": name})
    except ProtomoltJobsError:  # no jobs role mounted (UnknownAction), or its refusal
        return ()
    kept = definition.get("retention") if isinstance(definition, dict) else None
    if not isinstance(kept, dict):
        return ()
    return ((RETENTION_HEADER, json.dumps(kept, separators=(",", ":"), sort_keys=True)),)


def workflow_routes(
    store: WorkflowStore,
    activation: Callable[[], WorkflowActivation | None] = lambda: None,
) -> list[HttpRoute]:
    """The registry's routes over ``store`` (see the module docstring).

    :param activation: the node's activation gate, read at each ``PUT`` (None: no gate).
    """

    def list_names(request: HttpRequest) -> HttpResponse:
        return HttpResponse(200, store.names())

    def get_one(request: HttpRequest) -> HttpResponse:
        name = request.params["name"]
        try:
            text = store.read_text(name)
            # refuse to serve a corrupt file as if it were fine
            stored = store.workflow(name) if text is not None else None
            version = store.stored(name) if stored is not None else None
        except CorruptWorkflow as exc:
            return _refusal(500, "workflow-corrupt", str(exc))
        if text is None:
            return _refusal(404, "not-found", f"Workflow not found: {name}")
        headers = list(_retention_header(request, name) if stored and "retention" in stored else ())
        if version is not None and version["version"] is not None:
            headers.append((VERSION_HEADER, str(version["version"])))
            tested = version.get("lastTest")
            if tested is not None:
                headers.append((LAST_TEST_HEADER, _last_test_header(tested)))
        return HttpResponse(200, text.encode("utf-8"), headers=tuple(headers))

    def put_one(request: HttpRequest) -> HttpResponse:
        name = request.params["name"]
        try:
            _check_name(name)
        except ValueError as exc:
            # The name is the path segment: the field a client fixes.
            return _refusal(422, "invalid-input", str(exc), details={"field": "name"})
        try:
            definition = request.json_object()
        except BodyFieldError as exc:
            return _refusal(
                422,
                "invalid-input",
                f"The workflow definition is refused: {exc}",
                details={"field": exc.field},
            )
        except ValueError as exc:
            return _refusal(
                422,
                "invalid-input",
                f"The body must be a workflow definition (a JSON object): {exc}",
            )
        try:
            verdict = request.catalog.execute("check-workflow", {"workflow": definition})
        except UnknownAction:
            return error_response(
                503,
                "unavailable",
                "check-workflow is not mounted on this node (mount the jobs role); "
                "a workflow is stored only once it verifies",
            )
        if not verdict.get("ok"):
            findings = list(verdict.get("findings") or [])
            log.info(
                "refused workflow %s: %d findings",
                name,
                len(findings),
                extra={"action": "workflow_refused", "workflow_name": name},
            )
            return _refusal(422, "does-not-verify", _summary(name, findings), findings=findings)
        by = _principal(request)
        tested = _run_tests(request, definition, by)
        gate = activation()
        if gate is not None and gate.require_tests and not tested["ok"]:
            return _gate_refusal(name, tested)
        version = store.put(name, definition, by=by, test=tested)
        return HttpResponse(200, {"name": name, "version": version, "tests": tested})

    one = r"/protomolt/workflows/(?P<name>[^/]+)"
    return [
        HttpRoute(frozenset({"GET"}), r"/protomolt/workflows/?", list_names, READ_SCOPE),
        HttpRoute(frozenset({"GET"}), one, get_one, READ_SCOPE),
        HttpRoute(frozenset({"PUT"}), one, put_one, WRITE_SCOPE),
    ]


class RegistryModule:
    """The registry role: requires nothing; contributes the store and its routes at wire."""

    role = "registry"
    requires: frozenset[str] = frozenset()

    def wire(self, ctx: WireContext) -> Mount:
        """Open ``<data_dir>/workflows`` and contribute the repository and the routes."""
        store = WorkflowStore(Path(ctx.data_dir) / "workflows")
        ctx.contributions.contribute(WorkflowRepository, store)
        contributions = ctx.contributions

        def activation() -> WorkflowActivation | None:
            # the jobs role wires after this one: read at PUT time
            return contributions.first(WorkflowActivation)

        for route in workflow_routes(store, activation):
            ctx.contributions.contribute(HttpRoute, route)
        log.info(
            "registry wired at %s",
            store.directory,
            extra={"action": "registry_wired", "directory": str(store.directory)},
        )
        return InertMount()


@hookimpl
def protomolt_role_module() -> RegistryModule:
    """The registry role module (entry point ``protomolt.roles: registry``)."""
    return RegistryModule()
