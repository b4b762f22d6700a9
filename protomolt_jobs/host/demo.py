"""``protomolt-jobs demo``: one durable job per document, start to finish, on one machine.

What it does:

1. Boots a node with the ``registry``, ``parse`` and ``jobs`` roles in the data directory
   (``--data-dir``, else ``$PROTOMOLT_NODE_DATA_DIR``, else ``./.protomolt-data``). With no
   ``jobs.dsn`` configured the jobs live in the embedded PostgreSQL under ``<data_dir>/pg``;
   a second run reuses it.
2. Starts the demo's tokenize/embed/review gRPC services on a loopback port and stores the
   ``demo-document`` workflow: parse (in-process) -> tokenize -> embed -> review, the review
   being an external step the job parks on.
3. Submits one job per ``.txt``/``.md`` file under PATH (default: the shipped samples). Files
   with NUL bytes are skipped (binary); text over 1 MiB is cut to its first MiB (the parser's
   limit); text that is not UTF-8 is decoded with replacement characters.
4. Shows a live progress bar of QUEUED / RUNNING / WAITING / COMPLETED, and completes parked
   reviews itself with ``--approve-all``; otherwise it prints the exact ``complete-step``
   command and keeps serving until every job is finished (Ctrl-C stops it; parked jobs stay
   WAITING in the database).
5. Ends with a summary: completed, failed, dead, still waiting, jobs per second, and the p50 /
   p95 time from submit to completion.

Exit code: 0 when every job completed; 1 when any failed or went dead, the run timed out or
was interrupted with jobs unfinished; 2 for a PATH with no documents.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import threading
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime
from importlib import resources
from pathlib import Path
from typing import Any

__all__ = ["DOCUMENT_SUFFIXES", "WORKFLOW_NAME", "collect_documents", "run_demo", "summarize"]

log = logging.getLogger("protomolt_jobs.demo")

WORKFLOW_NAME = "demo-document"
DOCUMENT_SUFFIXES = (".txt", ".md", ".markdown")
_TERMINAL = ("COMPLETED", "FAILED", "DEAD")
_MAX_BYTES = 1024 * 1024


@dataclass
class Document:
    """One document to submit."""

    name: str
    text: str
    mime_type: str


@dataclass
class Collected:
    """What :func:`collect_documents` found."""

    documents: list[Document] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)
    truncated: list[str] = field(default_factory=list)


def samples_dir() -> Path:
    """The sample documents shipped with the package."""
    return Path(str(resources.files("protomolt_jobs.host") / "samples"))


def collect_documents(path: Path) -> Collected:
    """Every ``.txt``/``.md`` file at or under ``path``, sorted by path.

    :param path: a file or a directory (searched recursively).
    :returns: documents to submit (text over 1 MiB cut to its first MiB, listed in
        ``truncated``) and ``(name, reason)`` for each skipped (binary) file.
    """
    path = Path(path)
    candidates = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    found = Collected()
    for file in candidates:
        if file.suffix.lower() not in DOCUMENT_SUFFIXES:
            continue
        name = file.name if file == path else file.relative_to(path).as_posix()
        try:
            raw = file.read_bytes()
        except OSError as exc:
            found.skipped.append((name, f"unreadable: {exc}"))
            continue
        if b"\x00" in raw:
            found.skipped.append((name, "binary (NUL bytes)"))
            continue
        text = raw.decode("utf-8", errors="replace")
        if len(text.encode("utf-8")) > _MAX_BYTES:
            # The parser refuses more than 1 MiB: submit the first MiB rather than nothing.
            text = text.encode("utf-8")[:_MAX_BYTES].decode("utf-8", errors="ignore")
            found.truncated.append(name)
        mime = "text/markdown" if file.suffix.lower() in (".md", ".markdown") else "text/plain"
        found.documents.append(Document(name, text, mime))
    return found


def _instant(text: str | None) -> datetime | None:
    if not text:
        return None
    try:
        return datetime.fromisoformat(text)
    except ValueError:
        return None


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return 0.0
    k = (len(ordered) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def summarize(jobs: dict[str, dict[str, Any]], elapsed_s: float) -> dict[str, Any]:
    """Counts and timings of a demo run.

    :param jobs: job id -> the latest job document (list-jobs summary shape).
    :param elapsed_s: seconds from the first submit to the end of the run.
    :returns: ``{total, completed, failed, dead, waiting, unfinished, jobs_per_s, p50_s, p95_s}``.
    """
    counts = {s: 0 for s in ("COMPLETED", "FAILED", "DEAD", "WAITING")}
    durations: list[float] = []
    for job in jobs.values():
        status = job.get("status", "")
        if status in counts:
            counts[status] += 1
        if status == "COMPLETED":
            start, end = _instant(job.get("createdAt")), _instant(job.get("completedAt"))
            if start and end:
                durations.append(max(0.0, (end - start).total_seconds()))
    finished = counts["COMPLETED"] + counts["FAILED"] + counts["DEAD"]
    return {
        "total": len(jobs),
        "completed": counts["COMPLETED"],
        "failed": counts["FAILED"],
        "dead": counts["DEAD"],
        "waiting": counts["WAITING"],
        "unfinished": len(jobs) - finished,
        "jobs_per_s": counts["COMPLETED"] / elapsed_s if elapsed_s > 0 else 0.0,
        "p50_s": _percentile(durations, 0.50),
        "p95_s": _percentile(durations, 0.95),
        "elapsed_s": elapsed_s,
    }


class _Tracker:
    """Reads this run's jobs through the catalog (``list-jobs``) and counts statuses."""

    def __init__(self, catalog: Any, job_ids: set[str]) -> None:
        self.catalog = catalog
        self.job_ids = job_ids
        self.jobs: dict[str, dict[str, Any]] = {}

    def refresh(self) -> dict[str, int]:
        missing = set(self.job_ids)
        offset = 0
        while missing:
            answer = self.catalog.execute(
                "list-jobs", {"workflowName": WORKFLOW_NAME, "limit": 500, "offset": offset}
            )
            page = answer.get("jobs", [])
            for job in page:
                if job.get("jobId") in missing:
                    self.jobs[job["jobId"]] = job
                    missing.discard(job["jobId"])
            if len(page) < 500:
                break
            offset += 500
        counts = {s: 0 for s in ("QUEUED", "RUNNING", "WAITING", "COMPLETED", "FAILED", "DEAD")}
        for job in self.jobs.values():
            counts[job.get("status", "QUEUED")] = counts.get(job.get("status", "QUEUED"), 0) + 1
        return counts


def _complete_command(url: str, job_id: str) -> str:
    payload = json.dumps(
        {
            "jobId": job_id,
            "stepName": "review",
            "response": {"approved": True, "note": "looks good"},
        }
    )
    return f"protomolt-jobs call complete-step '{payload}' --url {url}"


def run_demo(
    *,
    path: Path | None = None,
    approve_all: bool = False,
    data_dir: Path | None = None,
    workers: int = 4,
    timeout_s: float = 600.0,
    http_port: int = 0,
    console: Any = None,
) -> int:
    """Run the demo (see the module docstring); returns the exit code.

    :param path: a file or directory of documents; None: the shipped samples.
    :param approve_all: complete every parked review with ``{"approved": true}``.
    :param data_dir: the node's data directory; None: ``$PROTOMOLT_NODE_DATA_DIR`` or
        ``./.protomolt-data``.
    :param workers: worker claim loops (``jobs.worker_count``) unless the environment sets it.
    :param timeout_s: give up waiting after this many seconds.
    :param http_port: actions route port (0: a free port).
    :param console: a ``rich.console.Console`` (tests pass a recording one).
    """
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
    from rich.table import Table

    from protomolt_jobs.config import ConfigError
    from protomolt_jobs.hooks.contract import ComposerError, WorkflowRepository
    from protomolt_jobs.host.cli import STOP_SIGNALS, load_config, start_surfaces
    from protomolt_jobs.host.composer import compose
    from protomolt_jobs.host.demo_services import DemoServices, demo_workflow
    from protomolt_jobs.host.embedded_pg import EmbeddedPostgresError

    console = console or Console()
    source = Path(path) if path is not None else samples_dir()
    if not source.exists():
        console.print(f"[red]no such file or directory: {source}[/]")
        return 2
    collected = collect_documents(source)
    for name, reason in collected.skipped:
        console.print(f"[yellow]skipped[/] {name}: {reason}", soft_wrap=True)
    for name in collected.truncated:
        console.print(f"[yellow]truncated[/] {name} to its first MiB (the parser's limit)")
    if not collected.documents:
        console.print(f"[red]no .txt or .md documents under {source}[/]")
        return 2

    environ = dict(os.environ)
    environ["PROTOMOLT_ROLES"] = "registry,parse,jobs"
    if data_dir is not None:
        environ["PROTOMOLT_NODE_DATA_DIR"] = str(Path(data_dir).expanduser().resolve())
    environ["PROTOMOLT_NODE_HTTP_PORT"] = str(http_port)
    environ["PROTOMOLT_NODE_GRPC_PORT"] = "0"
    environ.setdefault("PROTOMOLT_JOBS_WORKER_COUNT", str(workers))
    try:
        config, embedded, notes = load_config(None, environ)
    except ConfigError as exc:
        console.print(f"[red]configuration error:[/] {exc}")
        return 2
    except EmbeddedPostgresError as exc:
        console.print(f"[red]error:[/] {exc}", soft_wrap=True)
        return 1
    for note in notes:
        console.print(note, soft_wrap=True)

    stop = threading.Event()
    previous = (
        # SIGHUP too: closing the terminal stops the demo and its embedded PostgreSQL.
        {sig: signal.signal(sig, lambda *_: stop.set()) for sig in STOP_SIGNALS}
        if threading.current_thread() is threading.main_thread()
        else {}
    )
    services = None
    surfaces = None
    repository = None
    try:
        try:
            services = DemoServices().start()
            surfaces = start_surfaces(compose(config), config, embedded=embedded)
        except (ComposerError, OSError, RuntimeError) as exc:
            # A busy port, an unreachable database: one line, no traceback.
            console.print(f"[red]error:[/] the demo node did not start: {exc}", soft_wrap=True)
            return 1
        node = surfaces.node
        repository = node.contributions.first(WorkflowRepository)
        repository.put(WORKFLOW_NAME, demo_workflow(services.target))
        console.print(f"data dir: {config.data_dir}")
        console.print(f"actions route: {surfaces.actions_url}")
        console.print(f"demo services (tokenize, embed, review): {services.target}")

        started = time.monotonic()
        job_ids: list[str] = []
        for doc in collected.documents:
            job_id = str(uuid.uuid4())
            answer = node.catalog.execute(
                "submit-workflow",
                {
                    "workflowName": WORKFLOW_NAME,
                    "jobId": job_id,
                    "input": {"text": doc.text, "name": doc.name, "mimeType": doc.mime_type},
                },
            )
            if not answer.get("ok"):
                console.print(f"[red]submit refused[/] {doc.name}: {answer.get('error')}")
                continue
            job_ids.append(job_id)
        console.print(f"submitted {len(job_ids)} jobs ({WORKFLOW_NAME})")
        tracker = _Tracker(node.catalog, set(job_ids))
        approved: set[str] = set()
        told = False
        interrupted = timed_out = False
        columns = (
            TextColumn("[bold]jobs[/]"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[counts]}"),
            TimeElapsedColumn(),
        )
        with Progress(*columns, console=console, transient=False) as progress:
            task = progress.add_task("jobs", total=len(job_ids), counts="")
            while True:
                counts = tracker.refresh()
                text = "  ".join(
                    f"{s} {counts[s]}"
                    for s in ("QUEUED", "RUNNING", "WAITING", "COMPLETED", "FAILED", "DEAD")
                    if counts[s] or s in ("QUEUED", "RUNNING", "WAITING", "COMPLETED")
                )
                done = counts["COMPLETED"] + counts["FAILED"] + counts["DEAD"]
                progress.update(task, completed=done, counts=text)
                if done >= len(job_ids):
                    break
                waiting = [
                    j
                    for j, job in tracker.jobs.items()
                    if job.get("status") == "WAITING" and job.get("outstandingStep") == "review"
                ]
                if approve_all:
                    for job_id in waiting:
                        if job_id in approved:
                            continue
                        node.catalog.execute(
                            "complete-step",
                            {
                                "jobId": job_id,
                                "stepName": "review",
                                "response": {
                                    "approved": True,
                                    "note": "approved by protomolt-jobs demo --approve-all",
                                },
                            },
                        )
                        approved.add(job_id)
                elif waiting and not told and counts["QUEUED"] + counts["RUNNING"] == 0:
                    told = True
                    # soft_wrap: the command must stay one line to be copied and pasted.
                    progress.console.print(
                        f"\n{len(waiting)} jobs are parked on the external 'review' step. "
                        "Complete one with:\n\n  "
                        + _complete_command(surfaces.http.url, waiting[0])
                        + "\n\nor rerun with --approve-all. This demo keeps serving until every "
                        "job finishes; Ctrl-C stops it (parked jobs stay WAITING).\n",
                        soft_wrap=True,
                        highlight=False,
                        markup=False,
                    )
                if stop.wait(0.25):
                    interrupted = True
                    break
                if time.monotonic() - started > timeout_s:
                    timed_out = True
                    break
        tracker.refresh()
        result = summarize(tracker.jobs, time.monotonic() - started)
        table = Table(title="demo summary", show_header=False)
        table.add_column("what")
        table.add_column("value", justify="right")
        for label, key in (
            ("jobs", "total"),
            ("completed", "completed"),
            ("failed", "failed"),
            ("dead", "dead"),
            ("still waiting", "waiting"),
        ):
            table.add_row(label, str(result[key]))
        table.add_row("jobs per second", f"{result['jobs_per_s']:.2f}")
        table.add_row("p50 time to complete", f"{result['p50_s']:.2f} s")
        table.add_row("p95 time to complete", f"{result['p95_s']:.2f} s")
        table.add_row("wall time", f"{result['elapsed_s']:.2f} s")
        console.print(table)
        for job in tracker.jobs.values():
            if job.get("status") in ("FAILED", "DEAD"):
                console.print(
                    f"[red]{job['status']}[/] {job['jobId']}: {job.get('error', '')[:200]}"
                )
        if timed_out:
            console.print(f"[red]timed out after {timeout_s:.0f} s[/]")
        if interrupted:
            console.print("interrupted")
        ok = result["completed"] == result["total"]
        return 0 if ok else 1
    finally:
        if repository is not None and hasattr(repository, "remove"):
            # The demo's workflow names this run's services on ephemeral ports: left in the
            # registry, a later `serve` would offer a workflow that can only fail.
            try:
                repository.remove(WORKFLOW_NAME)
            except OSError:
                log.warning("could not remove the demo workflow", exc_info=True)
        if surfaces is not None:
            surfaces.close()
        elif embedded is not None:
            embedded.stop()
        if services is not None:
            services.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
