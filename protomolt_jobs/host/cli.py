"""``protomolt-jobs``: run a node, call its verbs, watch its jobs, run the demo.

Commands::

    protomolt-jobs serve [--config FILE]
    protomolt-jobs verbs [--url URL] [--token T]
    protomolt-jobs call VERB [JSON | -] [--url URL] [--token T]
    protomolt-jobs jobs list [--status S] [--workflow NAME] [--limit N]
    protomolt-jobs jobs get JOB_ID
    protomolt-jobs jobs show JOB_ID [--json]
    protomolt-jobs jobs watch [--interval S] [--count N]
    protomolt-jobs workflow check FILE
    protomolt-jobs workflow put NAME FILE
    protomolt-jobs workflow get NAME [--version N] [--json]
    protomolt-jobs workflow test FILE
    protomolt-jobs demo [PATH] [--approve-all] [--data-dir DIR]

``serve`` reads the node configuration (``NodeConfig.load``: TOML plus ``PROTOMOLT_*``
variables). With the jobs role mounted and no ``jobs.dsn`` it starts an embedded PostgreSQL in
``<data_dir>/pg`` and says where; with no ``jobs.kafka_bootstrap`` it says the Kafka lanes are
off. Once both surfaces listen it prints ``actions route: http://HOST:PORT/protomolt/actions``
and ``grpc: HOST:PORT`` (one line each), then serves until SIGTERM, SIGINT or SIGHUP (the
terminal closing), and stops cleanly: surfaces, node, then the embedded PostgreSQL it started.

The client commands talk HTTP to a running node (``--url``, default ``$PROTOMOLT_URL`` or
``http://127.0.0.1:8081``; the token from ``--token`` or ``PROTOMOLT_API_TOKEN``). Exit codes:
0 an answer (``ok: false`` answers included), 1 an action error or an unreachable node,
2 a usage error (bad arguments, JSON that is not an object, an unknown verb).
"""

from __future__ import annotations

import argparse
import datetime
import json
import logging
import os
import re
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from protomolt_jobs.errors import ProtomoltJobsError
from protomolt_jobs.host.boot import (
    NodeSurfaces,
    load_config,
    start_surfaces,
)
from protomolt_jobs.host.boot import install_stop_signals as _install_stop_signals
from protomolt_jobs.telemetry.logs import FORMATS
from protomolt_jobs.telemetry.logs import configure as configure_logging

__all__ = ["NodeSurfaces", "main", "start_surfaces"]

log = logging.getLogger("protomolt_jobs.cli")

DEFAULT_URL = "http://127.0.0.1:8081"
EXIT_OK, EXIT_ACTION_ERROR, EXIT_USAGE = 0, 1, 2


class UsageError(ProtomoltJobsError):
    """Bad command-line usage (exit 2)."""


class NodeUnreachable(ProtomoltJobsError):
    """The node at ``--url`` did not answer (exit 1)."""


# --------------------------------------------------------------------------------------
# Running a node
# --------------------------------------------------------------------------------------


def _say(text: str) -> None:
    """Print a status line; a closed terminal (SIGHUP) or pipe must not abort the stop."""
    try:
        print(text, flush=True)
    except OSError:
        pass


def _settled_health(node: Any, stop: threading.Event, within_s: float = 5.0) -> dict[str, Any]:
    """The node's readiness once it is UP, or as it stands after ``within_s`` seconds (the
    loops need a moment to leave STARTING); what ``/health`` answers."""
    deadline = time.monotonic() + within_s
    body: dict[str, Any] = node.health()
    while body.get("status") != "UP" and time.monotonic() < deadline and not stop.wait(0.1):
        body = node.health()
    return body


def _extra_worker_processes(config: Any, roles: Sequence[str], count: int) -> Any:
    """``serve --processes N``: ``count`` more processes from the first mounted role whose
    module offers ``spawn_processes(settings, count)`` (the jobs role: worker processes), or
    None when no mounted role does.

    :raises RuntimeError: a process did not start.
    """
    from protomolt_jobs.host.nodeconfig import role_modules

    modules = role_modules()
    for role in roles:
        spawn = getattr(modules.get(role), "spawn_processes", None)
        if callable(spawn):
            return spawn(config.section(role), count)
    return None


def cmd_serve(args: argparse.Namespace) -> int:
    from protomolt_jobs.config import ConfigError
    from protomolt_jobs.hooks.contract import ComposerError
    from protomolt_jobs.host.composer import compose
    from protomolt_jobs.host.embedded_pg import EmbeddedPostgresError

    stop = threading.Event()
    _install_stop_signals(stop)
    try:
        config, embedded, notes = load_config(args.config, dict(os.environ))
    except ConfigError as exc:
        print(f"configuration error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except EmbeddedPostgresError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_ACTION_ERROR
    for note in notes:
        print(note, flush=True)
    try:
        node = compose(config)
        surfaces = start_surfaces(node, config, embedded=embedded)
    except (ComposerError, OSError, RuntimeError) as exc:
        if embedded is not None:
            embedded.stop()
        print(f"error: the node did not start: {exc}", file=sys.stderr)
        return EXIT_ACTION_ERROR
    extra = None
    try:
        print(f"roles: {', '.join(node.roles)}; data dir: {config.data_dir}", flush=True)
        print(f"actions route: {surfaces.actions_url}", flush=True)
        print(f"grpc: {surfaces.grpc.target}", flush=True)
        if getattr(args, "processes", 1) > 1:
            extra = _extra_worker_processes(config, node.roles, args.processes - 1)
        if extra is not None:
            print(
                f"worker processes: {args.processes} (this node and pids "
                f"{', '.join(map(str, extra.pids))})",
                flush=True,
            )
        print(f"health: {json.dumps(_settled_health(node, stop))}", flush=True)
        while not stop.wait(0.5):
            pass
        _say("stopping")
    except RuntimeError as exc:
        print(f"error: the worker processes did not start: {exc}", file=sys.stderr)
        return EXIT_ACTION_ERROR
    finally:
        if extra is not None:
            extra.stop(timeout_s=60.0)
        surfaces.close()
    _say("stopped")
    return EXIT_OK


# --------------------------------------------------------------------------------------
# Client commands
# --------------------------------------------------------------------------------------


def _token(args: argparse.Namespace) -> str | None:
    # The canonical variable wins over its alias, as in the node's configuration loader.
    return (
        args.token
        or os.environ.get("PROTOMOLT_NODE_API_TOKEN")
        or os.environ.get("PROTOMOLT_API_TOKEN")
    )


def request_json(
    method: str,
    url: str,
    body: Any = None,
    *,
    token: str | None = None,
    timeout_s: float = 30.0,
) -> tuple[int, Any]:
    """One HTTP JSON call: ``(status, decoded body)``.

    :raises NodeUnreachable: connection refused, timeout, or a body that is not JSON.
    """
    data = None if body is None else json.dumps(body).encode("utf-8")
    req = urllib.request.Request(url, data=data, method=method)
    req.add_header("Accept", "application/json")
    if data is not None:
        req.add_header("Content-Type", "application/json")
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            status, payload = resp.status, resp.read()
    except urllib.error.HTTPError as err:
        status, payload = err.code, err.read()
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise NodeUnreachable(f"cannot reach the node at {url}: {reason}") from None
    try:
        return status, json.loads(payload.decode("utf-8")) if payload else None
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise NodeUnreachable(f"{url} answered {status} with a body that is not JSON") from None


class ActionFailed(ProtomoltJobsError):
    """A verb answered with an action error envelope."""

    def __init__(self, status: int, envelope: Any) -> None:
        self.status = status
        self.envelope = envelope if isinstance(envelope, dict) else {}
        self.code = self.envelope.get("error", f"http-{status}")
        super().__init__(f"{self.code}: {self.envelope.get('message', envelope)}")


def call_verb(url: str, verb: str, envelope: dict[str, Any], token: str | None) -> dict[str, Any]:
    """POST ``envelope`` to ``verb`` on the node at ``url``; the answer (ok or not).

    :raises ActionFailed: the node answered with an error envelope.
    :raises NodeUnreachable: the node did not answer.
    """
    status, body = request_json(
        "POST", f"{url.rstrip('/')}/protomolt/actions/{verb}", envelope, token=token
    )
    if status != 200 or not isinstance(body, dict):
        raise ActionFailed(status, body)
    return body


def _envelope_arg(text: str | None) -> dict[str, Any]:
    if text is None:
        return {}
    if text == "-":
        text = sys.stdin.read()
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(f"JSON argument is not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise UsageError('JSON argument must be a JSON object, like \'{"jobId": "..."}\'')
    return value


def cmd_call(args: argparse.Namespace) -> int:
    envelope = _envelope_arg(args.json)
    try:
        answer = call_verb(args.url, args.verb, envelope, _token(args))
    except ActionFailed as failed:
        print(str(failed), file=sys.stderr)
        return EXIT_USAGE if failed.code == "unknown-action" else EXIT_ACTION_ERROR
    print(json.dumps(answer, indent=2, ensure_ascii=False))
    return EXIT_OK


def cmd_verbs(args: argparse.Namespace) -> int:
    status, body = request_json(
        "GET", f"{args.url.rstrip('/')}/protomolt/actions", token=_token(args)
    )
    if status != 200 or not isinstance(body, list):
        print(str(ActionFailed(status, body)), file=sys.stderr)
        return EXIT_ACTION_ERROR
    width = max((len(a.get("name", "")) for a in body), default=0)
    for action in body:
        print(f"{action.get('name', ''):<{width}}  {action.get('description', '')}")
    return EXIT_OK


def _literal(value: Any, style: str = "") -> Any:
    """A stored value as a rich ``Text``: printed as it is, never read as markup (an error
    ``every sink [effect, fix]: required`` keeps its brackets)."""
    from rich.text import Text

    return Text("" if value is None else str(value), style=style)


#: Characters of a job id the list views show (the dashboard's short id; ``--json`` and
#: ``jobs get`` give it whole).
SHORT_ID = 8


def compact_time(stamp: str | None, now: datetime.datetime | None = None) -> str:
    """An ISO-8601 UTC stamp of the API (``2026-12-02T10:04:10.120Z``) in at most 11
    characters, in UTC: ``10:04:10`` on the day of ``now``, ``12-02 10:04`` in its year, else
    ``2025-12-02``. A value that is not such a stamp is returned as it is.

    :param stamp: the API's time, or None (``""``).
    :param now: the reference instant (default: the current time).
    """
    if not stamp:
        return ""
    try:
        at = datetime.datetime.fromisoformat(stamp)
    except ValueError:
        return stamp
    if at.tzinfo is None:
        return stamp
    at = at.astimezone(datetime.UTC)
    now = (now or datetime.datetime.now(datetime.UTC)).astimezone(datetime.UTC)
    if at.date() == now.date():
        return at.strftime("%H:%M:%S")
    if at.year == now.year:
        return at.strftime("%m-%d %H:%M")
    return at.strftime("%Y-%m-%d")


def _jobs_table(jobs: list[dict[str, Any]], width: int, title: str | None = None) -> Any:
    """The list view in ``width`` columns: one line per job (short ids, compact UTC times; a
    long workflow name, step or error is cut with an ellipsis, never wrapped; ``--json`` has
    every value whole). The step column is there only when a job in the list has one; the
    verdict or error takes what the other columns leave."""
    from rich.table import Table

    colours = {
        "COMPLETED": "green",
        "FAILED": "red",
        "DEAD": "bold red",
        "WAITING": "yellow",
        "RUNNING": "cyan",
        "PAUSED": "magenta",
        "RECOVERY_REQUIRED": "bold red",
        "CANCELLED": "bright_black",
    }
    now = datetime.datetime.now(datetime.UTC)
    with_step = any(job.get("outstandingStep") for job in jobs)
    rows: list[dict[str, str]] = []
    for job in jobs:
        note = str(job.get("verdict") or job.get("error") or "")
        row = {
            "id": str(job.get("jobId", ""))[:SHORT_ID],
            "workflow": str(job.get("workflowName", "")),
            "status": str(job.get("status", "")),
            "att": str(job.get("attempt", "")),
            "step": str(job.get("outstandingStep") or ""),
            "updated": compact_time(job.get("updatedAt"), now),
            "verdict / error": note.splitlines()[0] if note else "",
        }
        rows.append(row)
    names = ["id", "workflow", "status", "att"] + (["step"] if with_step else [])
    names += ["updated", "verdict / error"]
    caps = {"workflow": 20, "step": 12}
    widths = {
        n: min(caps.get(n, 1000), max([len(n), *(len(r[n]) for r in rows)])) for n in names[:-1]
    }
    gaps = 2 * (len(names) - 1)
    # Too narrow for every column at its cap: the workflow and step give way first.
    for name, floor in (("workflow", 8), ("step", 4)):
        excess = sum(widths.values()) + gaps + 16 - width
        if name in widths and excess > 0:
            widths[name] = max(floor, widths[name] - excess)
    widths["verdict / error"] = max(8, width - sum(widths.values()) - gaps)
    table = Table(title=title, box=None, pad_edge=False, header_style="bold", expand=False)
    for name in names:
        table.add_column(
            name,
            no_wrap=True,
            overflow="ellipsis",
            max_width=widths[name],
            min_width=SHORT_ID if name == "id" else None,
        )
    for row in rows:
        status = row["status"]
        table.add_row(
            *(
                _literal(row[n], colours.get(status, "white") if n == "status" else "")
                for n in names
            )
        )
    return table


def _list_jobs(args: argparse.Namespace) -> dict[str, Any]:
    envelope: dict[str, Any] = {"limit": args.limit}
    if getattr(args, "status", None):
        envelope["status"] = args.status
    if getattr(args, "workflow", None):
        envelope["workflowName"] = args.workflow
    if getattr(args, "queue", None):
        envelope["queue"] = args.queue
    if getattr(args, "fairness_key", None):
        envelope["fairnessKey"] = args.fairness_key
    return call_verb(args.url, "list-jobs", envelope, _token(args))


#: A job id given by its start (the dashboard's 8-character ids): 4 to 32 hex digits.
_ID_PREFIX = re.compile(r"[0-9a-fA-F]{4,32}")
#: How many candidates an ambiguous prefix names.
_CANDIDATES = 10


def resolve_job_id(args: argparse.Namespace) -> str:
    """``args.job_id`` as the verbs want it: a prefix of 4 to 32 hex digits that starts exactly
    one job's id (``list-jobs`` with ``idPrefix``) is that id; anything else is passed on as
    given (the verb checks it).

    :raises UsageError: no job's id starts with the prefix, or several do (named, up to 10).
    :raises ActionFailed: the node refused the lookup.
    """
    given = str(args.job_id)
    if not _ID_PREFIX.fullmatch(given):
        return given
    answer = call_verb(
        args.url, "list-jobs", {"idPrefix": given, "limit": _CANDIDATES + 1}, _token(args)
    )
    ids = [str(job.get("jobId", "")) for job in answer.get("jobs", [])]
    if len(ids) == 1:
        return ids[0]
    if not ids:
        raise UsageError(f"no job id starts with {given!r}")
    more = " and more" if len(ids) > _CANDIDATES else ""
    raise UsageError(
        f"{given!r} starts several job ids ({', '.join(ids[:_CANDIDATES])}{more}); "
        "give more characters"
    )


def cmd_jobs(args: argparse.Namespace) -> int:
    from rich.console import Console

    console = Console()
    try:
        if getattr(args, "job_id", None) is not None:
            args.job_id = resolve_job_id(args)
        if args.jobs_command == "get":
            answer = call_verb(args.url, "get-job", {"jobId": args.job_id}, _token(args))
            print(json.dumps(answer, indent=2, ensure_ascii=False))
            return EXIT_OK
        if args.jobs_command == "show":
            return _show(args, console)
        if args.jobs_command in ARTIFACT_COMMANDS:
            return _artifact_command(args)
        if args.jobs_command in CONTROL_COMMANDS:
            return _control(args, console)
        if args.jobs_command == "list":
            answer = _list_jobs(args)
            if args.json:
                print(json.dumps(answer, indent=2, ensure_ascii=False))
            else:
                console.print(_jobs_table(answer.get("jobs", []), console.width))
            return EXIT_OK
        return _watch(args, console)
    except ActionFailed as failed:
        print(str(failed), file=sys.stderr)
        return EXIT_USAGE if failed.code == "invalid-input" else EXIT_ACTION_ERROR


def _show(args: argparse.Namespace, console: Any) -> int:
    """``jobs show ID``: the job's workflow as text (``host/graph_text.py``), or with
    ``--json`` the job's summary, get-job's ``graph`` and the layers. An ``ok: false`` answer
    (no such job) is printed as JSON, exit 0, as ``get`` does."""
    from protomolt_jobs.host.graph_text import lines, show_json
    from protomolt_jobs.host.job_graph import read_graph

    answer = call_verb(args.url, "get-job", {"jobId": args.job_id, "graph": True}, _token(args))
    job = answer.get("job") if answer.get("ok") else None
    graph = read_graph(job.get("graph")) if isinstance(job, dict) else None
    if job is None or graph is None:
        print(json.dumps(answer, indent=2, ensure_ascii=False))
        return EXIT_OK
    if args.json:
        print(json.dumps(show_json(answer, graph), indent=2, ensure_ascii=False))
        return EXIT_OK
    header = (
        f"job {str(job.get('jobId', ''))[:SHORT_ID]}  {job.get('workflowName', '')}  "
        f"{job.get('status', '')}  attempt {job.get('attempt', '')}  ({graph.kind})"
    )
    for line in lines(graph, header, console.width):
        console.print(line, no_wrap=True, overflow="ellipsis", crop=True)
    return EXIT_OK


#: ``jobs artifacts JOB_ID`` / ``jobs artifact ARTIFACT_ID`` / ``jobs lineage ARTIFACT_ID`` /
#: ``jobs retract ARTIFACT_ID`` / ``jobs promote ARTIFACT_ID --reason TEXT``: the artifact verb
#: each runs (docs/artifacts.md).
ARTIFACT_COMMANDS = {
    "artifacts": "list-artifacts",
    "artifact": "get-artifact",
    "lineage": "lineage",
    "retract": "retract-artifact",
    "promote": "promote-artifact",
}


def _artifact_command(args: argparse.Namespace) -> int:
    """One artifact verb; prints its answer as JSON, exit 0 for an answer (``ok: false``
    included), as ``get`` does."""
    verb = ARTIFACT_COMMANDS[args.jobs_command]
    if verb == "list-artifacts":
        envelope: dict[str, Any] = {"jobId": args.job_id}
    else:
        envelope = {"artifactId": args.artifact_id}
    if verb in ("retract-artifact", "promote-artifact") and args.reason is not None:
        envelope["reason"] = args.reason
    if verb == "lineage":
        envelope["direction"] = args.direction
        if args.depth is not None:
            envelope["depth"] = args.depth
    answer = call_verb(args.url, verb, envelope, _token(args))
    print(json.dumps(answer, indent=2, ensure_ascii=False))
    return EXIT_OK


#: ``jobs <command> ID``: the operator verb each runs.
CONTROL_COMMANDS = {
    "cancel": "cancel-job",
    "pause": "pause-job",
    "resume": "resume-job",
    "retry": "retry-step",
    "reconcile": "reconcile-step",
    "migrate": "migrate-checkpoint",
    "requeue": "requeue-job",
    "history": "job-history",
    "approve": "approve-step",
    "extend-loop": "extend-loop",
    "explain": "explain-job",
    "supply-input": "supply-input",
}


#: ``--at "tomorrow 22:00"``: a relative day, then a time of day.
_RELATIVE_AT = re.compile(r"(today|tomorrow|next)\s+(\S+)", re.ASCII)


def _local_at(text: str) -> dict[str, str]:
    """``--at``'s envelope fields: ``{"day", "at"}`` for ``"tomorrow 22:00"`` (a relative day
    and a time of day; resume-job's ``day``), else ``{"at": text}`` as given (the verb says
    what is wrong with it, naming the field)."""
    found = _RELATIVE_AT.fullmatch(text.strip())
    if found is None:
        return {"at": text}
    return {"day": found.group(1), "at": found.group(2)}


def _control(args: argparse.Namespace, console: Any) -> int:
    """One operator verb; prints its answer as JSON (``history``: a table unless ``--json``).
    Exit 0 for an answer (``ok: false`` included), as ``call`` does."""
    verb = CONTROL_COMMANDS[args.jobs_command]
    envelope: dict[str, Any] = {"jobId": args.job_id}
    if getattr(args, "reason", None):
        envelope["reason"] = args.reason
    if getattr(args, "at", None):
        envelope.update(_local_at(args.at))
    if getattr(args, "zone", None):
        envelope["zone"] = args.zone
    if getattr(args, "tz", None):
        envelope["tz"] = args.tz
    if getattr(args, "step", None):
        envelope["step" if verb == "extend-loop" else "stepName"] = args.step
    if getattr(args, "by", None) is not None:
        envelope["by"] = args.by
    if getattr(args, "only", False):
        envelope["scope"] = "only"
    if getattr(args, "compensate", None) is not None:
        envelope["compensate"] = args.compensate
    if getattr(args, "outcome", None):
        envelope["outcome"] = args.outcome
    if getattr(args, "migrate_action", None):
        envelope["action"] = args.migrate_action
    if getattr(args, "decision", None):
        envelope["decision"] = args.decision
    if getattr(args, "comment", None):
        envelope["comment"] = args.comment
    if getattr(args, "response", None):
        try:
            envelope["response"] = json.loads(args.response)
        except ValueError as exc:
            print(f"--response is not JSON: {exc}", file=sys.stderr)
            return EXIT_USAGE
    if verb == "supply-input":
        envelope["path"] = args.path
        try:
            envelope["value"] = json.loads(args.value)
        except ValueError as exc:
            # the door's own refusal, in the node's words: the field and why
            print(
                f"invalid-input: --value (field 'value') is not JSON: {exc}; "
                "a string is written with its quotes, '\"s3://b/k\"'",
                file=sys.stderr,
            )
            return EXIT_USAGE
    answer = call_verb(args.url, verb, envelope, _token(args))
    if verb == "explain-job" and not args.json and answer.get("ok"):
        for line in explain_lines(answer.get("explain", {})):
            console.print(_literal(line), soft_wrap=True)
        return EXIT_OK
    if verb != "job-history" or args.json or not answer.get("ok"):
        print(json.dumps(answer, indent=2, ensure_ascii=False))
        return EXIT_OK
    from rich.table import Table

    table = Table(title=_literal(f"job {args.job_id}: integrity {answer.get('integrity')}"))
    for column in ("seq", "at", "kind", "actor", "status", "attempt", "step", "reason"):
        table.add_column(column, overflow="fold")
    for t in answer.get("transitions", []):
        status = f"{t.get('prevStatus', '-')} -> {t.get('newStatus', '')}"
        table.add_row(
            *(
                _literal(value)
                for value in (
                    t.get("seq"),
                    t.get("at"),
                    t.get("kind"),
                    t.get("actor"),
                    status,
                    t.get("attempt"),
                    t.get("step"),
                    (t.get("reason") or "")[:120],
                )
            )
        )
    console.print(table)
    return EXIT_OK


def explain_lines(explain: dict[str, Any]) -> list[str]:
    """``jobs explain``'s text: one line for the run, then per undecided step its state and
    owner, what blocks it, what it waits on and its missing inputs with their owners."""
    head = f"{explain.get('status', '')}"
    if explain.get("waitKind"):
        head += f" (waiting for {explain['waitKind']} on {explain.get('outstandingStep')})"
    out = [head]
    steps = explain.get("steps", [])
    if not steps:
        out.append("no step is waiting: the run is finished or every step is decided")
    for step in steps:
        owner = f"  owner {step['owner']}" if step.get("owner") else ""
        out.append(f"{step.get('name')}: {step.get('state')}{owner}")
        blocked = step.get("blockedBy") or []
        if blocked:
            names = ", ".join(f"{b.get('step')} ({b.get('state')})" for b in blocked)
            out.append(f"  blocked by {names}")
        for wait in step.get("waitingOn") or []:
            out.append("  waiting on " + _wait_text(wait))
        for m in step.get("missingInputs") or []:
            who = m.get("owner") or "no owner declared"
            need = "required" if m.get("required") else "optional"
            out.append(f"  missing input {m.get('path')} ({need}; owner {who})")
    for stale in explain.get("staleInput") or []:
        out.append(
            f"stale input: {stale.get('step')} read {stale.get('path')} before revision "
            f"{stale.get('revision')}"
        )
    return out


def _wait_text(wait: dict[str, Any]) -> str:
    kind = wait.get("kind")
    if kind in ("approval", "grant"):
        tally = ", ".join(f"{d} {n}" for d, n in (wait.get("tally") or {}).items()) or "none"
        who = ", ".join([*(wait.get("roles") or []), *(wait.get("principals") or [])])
        return (
            f"{kind}: {wait.get('missingVotes')} more vote(s) of quorum {wait.get('quorum')} "
            f"(votes: {tally}; eligible: {who or 'nobody'})"
        )
    if kind == "input":
        return "input (supply-input)"
    if kind == "completion":
        return "its completion (complete-step)"
    if kind == "timer":
        return f"a timer: not before {wait.get('at')}"
    if kind == "claim":
        return f"a worker of queue {wait.get('queue')}"
    details = wait.get("reason") or wait.get("detail") or ""
    return f"{kind}" + (f": {details}" if details else "")


def _watch(args: argparse.Namespace, console: Any) -> int:
    from rich.console import Group
    from rich.live import Live
    from rich.text import Text

    def render() -> Any:
        jobs = _list_jobs(args).get("jobs", [])
        counts: dict[str, int] = {}
        for job in jobs:
            counts[job.get("status", "?")] = counts.get(job.get("status", "?"), 0) + 1
        summary = "  ".join(f"{k} {v}" for k, v in sorted(counts.items())) or "no jobs"
        stamp = time.strftime("%H:%M:%S")
        header = Text(f"{stamp}  newest {len(jobs)} jobs: {summary}  (Ctrl-C to stop)")
        return Group(header, _jobs_table(jobs, console.width))

    stop = threading.Event()
    _install_stop_signals(stop)
    refreshes = 0
    with Live(render(), console=console, refresh_per_second=4, transient=False) as live:
        refreshes += 1
        while (args.count is None or refreshes < args.count) and not stop.wait(args.interval):
            live.update(render())
            refreshes += 1
    return EXIT_OK


def _workflow_file(path: str) -> dict[str, Any]:
    """The workflow envelope in ``path`` (a JSON object; ``-`` reads stdin).

    :raises UsageError: the file cannot be read, is not JSON, or is not an object.
    """
    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"cannot read workflow file {path}: {exc}") from None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(f"{path} is not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise UsageError(f"{path} must hold a JSON object (the workflow envelope)")
    return value


def _print_findings(findings: list[Any]) -> None:
    for finding in findings:
        if not isinstance(finding, dict):
            continue
        step = finding.get("step") or "(workflow)"
        print(f"  {step}: [{finding.get('kind', '?')}] {finding.get('error', '')}")


def cmd_workflow(args: argparse.Namespace) -> int:
    """``workflow check FILE`` (the node's check-workflow verb) and ``workflow put NAME FILE``
    (PUT /protomolt/workflows/NAME, which checks first, then runs its tests: the result is
    printed, and with ``jobs.require_workflow_tests`` a failing case refuses it). Exit 0 when
    the workflow verifies (and, for put, is stored); 1 with the findings on stdout when it
    does not. ``workflow get NAME``: :func:`_workflow_get`."""
    token = _token(args)
    if args.workflow_command == "get":
        return _workflow_get(args, token)
    definition = _workflow_file(args.file)
    if args.workflow_command == "replay-check":
        return _replay_check(args, definition, token)
    if args.workflow_command == "test":
        return _workflow_test(args, definition, token)
    if args.workflow_command == "check":
        try:
            answer = call_verb(args.url, "check-workflow", {"workflow": definition}, token)
        except ActionFailed as failed:
            print(str(failed), file=sys.stderr)
            return EXIT_ACTION_ERROR
        findings = answer.get("findings") or []
        worst = answer.get("worstCase")
        if isinstance(worst, dict):
            cost = worst.get("cost")
            print(
                f"{args.file}: worst case {worst.get('executions')} step executions, "
                f"{worst.get('calls')} calls"
                + (f", cost {cost:g}" if isinstance(cost, (int, float)) else "")
                + " (every loop run to its bound)"
            )
        if answer.get("ok"):
            print(f"{args.file}: ok (no findings)")
            return EXIT_OK
        print(f"{args.file}: {len(findings)} finding{'s' if len(findings) != 1 else ''}")
        _print_findings(findings)
        return EXIT_ACTION_ERROR
    status, body = request_json(
        "PUT",
        f"{args.url.rstrip('/')}/protomolt/workflows/{urllib.parse.quote(args.name, safe='')}",
        definition,
        token=token,
    )
    if status == 200:
        version = body.get("version") if isinstance(body, dict) else None
        print(f"stored workflow '{args.name}'" + (f" as version {version}" if version else ""))
        tests = body.get("tests") if isinstance(body, dict) else None
        if isinstance(tests, dict):
            _print_test_result(tests)
        return EXIT_OK
    refused = ActionFailed(status, body)
    print(str(refused), file=sys.stderr)
    _print_findings(refused.envelope.get("findings") or [])
    if isinstance(refused.envelope.get("tests"), dict):
        _print_test_result(refused.envelope["tests"])
    return EXIT_USAGE if refused.code == "invalid-input" else EXIT_ACTION_ERROR


def _print_test_result(tests: dict[str, Any]) -> None:
    """A version's ``lastTest``: a summary line, then a line per case."""
    if not tests.get("cases"):
        print(f"tests: not run ({tests.get('error', 'no tests')})")
        return
    print(f"tests: {tests.get('passed', 0)} passed, {tests.get('failed', 0)} failed")
    for case in tests["cases"]:
        if case.get("passed"):
            print(f"  pass  {case.get('name')}")
        else:
            print(f"  FAIL  {case.get('name')}: {case.get('difference', '')}")


def _seconds_text(seconds: Any) -> str:
    if not isinstance(seconds, (int, float)):
        return "kept"
    for unit, size in (("d", 86_400), ("h", 3_600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{seconds:g}s"


def _workflow_get(args: argparse.Namespace, token: str | None) -> int:
    """``workflow get NAME [--version N] [--json]``: the node's get-workflow verb. Prints the
    version, who stored it, the retention per final status and the last test result (or the
    whole answer with ``--json``). Exit 0 when the workflow is stored, 1 when it is not (or
    an action error), 2 for invalid input."""
    body: dict[str, Any] = {"workflowName": args.name}
    if args.version is not None:
        body["version"] = args.version
    try:
        answer = call_verb(args.url, "get-workflow", body, token)
    except ActionFailed as failed:
        print(str(failed), file=sys.stderr)
        return EXIT_USAGE if failed.code == "invalid-input" else EXIT_ACTION_ERROR
    if args.json:
        print(json.dumps(answer, indent=2, ensure_ascii=False))
        return EXIT_OK if answer.get("ok") else EXIT_ACTION_ERROR
    if not answer.get("ok"):
        print(f"{args.name}: {answer.get('error', 'not found')}")
        return EXIT_ACTION_ERROR
    version = answer.get("version")
    said = f"version {version}" if version is not None else "no version record"
    if version is not None and not answer.get("current"):
        said += f" (not current; latest {answer.get('latestVersion')})"
    stored = ""
    if answer.get("storedAt"):
        stored = f", stored {answer['storedAt']} by {answer.get('storedBy')}"
    print(f"{args.name}: {said}{stored}")
    kept = answer.get("retention") or {}
    print(
        "retention: "
        + ", ".join(
            f"{status} {_seconds_text(v.get('seconds'))} ({v.get('source')})"
            for status, v in kept.items()
            if isinstance(v, dict)
        )
    )
    tested = answer.get("lastTest")
    if not isinstance(tested, dict):
        print("tests: never run")
        return EXIT_OK
    print(f"last test: {tested.get('at')} by {tested.get('by')} (via {tested.get('via')})")
    _print_test_result(tested)
    return EXIT_OK


def _replay_check(args: argparse.Namespace, candidate: Any, token: str | None) -> int:
    """``workflow replay-check NAME FILE``: the node's replay-check verb; exit 0 when no
    examined run would drift, 1 with one line per drifting run otherwise."""
    body: dict[str, Any] = {"workflowName": args.name, "candidate": candidate}
    if args.limit is not None:
        body["limit"] = args.limit
    if args.finished is not None:
        body["finished"] = args.finished
    try:
        answer = call_verb(args.url, "replay-check", body, token)
    except ActionFailed as failed:
        print(str(failed), file=sys.stderr)
        return EXIT_USAGE if failed.code == "invalid-input" else EXIT_ACTION_ERROR
    examined = answer.get("examined") or {}
    seen = f"{examined.get('live', 0)} live, {examined.get('finished', 0)} finished"
    drifting = answer.get("drifting") or []
    more = " (more live runs than the limit)" if answer.get("more") else ""
    if not drifting:
        print(f"{args.file}: no run would drift ({seen} examined){more}")
        return EXIT_OK
    print(f"{args.file}: {len(drifting)} of the runs ({seen} examined) would drift{more}")
    for run in drifting:
        print(f"  {run.get('jobId')} {run.get('status')}: [{run.get('rule')}] {run.get('reason')}")
    return EXIT_ACTION_ERROR


def _workflow_test(args: argparse.Namespace, definition: Any, token: str | None) -> int:
    """``workflow test FILE``: the node's test-workflow verb; a line per case (its first
    difference when it failed), then what no case reached. Exit 0 when every case passed, 1
    when one failed (or the definition has none), 2 for invalid input."""
    try:
        answer = call_verb(args.url, "test-workflow", {"workflow": definition}, token)
    except ActionFailed as failed:
        print(str(failed), file=sys.stderr)
        return EXIT_USAGE if failed.code == "invalid-input" else EXIT_ACTION_ERROR
    if "cases" not in answer:
        print(f"{args.file}: {answer.get('error', 'not tested')}")
        return EXIT_ACTION_ERROR
    for case in answer["cases"]:
        if case.get("passed"):
            print(f"  pass  {case.get('name')}")
        else:
            print(f"  FAIL  {case.get('name')}: {case.get('difference', '')}")
    print(f"{args.file}: {answer.get('passed', 0)} passed, {answer.get('failed', 0)} failed")
    for kind, items in (answer.get("coverage") or {}).items():
        if items:
            print(f"  not reached ({kind}): {', '.join(str(i) for i in items)}")
    return EXIT_OK if answer.get("ok") else EXIT_ACTION_ERROR


def cmd_demo(args: argparse.Namespace) -> int:
    from protomolt_jobs.host.demo import run_demo

    return run_demo(
        path=Path(args.path) if args.path else None,
        approve_all=args.approve_all,
        data_dir=Path(args.data_dir) if args.data_dir else None,
        workers=args.workers,
        timeout_s=args.timeout,
        http_port=args.http_port,
        progress_interval_s=args.progress_interval,
    )


# --------------------------------------------------------------------------------------
# Argument parsing
# --------------------------------------------------------------------------------------


class _Parser(argparse.ArgumentParser):
    """An argument parser whose commands take options before, between or after their
    positional arguments (``call VERB --token T '{...}'``): a parser without subcommands
    parses intermixed. Plain argparse fills an optional positional (``call``'s JSON) with
    nothing when an option follows the first positional, then refuses the JSON as
    unrecognized."""

    _intermixed = False

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        if self._subparsers is not None or self._intermixed:
            return super().parse_known_args(args, namespace)
        # parse_known_intermixed_args calls parse_known_args itself: those calls go to argparse.
        self._intermixed = True
        try:
            return self.parse_known_intermixed_args(args, namespace)
        finally:
            self._intermixed = False


def _client_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--url",
        default=os.environ.get("PROTOMOLT_URL") or DEFAULT_URL,
        help=f"the node's base URL (default: $PROTOMOLT_URL or {DEFAULT_URL})",
    )
    p.add_argument("--token", help="API token (default: $PROTOMOLT_API_TOKEN)")


def build_parser() -> argparse.ArgumentParser:
    """The ``protomolt-jobs`` argument parser."""
    parser = _Parser(
        prog="protomolt-jobs",
        description="Durable workflow jobs on PostgreSQL: run a node, call its verbs, run the demo.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    serve = sub.add_parser("serve", help="run a node (embedded PostgreSQL when no dsn is set)")
    serve.add_argument("--config", help="protomolt.toml ([node] and [jobs] tables)")
    serve.add_argument("--log-level", default="INFO", help="logging level (default INFO)")
    _log_format_option(serve)
    serve.add_argument(
        "--processes",
        type=int,
        default=1,
        help="worker processes for the jobs role: the node's own plus N-1 more (default 1)",
    )
    serve.set_defaults(func=cmd_serve)

    verbs = sub.add_parser("verbs", help="list the verbs a running node serves")
    _client_options(verbs)
    verbs.set_defaults(func=cmd_verbs)

    call = sub.add_parser("call", help="call one verb on a running node")
    call.add_argument("verb", help="verb name, e.g. submit-workflow")
    call.add_argument("json", nargs="?", help="the input envelope (a JSON object; '-' reads stdin)")
    _client_options(call)
    call.set_defaults(func=cmd_call)

    jobs = sub.add_parser("jobs", help="list, show, watch and control jobs on a running node")
    jobs_sub = jobs.add_subparsers(
        dest="jobs_command",
        required=True,
        metavar="list|get|show|watch|cancel|pause|resume|retry|reconcile|migrate|requeue|"
        "history|approve|extend-loop|explain|supply-input|artifacts|artifact|lineage|retract|"
        "promote",
    )
    for name, text in (("list", "a table of jobs, newest first"), ("watch", "a live table")):
        p = jobs_sub.add_parser(name, help=text)
        p.add_argument(
            "--status",
            help="QUEUED, RUNNING, WAITING, PAUSED, RECOVERY_REQUIRED, COMPLETED, FAILED, DEAD "
            "or CANCELLED",
        )
        p.add_argument("--workflow", help="only jobs of this workflow name")
        p.add_argument("--queue", help="only jobs of this queue")
        p.add_argument("--fairness-key", help="only jobs of this fairness key")
        p.add_argument("--limit", type=int, default=50, help="at most this many jobs (<= 500)")
        _client_options(p)
        if name == "list":
            p.add_argument("--json", action="store_true", help="print the list-jobs answer as JSON")
        else:
            p.add_argument("--interval", type=float, default=1.0, help="seconds between refreshes")
            p.add_argument("--count", type=int, help="stop after this many refreshes")
    get = jobs_sub.add_parser("get", help="one job in full (get-job)")
    get.add_argument("job_id", help="the job's id, or its first 4+ hex digits when unique")
    _client_options(get)
    show = jobs_sub.add_parser(
        "show", help="one job's workflow drawn as text: steps by layer with states, edges, reasons"
    )
    show.add_argument("job_id", help="the job's id, or its first 4+ hex digits when unique")
    show.add_argument(
        "--json", action="store_true", help="print the job, its graph and the layers as JSON"
    )
    _client_options(show)
    arts = jobs_sub.add_parser(
        "artifacts", help="every artifact of a job: hashes, producer, lineage, state, stale"
    )
    arts.add_argument("job_id", help="the job's id, or its first 4+ hex digits when unique")
    _client_options(arts)
    art = jobs_sub.add_parser("artifact", help="one artifact with its value (get-artifact)")
    art.add_argument("artifact_id", help="the artifact's id (list-artifacts)")
    _client_options(art)
    lin = jobs_sub.add_parser("lineage", help="an artifact's producers and consumers (lineage)")
    lin.add_argument("artifact_id", help="the artifact's id (list-artifacts)")
    lin.add_argument("--direction", choices=("up", "down", "both"), default="both")
    lin.add_argument("--depth", type=int, help="how far to walk, 1 to 50 (default 10)")
    _client_options(lin)
    ret = jobs_sub.add_parser(
        "retract", help="mark an artifact retracted: never published (retract-artifact)"
    )
    ret.add_argument("artifact_id", help="the artifact's id (list-artifacts)")
    ret.add_argument("--reason", help="why (kept with the change)")
    _client_options(ret)
    pro = jobs_sub.add_parser(
        "promote",
        help="promote a verified artifact outside a publication step (promote-artifact)",
    )
    pro.add_argument("artifact_id", help="the artifact's id (list-artifacts)")
    pro.add_argument("--reason", required=True, help="why (required; kept with the change)")
    _client_options(pro)
    for name, text in (
        (
            "cancel",
            (
                "cancel a job (cancel-job); a RUNNING job's pure step in flight is cancelled, "
                "an external one finishes"
            ),
        ),
        ("pause", "pause a job at a checkpoint boundary (pause-job)"),
        ("resume", "resume a PAUSED job, now or --at a time (resume-job)"),
        ("retry", "run --step and the steps after it again (retry-step)"),
        (
            "reconcile",
            "say whether a RECOVERY_REQUIRED job's --step happened (reconcile-step)",
        ),
        (
            "migrate",
            "keep, discard or replace a mismatched checkpoint of --step (migrate-checkpoint)",
        ),
        ("requeue", "queue a DEAD or FAILED job again (requeue-job)"),
        ("history", "the job's transition log and its integrity (job-history)"),
        ("approve", "vote --decision on the approval step --step a job waits on (approve-step)"),
        (
            "extend-loop",
            "let the loop of --step iterate --by more times in this run (extend-loop)",
        ),
        (
            "explain",
            (
                "what blocks each step not yet decided: dependencies, waits, missing inputs "
                "and their owners (explain-job)"
            ),
        ),
        (
            "supply-input",
            "supply --path = --value (JSON) to a job waiting for input (supply-input)",
        ),
    ):
        p = jobs_sub.add_parser(name, help=text)
        p.add_argument("job_id", help="the job's id, or its first 4+ hex digits when unique")
        if name == "approve":
            p.add_argument("--step", required=True, help="the approval step")
            p.add_argument("--decision", required=True, help="one of the step's decisions")
            p.add_argument("--comment", help="a comment kept with the vote")
        elif name not in ("history", "explain"):
            p.add_argument("--reason", help="why (kept in the job's history)")
        if name == "supply-input":
            p.add_argument("--path", required=True, help="the input path (report.dataset_uri)")
            p.add_argument(
                "--value", required=True, help="its value as JSON ('\"s3://b/k\"', 42, {...})"
            )
        if name == "cancel":
            p.add_argument(
                "--compensate",
                action=argparse.BooleanOptionalAction,
                default=None,
                help="run the compensation steps (--no-compensate: keep what the run did; "
                "default: the workflow's cancel.compensate, true when absent)",
            )
        if name == "extend-loop":
            p.add_argument("--step", required=True, help="the step that declares the loop")
            p.add_argument("--by", required=True, type=int, help="re-runs to add (>= 1)")
        if name == "resume":
            p.add_argument(
                "--at",
                help="RFC 3339 time (database clock), e.g. 2026-01-02T22:00:00Z, or with --zone "
                "(--tz) a local time: '2026-12-03 22:00', '22:00' (the next time the zone's "
                "clock shows it), 'today 22:00', 'tomorrow 22:00' or 'next 22:00'",
            )
            p.add_argument(
                "--zone",
                help="IANA time zone of a local --at, e.g. Europe/Warsaw (a time the clocks skip "
                "is refused, one they pass twice is the first)",
            )
            p.add_argument("--tz", help="another name for --zone (give one of them)")
        if name == "retry":
            p.add_argument("--step", required=True, help="the step to run again")
            p.add_argument(
                "--only",
                action="store_true",
                help="scope only: run the step alone; its dependants run again only if its "
                "output changed (default: the step and its dependants)",
            )
        if name in ("reconcile", "migrate"):
            p.add_argument("--step", required=True, help="the step (the job's outstanding step)")
            p.add_argument("--response", help="the step's response: proto3 JSON of its output type")
        if name == "reconcile":
            p.add_argument("--outcome", required=True, choices=("done", "not-done"))
        if name == "migrate":
            p.add_argument(
                "--action",
                dest="migrate_action",
                required=True,
                choices=("keep", "discard", "replace"),
            )
        if name in ("history", "explain"):
            p.add_argument("--json", action="store_true", help="print the answer as JSON")
        _client_options(p)
    jobs.set_defaults(func=cmd_jobs)

    workflow = sub.add_parser("workflow", help="check or store a workflow file on a running node")
    workflow_sub = workflow.add_subparsers(
        dest="workflow_command", required=True, metavar="check|test|put|get|replay-check"
    )
    check = workflow_sub.add_parser(
        "check", help="verify a workflow file (check-workflow): findings, nothing stored"
    )
    check.add_argument("file", help="the workflow envelope, a JSON file ('-' reads stdin)")
    _client_options(check)
    wtest = workflow_sub.add_parser(
        "test",
        help="run a workflow file's tests (test-workflow): mocked steps, no network, nothing stored",
    )
    wtest.add_argument("file", help="the workflow envelope, a JSON file ('-' reads stdin)")
    _client_options(wtest)
    put = workflow_sub.add_parser(
        "put", help="store a workflow under NAME (refused with its findings if it does not verify)"
    )
    put.add_argument("name", help="the name to submit it by (lower case, digits, '.', '_', '-')")
    put.add_argument("file", help="the workflow envelope, a JSON file ('-' reads stdin)")
    _client_options(put)
    wget = workflow_sub.add_parser(
        "get",
        help="a stored workflow's version, retention and last test result (get-workflow)",
    )
    wget.add_argument("name", help="the stored workflow's name")
    wget.add_argument("--version", type=int, help="a stored version (default: the current one)")
    wget.add_argument("--json", action="store_true", help="print the answer as JSON")
    _client_options(wget)
    replay = workflow_sub.add_parser(
        "replay-check",
        help="list the runs of NAME whose checkpoints would not replay under FILE (replay-check)",
    )
    replay.add_argument("name", help="the workflow whose runs are replayed")
    replay.add_argument("file", help="the candidate envelope, a JSON file ('-' reads stdin)")
    replay.add_argument("--limit", type=int, help="most live runs examined (1..500; 100)")
    replay.add_argument("--finished", type=int, help="also the last N finished runs (0..100)")
    _client_options(replay)
    workflow.set_defaults(func=cmd_workflow)

    demo = sub.add_parser("demo", help="run the demo: one job per text file")
    demo.add_argument(
        "path",
        nargs="?",
        help="a text file or a directory of them: plain, Markdown, HTML or gzip'ed text, by "
        "content (default: the shipped samples)",
    )
    demo.add_argument("--approve-all", action="store_true", help="complete every parked review")
    demo.add_argument(
        "--data-dir", help="data directory (default $PROTOMOLT_NODE_DATA_DIR or ./.protomolt-data)"
    )
    demo.add_argument("--workers", type=int, default=4, help="worker claim loops (default 4)")
    demo.add_argument(
        "--timeout", type=float, default=600.0, help="give up after this many seconds"
    )
    demo.add_argument(
        "--http-port",
        type=int,
        default=None,
        help="HTTP port (default 8081, or the next free one; 0: any free port)",
    )
    demo.add_argument(
        "--progress-interval",
        type=float,
        default=2.0,
        help="seconds between progress lines when the output is not a terminal (default 2)",
    )
    _log_format_option(demo)
    demo.set_defaults(func=cmd_demo)
    return parser


def _log_format_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--log-format",
        choices=FORMATS,
        default="text",
        help="text (default: job fields after the message) or json (one object per line)",
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``protomolt-jobs``; returns the exit code."""
    # gRPC core logs INFO lines on fork (the embedded PostgreSQL's pg_ctl); keep stderr quiet.
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse exits 2 on usage errors, 0 on --help
        return int(exc.code or 0)
    configure_logging(
        getattr(logging, str(getattr(args, "log_level", "WARNING")).upper(), logging.INFO)
        if args.command == "serve"
        else logging.WARNING,
        getattr(args, "log_format", "text"),
    )
    func: Callable[[argparse.Namespace], int] = args.func
    try:
        return func(args)
    except UsageError as exc:
        print(f"usage error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except NodeUnreachable as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_ACTION_ERROR
    except BrokenPipeError:
        # The reader went away (`... | head`): not an error worth a traceback. Point stdout
        # at /dev/null so the interpreter's final flush does not raise again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
