"""``protomolt-jobs demo``: one durable job per document, start to finish, on one machine.

What it does:

1. Boots a node with the ``registry``, ``parse`` and ``jobs`` roles in the data directory
   (``--data-dir``, else ``$PROTOMOLT_NODE_DATA_DIR``, else ``./.protomolt-data``). With no
   ``jobs.dsn`` configured the jobs live in the embedded PostgreSQL under ``<data_dir>/pg``;
   a second run reuses it.
2. Starts the demo's tokenize/embed/review gRPC services on a loopback port and stores the
   ``demo-document`` workflow: parse (in-process) -> tokenize -> embed -> review, the review
   being an external step the job parks on.
3. Scans PATH (default: the shipped samples) and submits one job per text file, judged by
   content, not by name: plain text, Markdown, HTML (reduced to its text) and gzip-compressed
   text (decompressed). Binary files are skipped; text over 1 MiB is cut to its first MiB
   (the parser's limit); a file that is not UTF-8 is read as Latin-1, with a warning.
4. Shows progress while it scans, submits and runs: a live bar on a terminal, one plain line
   every few seconds otherwise (a pipe, a log file, CI). It completes parked reviews itself
   with ``--approve-all``; otherwise it prints the exact ``complete-step`` command (and the
   dashboard's inbox) and keeps serving until every job is finished (Ctrl-C stops it; parked
   jobs stay WAITING in the database). The node listens on port 8081, or the next free port,
   and says which.
5. Ends with a summary: completed, failed, dead, still waiting, jobs per second, and the p50 /
   p95 time from submit to completion, split into queue wait (submit to the first step's
   checkpoint) and run time (from there to completion).

Exit code: 0 when every job completed; 1 when any failed or went dead, the run timed out or
was interrupted with jobs unfinished; 2 for a PATH with no documents.
"""

from __future__ import annotations

import gzip
import html.parser
import json
import logging
import os
import signal
import socket
import threading
import time
import uuid
import zlib
from dataclasses import dataclass, field
from datetime import datetime
from importlib import resources
from pathlib import Path
from typing import Any, Self

__all__ = [
    "WORKFLOW_NAME",
    "collect_documents",
    "html_to_text",
    "read_document",
    "run_demo",
    "summarize",
]

log = logging.getLogger("protomolt_jobs.demo")

WORKFLOW_NAME = "demo-document"
_TERMINAL = ("COMPLETED", "FAILED", "DEAD")
_MAX_BYTES = 1024 * 1024
#: Bytes read from a file (more than the parser takes, so cutting is noticed).
_MAX_READ_BYTES = 4 * _MAX_BYTES
#: Bytes a gzip file may decompress to (a bomb stops here).
_MAX_GZIP_BYTES = 4 * _MAX_BYTES
PLAIN, MARKDOWN = "text/plain", "text/markdown"
#: The demo's HTTP port when it is free (else the next free one): the CLI's default --url.
DEFAULT_PORT = 8081
#: complete-step calls (made by :data:`_SUBMITTERS` threads) between two progress updates.
_APPROVE_BATCH = 100
#: Jobs whose events are read to split the time to complete (evenly sampled).
_SPLIT_SAMPLE = 1000
#: Threads submitting documents and approving reviews.
_SUBMITTERS = 8


@dataclass
class Document:
    """One document to submit."""

    name: str
    text: str
    mime_type: str


@dataclass
class Collected:
    """What :func:`collect_documents` found.

    :ivar documents: the documents to submit, sorted by path.
    :ivar skipped: ``(name, reason)`` of each file that is not text.
    :ivar truncated: names of documents cut to their first MiB.
    :ivar latin1: names of files that were not UTF-8 and were read as Latin-1.
    :ivar scanned: files looked at.
    """

    documents: list[Document] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)
    truncated: list[str] = field(default_factory=list)
    latin1: list[str] = field(default_factory=list)
    scanned: int = 0


def samples_dir() -> Path:
    """The sample documents shipped with the package."""
    return Path(str(resources.files("protomolt_jobs.host") / "samples"))


class _HtmlText(html.parser.HTMLParser):
    """The readable text of an HTML page: no tags, scripts or styles; blocks on new lines."""

    _SKIP = frozenset({"script", "style", "head", "noscript", "template"})
    _BLOCK = frozenset(
        {
            "p",
            "div",
            "br",
            "li",
            "tr",
            "h1",
            "h2",
            "h3",
            "h4",
            "h5",
            "h6",
            "pre",
            "section",
            "article",
            "table",
            "ul",
            "ol",
            "dd",
            "dt",
            "blockquote",
            "title",
            "header",
            "footer",
        }
    )

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self._skipping = 0

    def handle_starttag(self, tag: str, attrs: Any) -> None:
        if tag in self._SKIP:
            self._skipping += 1
        elif tag in self._BLOCK:
            self.parts.append("\n")

    def handle_endtag(self, tag: str) -> None:
        if tag in self._SKIP and self._skipping:
            self._skipping -= 1
        elif tag in self._BLOCK:
            self.parts.append("\n")

    def handle_data(self, data: str) -> None:
        if not self._skipping:
            self.parts.append(data)

    def text(self) -> str:
        lines = (" ".join(line.split()) for line in "".join(self.parts).splitlines())
        return "\n".join(line for line in lines if line).strip()


def html_to_text(markup: str) -> str:
    """The readable text of an HTML document (tags, scripts and styles removed)."""
    parser = _HtmlText()
    parser.feed(markup)
    parser.close()
    return parser.text()


def _looks_like_html(text: str) -> bool:
    head = text[:2048].lstrip().lower()
    return head.startswith(("<!doctype html", "<html")) or (
        "<html" in head and "<body" in text[:65536].lower()
    )


def _is_binary(raw: bytes) -> bool:
    """NUL bytes, or many control characters in the first 8 KiB (not text in any encoding)."""
    sample = raw[:8192]
    if b"\x00" in sample:
        return True
    if not sample:
        return False
    controls = sum(1 for b in sample if b < 32 and b not in (9, 10, 12, 13, 27))
    return controls / len(sample) > 0.10


def read_document(file: Path) -> tuple[str | None, str, bool]:
    """Read one file as text, by its content (the name does not matter).

    gzip-compressed files are decompressed (at most :data:`_MAX_GZIP_BYTES`); HTML is reduced
    to its text; UTF-8 is tried first, anything else is read as Latin-1.

    :returns: ``(text, mime_type, read_as_latin1)``; ``text`` is None for a file that is not
        text, and ``mime_type`` is then the reason.
    :raises OSError: the file cannot be read.
    """
    with file.open("rb") as fh:
        raw = fh.read(_MAX_READ_BYTES)
    if raw[:2] == b"\x1f\x8b":
        try:
            with gzip.open(file, "rb") as fh:
                raw = fh.read(_MAX_GZIP_BYTES)
        except (OSError, EOFError, zlib.error) as exc:
            return None, f"a damaged gzip file: {exc}", False
    if _is_binary(raw):
        return None, "binary (not text)", False
    latin1 = False
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        text, latin1 = raw.decode("latin-1"), True
    if _looks_like_html(text):
        return html_to_text(text), PLAIN, latin1
    name = file.name.lower().removesuffix(".gz")
    mime = MARKDOWN if name.endswith((".md", ".markdown")) else PLAIN
    return text, mime, latin1


def collect_documents(path: Path, on_file: Any = None) -> Collected:
    """Every text file at or under ``path`` (by content: plain text, Markdown, HTML, gzip'ed
    text), sorted by path.

    :param path: a file or a directory (searched recursively).
    :param on_file: called as ``on_file(collected)`` after each file (progress).
    :returns: documents to submit (text over 1 MiB cut to its first MiB, listed in
        ``truncated``; non-UTF-8 files read as Latin-1, listed in ``latin1``) and
        ``(name, reason)`` for each skipped file.
    """
    path = Path(path)
    candidates = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    found = Collected()
    for file in candidates:
        found.scanned += 1
        name = file.name if file == path else file.relative_to(path).as_posix()
        try:
            text, mime, latin1 = read_document(file)
        except OSError as exc:
            found.skipped.append((name, f"unreadable: {exc}"))
            text = None
        if text is None:
            if not found.skipped or found.skipped[-1][0] != name:
                found.skipped.append((name, mime))
        elif not text.strip():
            found.skipped.append((name, "empty"))
        else:
            if latin1:
                found.latin1.append(name)
            if len(text.encode("utf-8")) > _MAX_BYTES:
                # The parser refuses more than 1 MiB: submit the first MiB rather than nothing.
                text = text.encode("utf-8")[:_MAX_BYTES].decode("utf-8", errors="ignore")
                found.truncated.append(name)
            found.documents.append(Document(name, text, mime))
        if on_file is not None:
            on_file(found)
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


def summarize(
    jobs: dict[str, dict[str, Any]],
    elapsed_s: float,
    started_at: dict[str, datetime] | None = None,
) -> dict[str, Any]:
    """Counts and timings of a demo run.

    :param jobs: job id -> the latest job document (list-jobs summary shape).
    :param elapsed_s: seconds from the first submit to the end of the run.
    :param started_at: job id -> when its first step finished (its first event after
        ACCEPTED, database time): splits the time to complete into queue wait (submit to
        first step) and run time (first step to completion, the review's wait included).
    :returns: ``{total, completed, failed, dead, waiting, unfinished, jobs_per_s, p50_s, p95_s,
        queue_p50_s, queue_p95_s, run_p50_s, run_p95_s, elapsed_s}``.
    """
    counts = {s: 0 for s in ("COMPLETED", "FAILED", "DEAD", "WAITING")}
    durations: list[float] = []
    queued: list[float] = []
    running: list[float] = []
    for job_id, job in jobs.items():
        status = job.get("status", "")
        if status in counts:
            counts[status] += 1
        if status == "COMPLETED":
            start, end = _instant(job.get("createdAt")), _instant(job.get("completedAt"))
            if start and end:
                durations.append(max(0.0, (end - start).total_seconds()))
                first = (started_at or {}).get(job_id)
                if first is not None:
                    queued.append(max(0.0, (first - start).total_seconds()))
                    running.append(max(0.0, (end - first).total_seconds()))
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
        "queue_p50_s": _percentile(queued, 0.50),
        "queue_p95_s": _percentile(queued, 0.95),
        "run_p50_s": _percentile(running, 0.50),
        "run_p95_s": _percentile(running, 0.95),
        "elapsed_s": elapsed_s,
    }


def first_step_times(inspector: Any, job_ids: list[str]) -> dict[str, datetime]:
    """When each job's first step finished: its first event after ACCEPTED (database time),
    for at most :data:`_SPLIT_SAMPLE` jobs evenly spread over ``job_ids``."""
    out: dict[str, datetime] = {}
    if inspector is None:
        return out
    # A sample is enough for percentiles, and keeps a 5,000-job run's summary quick.
    step = max(1, len(job_ids) // _SPLIT_SAMPLE)
    for job_id in job_ids[::step]:
        try:
            events = inspector.events(job_id)
        except Exception:  # the split is a nicety; the summary still prints
            log.debug("events of %s unavailable", job_id, exc_info=True)
            continue
        for event in events:
            if event.event_type != "ACCEPTED":
                at = _instant(event.detail.get("occurredAt")) or _instant(event.created_at)
                if at is not None:
                    out[job_id] = at
                break
    return out


class Reporter:
    """Progress of the demo's phases: a live bar on a terminal; without one (a pipe, a log
    file, CI) one plain line at the start, then every :attr:`interval_s` seconds, then at the
    end, so a reader of the log sees it move.

    :param console: a ``rich.console.Console``.
    :param interval_s: seconds between plain lines without a terminal.
    """

    def __init__(self, console: Any, interval_s: float = 2.0) -> None:
        self.console = console
        self.interval_s = interval_s
        self.terminal = bool(console.is_terminal)
        self._progress: Any = None
        self._task: Any = None
        self._label = ""
        self._total = 0
        self._last = 0.0

    def __enter__(self) -> Self:
        if self.terminal:
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
            )

            self._progress = Progress(
                TextColumn("[bold]{task.description}[/]"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.fields[note]}"),
                TimeElapsedColumn(),
                console=self.console,
                transient=False,
                refresh_per_second=8,
            )
            self._progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._progress is not None:
            self._progress.stop()

    def print(self, *args: Any, **kw: Any) -> None:
        """Print above the bar (or as a plain line)."""
        target = self._progress.console if self._progress is not None else self.console
        target.print(*args, **kw)

    def phase(self, label: str, total: int | None) -> None:
        """Start a phase: ``label`` with ``total`` steps (None: unknown, e.g. while scanning)."""
        self._label, self._total, self._last = label, total or 0, time.monotonic()
        if self._progress is not None:
            self._task = self._progress.add_task(label, total=total, note="")
        else:
            self.console.print(f"{label}: started", highlight=False)

    def update(self, completed: int, note: str = "", *, final: bool = False) -> None:
        """Move the current phase to ``completed``; ``final`` closes it."""
        if self._progress is not None:
            if final and not self._total:
                self._progress.update(self._task, total=completed)
            self._progress.update(self._task, completed=completed, note=note)
            return
        now = time.monotonic()
        if final or now - self._last >= self.interval_s:
            self._last = now
            of = f"/{self._total}" if self._total else ""
            tail = f" ({note})" if note else ""
            done = " done" if final else ""
            self.console.print(
                f"{self._label}: {completed}{of}{done}{tail}", highlight=False, soft_wrap=True
            )


def pick_port(host: str = "127.0.0.1", first: int = DEFAULT_PORT, tries: int = 100) -> int:
    """``first``, or the next port after it that is free on ``host`` (0 when none is)."""
    for port in range(first, first + tries):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind((host, port))
            except OSError:
                continue
            return port
    return 0


class _Tracker:
    """Follows this run's jobs and counts statuses: through the jobs role's inspector (status
    columns only, 1000 ids a query), else the catalog's ``list-jobs``."""

    #: Job ids per status query.
    CHUNK = 1000

    def __init__(self, catalog: Any, job_ids: set[str], inspector: Any = None) -> None:
        self.catalog = catalog
        self.job_ids = job_ids
        self.inspector = inspector
        self.jobs: dict[str, dict[str, Any]] = {}

    def _read_all(self) -> None:
        if self.inspector is not None:
            ids = sorted(self.job_ids)
            for i in range(0, len(ids), self.CHUNK):
                for job in self.inspector.statuses(ids[i : i + self.CHUNK]):
                    self.jobs[job["jobId"]] = job
            return
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

    def refresh(self) -> dict[str, int]:
        self._read_all()
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
    http_port: int | None = None,
    console: Any = None,
    progress_interval_s: float = 2.0,
) -> int:
    """Run the demo (see the module docstring); returns the exit code.

    :param path: a file or directory of documents; None: the shipped samples.
    :param approve_all: complete every parked review with ``{"approved": true}``.
    :param data_dir: the node's data directory; None: ``$PROTOMOLT_NODE_DATA_DIR`` or
        ``./.protomolt-data``.
    :param workers: worker claim loops (``jobs.worker_count``) unless the environment sets it.
    :param timeout_s: give up waiting after this many seconds.
    :param http_port: actions route port; None: 8081, or the next free port (0: any free port).
    :param console: a ``rich.console.Console`` (tests pass a recording one).
    :param progress_interval_s: seconds between progress lines when not on a terminal.
    """
    from concurrent.futures import ThreadPoolExecutor

    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    from protomolt_jobs.config import ConfigError
    from protomolt_jobs.hooks.contract import ComposerError, JobViews, WorkflowRepository
    from protomolt_jobs.host.boot import STOP_SIGNALS, load_config, start_surfaces
    from protomolt_jobs.host.composer import compose
    from protomolt_jobs.host.demo_services import DemoServices, demo_workflow
    from protomolt_jobs.host.embedded_pg import EmbeddedPostgresError

    console = console or Console()
    source = Path(path) if path is not None else samples_dir()
    if not source.exists():
        console.print(f"[red]no such file or directory: {escape(str(source))}[/]")
        return 2
    reporter = Reporter(console, progress_interval_s)
    with reporter:
        reporter.phase("scanning", None)
        collected = collect_documents(
            source,
            on_file=lambda found: reporter.update(
                found.scanned, f"{len(found.documents)} text files"
            ),
        )
        reporter.update(collected.scanned, f"{len(collected.documents)} text files", final=True)
    for name, reason in collected.skipped:
        console.print(f"[yellow]skipped[/] {escape(name)}: {escape(reason)}", soft_wrap=True)
    for name in collected.truncated:
        console.print(f"[yellow]truncated[/] {escape(name)} to its first MiB (the parser's limit)")
    for name in collected.latin1:
        console.print(
            f"[yellow]warning[/] {escape(name)} is not UTF-8: read as Latin-1 (check its characters)",
            soft_wrap=True,
        )
    if not collected.documents:
        console.print(f"[red]no text files under {escape(str(source))}[/]")
        return 2

    port = pick_port() if http_port is None else http_port
    environ = dict(os.environ)
    environ["PROTOMOLT_ROLES"] = "registry,parse,jobs"
    if data_dir is not None:
        environ["PROTOMOLT_NODE_DATA_DIR"] = str(Path(data_dir).expanduser().resolve())
    environ["PROTOMOLT_NODE_HTTP_PORT"] = str(port)
    environ["PROTOMOLT_NODE_GRPC_PORT"] = "0"
    environ.setdefault("PROTOMOLT_JOBS_WORKER_COUNT", str(workers))
    try:
        config, embedded, notes = load_config(None, environ)
    except ConfigError as exc:
        console.print(f"[red]configuration error:[/] {escape(str(exc))}")
        return 2
    except EmbeddedPostgresError as exc:
        console.print(f"[red]error:[/] {escape(str(exc))}", soft_wrap=True)
        return 1
    for note in notes:
        console.print(note, soft_wrap=True, markup=False)

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
    approvers: Any = None
    try:
        try:
            services = DemoServices().start()
            surfaces = start_surfaces(compose(config), config, embedded=embedded)
        except (ComposerError, OSError, RuntimeError) as exc:
            # A busy port, an unreachable database: one line, no traceback.
            console.print(
                f"[red]error:[/] the demo node did not start: {escape(str(exc))}", soft_wrap=True
            )
            return 1
        node = surfaces.node
        repository = node.contributions.first(WorkflowRepository)
        repository.put(WORKFLOW_NAME, demo_workflow(services.target))
        url = surfaces.http.url
        console.print(f"data dir: {config.data_dir}", markup=False)
        console.print(f"actions route: {surfaces.actions_url}")
        console.print(f"dashboard: {url}/ui/   metrics: {url}/metrics")
        if http_port is None and surfaces.http.port != DEFAULT_PORT:
            console.print(
                f"port {DEFAULT_PORT} is busy: use --url {url} with the protomolt-jobs commands"
            )
        console.print(f"demo services (tokenize, embed, review): {services.target}")

        started = time.monotonic()
        job_ids: list[str] = []
        refused: list[tuple[str, str]] = []

        def submit(doc: Document) -> tuple[Document, str, dict[str, Any]]:
            job_id = str(uuid.uuid4())
            answer = node.catalog.execute(
                "submit-workflow",
                {
                    "workflowName": WORKFLOW_NAME,
                    "jobId": job_id,
                    "input": {"text": doc.text, "name": doc.name, "mimeType": doc.mime_type},
                },
            )
            return doc, job_id, answer

        inspector = node.contributions.first(JobViews)
        tracker = _Tracker(node.catalog, set(), inspector)

        def approve(job_id: str) -> None:
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

        approvers = ThreadPoolExecutor(max_workers=_SUBMITTERS, thread_name_prefix="demo-approve")
        approved: set[str] = set()
        told = False
        interrupted = timed_out = False
        with reporter:
            reporter.phase("submitting", len(collected.documents))
            with ThreadPoolExecutor(max_workers=_SUBMITTERS) as pool:
                for n, (doc, job_id, answer) in enumerate(
                    pool.map(submit, collected.documents), start=1
                ):
                    if answer.get("ok"):
                        job_ids.append(job_id)
                    else:
                        refused.append((doc.name, str(answer.get("error"))))
                    reporter.update(n, f"{len(job_ids)} accepted")
                    if stop.is_set():
                        break
            reporter.update(len(job_ids) + len(refused), f"{len(job_ids)} accepted", final=True)
            for name, error in refused:
                reporter.print(
                    f"[red]submit refused[/] {escape(name)}: {escape(error)}", soft_wrap=True
                )
            tracker.job_ids = set(job_ids)
            reporter.phase("jobs", len(job_ids))

            def show(counts: dict[str, int]) -> int:
                text = "  ".join(
                    f"{s} {counts[s]}"
                    for s in ("QUEUED", "RUNNING", "WAITING", "COMPLETED", "FAILED", "DEAD")
                    if counts[s] or s in ("QUEUED", "RUNNING", "WAITING", "COMPLETED")
                )
                done = counts["COMPLETED"] + counts["FAILED"] + counts["DEAD"]
                reporter.update(done, text)
                return done

            while not stop.is_set():
                counts = tracker.refresh()
                done = show(counts)
                if done >= len(job_ids):
                    break
                waiting = [
                    j
                    for j, job in tracker.jobs.items()
                    if job.get("status") == "WAITING"
                    and job.get("outstandingStep") == "review"
                    and j not in approved
                ]
                if approve_all:
                    for i in range(0, len(waiting), _APPROVE_BATCH):
                        batch = waiting[i : i + _APPROVE_BATCH]
                        list(approvers.map(approve, batch))
                        approved.update(batch)
                        if stop.is_set():
                            break
                        if i + _APPROVE_BATCH < len(waiting):
                            # Keep the bar moving while a long inbox is approved.
                            show(tracker.refresh())
                elif waiting and not told and counts["QUEUED"] + counts["RUNNING"] == 0:
                    told = True
                    # soft_wrap: the command must stay one line to be copied and pasted.
                    reporter.print(
                        f"\n{len(waiting)} jobs are parked on the external 'review' step. "
                        f"Complete them in the dashboard ({url}/ui/inbox) or with:\n\n  "
                        + _complete_command(url, waiting[0])
                        + "\n\nor rerun with --approve-all. This demo keeps serving until every "
                        "job finishes; Ctrl-C stops it (parked jobs stay WAITING).\n",
                        soft_wrap=True,
                        highlight=False,
                        markup=False,
                    )
                if stop.wait(0.25):
                    break
                if time.monotonic() - started > timeout_s:
                    timed_out = True
                    break
            interrupted = stop.is_set()
            counts = tracker.refresh()
            finished = counts["COMPLETED"] + counts["FAILED"] + counts["DEAD"]
            if finished >= len(job_ids):
                # The last approvals finished the run just as the time ran out.
                timed_out = interrupted = False
            reporter.update(
                finished,
                "  ".join(f"{k} {v}" for k, v in counts.items() if v),
                final=True,
            )
        elapsed = time.monotonic() - started
        first = first_step_times(inspector, job_ids)
        result = summarize(tracker.jobs, elapsed, first)
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
        table.add_row("p50 queue wait", f"{result['queue_p50_s']:.2f} s")
        table.add_row("p95 queue wait", f"{result['queue_p95_s']:.2f} s")
        table.add_row("p50 run time", f"{result['run_p50_s']:.2f} s")
        table.add_row("p95 run time", f"{result['run_p95_s']:.2f} s")
        table.add_row("wall time", f"{result['elapsed_s']:.2f} s")
        console.print(table)
        console.print(
            "queue wait: submit to the first step's checkpoint; run time: from there to "
            "completion (the review's wait included)",
            highlight=False,
        )
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
        if approvers is not None:
            approvers.shutdown(wait=True, cancel_futures=True)
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
