"""``protomolt-jobs demo`` on real text files, on the embedded PostgreSQL, run twice."""

from __future__ import annotations

import gzip
import io
import json
import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console

from protomolt_jobs.host.demo import (
    DEFAULT_PORT,
    collect_documents,
    pick_port,
    run_demo,
    samples_dir,
    summarize,
)
from protomolt_jobs.host.demo_services import demo_workflow


def _console() -> Console:
    return Console(file=io.StringIO(), width=200, record=True, color_system=None)


def _copyright_files(dest: Path, n: int) -> int:
    dest.mkdir()
    copied = 0
    for src in sorted(Path("/usr/share/doc").glob("*/copyright")):
        if copied == n:
            break
        if src.is_file() and src.stat().st_size < 512 * 1024:
            shutil.copyfile(src, dest / f"{src.parent.name}.txt")  # a file, not a symlink
            copied += 1
    return copied


def _summary(text: str) -> dict[str, str]:
    rows = re.findall(r"│ ([a-z0-9 ]+?)\s+│\s+([\d.]+(?: s)?) │", text)
    return dict(rows)


@pytest.fixture
def documents(tmp_path):
    docs = tmp_path / "docs"
    count = _copyright_files(docs, 20)
    if count < 20:
        # Fall back to the shipped samples, copied under many names, on a machine with few docs.
        for i, sample in enumerate(sorted(samples_dir().glob("*.*")) * 5):
            if count >= 20:
                break
            shutil.copyfile(sample, docs / f"sample-{i}{sample.suffix}")
            count += 1
    return docs, count


def test_demo_completes_every_job_and_reuses_the_embedded_database(
    tmp_path, documents, open_data_dir
):
    docs, count = documents
    data = open_data_dir / "data"
    first = _console()
    assert run_demo(path=docs, approve_all=True, data_dir=data, timeout_s=240, console=first) == 0
    text = first.export_text()
    assert "embedded PostgreSQL" in text and "first run" in text
    summary = _summary(text)
    assert summary["jobs"] == str(count)
    assert summary["completed"] == str(count)
    assert summary["failed"] == summary["dead"] == summary["still waiting"] == "0"
    assert float(summary["jobs per second"]) > 0
    assert float(summary["p95 time to complete"].split()[0]) >= float(
        summary["p50 time to complete"].split()[0]
    )
    shape = demo_workflow("127.0.0.1:1")
    assert [s["name"] for s in shape["steps"]] == ["parse", "tokenize", "embed", "review"]
    assert shape["steps"][3]["completion"] == "external"
    # The demo's workflow names this run's ephemeral ports: it leaves the registry with the
    # demo, while the parse role's own workflows stay for `serve`.
    stored = sorted(p.name for p in (data / "workflows").glob("*.json"))
    assert stored == ["parse-document.json", "review-document.json"]

    second = _console()
    assert run_demo(path=docs, approve_all=True, data_dir=data, timeout_s=240, console=second) == 0
    text = second.export_text()
    assert "first run" not in text
    assert _summary(text)["completed"] == str(count)


def test_demo_without_approve_all_parks_and_prints_the_complete_step_command(
    tmp_path, fresh_dsn, monkeypatch
):
    # A database of the test's own: the embedded one is the first test's subject.
    monkeypatch.setenv("PROTOMOLT_JOBS_DSN", fresh_dsn)
    console = _console()
    code = run_demo(
        path=samples_dir() / "leases.md",
        data_dir=tmp_path / "data",
        timeout_s=8,
        console=console,
    )
    text = console.export_text()
    assert code == 1
    command = re.search(r"protomolt-jobs call complete-step '(\{.*\})' --url http://\S+", text)
    assert command, text
    envelope = json.loads(command.group(1))
    assert envelope["stepName"] == "review" and envelope["response"]["approved"] is True
    assert _summary(text)["still waiting"] == "1"


def test_collect_documents_reads_text_by_content(tmp_path):
    (tmp_path / "a.txt").write_text("hello")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b.md").write_text("# B")
    (tmp_path / "c.bin").write_bytes(b"\x00\x01")
    (tmp_path / "d.txt").write_bytes(b"bin\x00ary")
    (tmp_path / "e.md").write_bytes(b"x" * (1024 * 1024 + 1))
    (tmp_path / "f.txt").write_bytes("caf\u00e9".encode("latin-1"))
    (tmp_path / "README").write_text("no extension, plain text")
    (tmp_path / "changelog.gz").write_bytes(gzip.compress(b"version 1.0: first release"))
    (tmp_path / "page.html").write_text(
        "<!DOCTYPE html><html><head><title>T</title><style>p{}</style></head>"
        "<body><h1>Heading</h1><p>Some <b>bold</b> text.</p><script>x()</script></body></html>"
    )
    found = collect_documents(tmp_path)
    names = [d.name for d in found.documents]
    assert names == ["README", "a.txt", "changelog.gz", "e.md", "f.txt", "page.html", "sub/b.md"]
    by_name = {d.name: d for d in found.documents}
    assert by_name["sub/b.md"].mime_type == "text/markdown"
    assert by_name["README"].mime_type == "text/plain"
    assert by_name["changelog.gz"].text == "version 1.0: first release"
    assert by_name["page.html"].text == "Heading\nSome bold text."
    assert [name for name, _ in found.skipped] == ["c.bin", "d.txt"]
    assert found.truncated == ["e.md"]
    assert len(by_name["e.md"].text.encode()) == 1024 * 1024
    assert by_name["f.txt"].text == "caf\u00e9"
    assert found.latin1 == ["f.txt"]
    assert found.scanned == 9


def test_a_latin1_file_is_submitted_with_a_warning(tmp_path, fresh_dsn, monkeypatch):
    monkeypatch.setenv("PROTOMOLT_JOBS_DSN", fresh_dsn)
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "menu").write_bytes("caf\u00e9 cr\u00e8me br\u00fbl\u00e9e".encode("latin-1"))
    console = _console()
    code = run_demo(
        path=docs, approve_all=True, data_dir=tmp_path / "data", timeout_s=120, console=console
    )
    text = console.export_text()
    assert code == 0, text
    assert "menu is not UTF-8: read as Latin-1" in text


def test_no_documents_is_exit_2(tmp_path, open_data_dir):
    (tmp_path / "x.bin").write_bytes(b"\x00\x01")
    (tmp_path / "empty.txt").write_bytes(b"  \n")
    assert run_demo(path=tmp_path, data_dir=open_data_dir / "data", console=_console()) == 2


def test_summarize_counts_and_percentiles():
    jobs = {
        str(i): {
            "status": "COMPLETED",
            "createdAt": "2025-01-01T00:00:00Z",
            "completedAt": f"2025-01-01T00:00:{i:02d}Z",
        }
        for i in range(1, 11)
    }
    jobs["f"] = {"status": "FAILED"}
    jobs["w"] = {"status": "WAITING"}
    result = summarize(jobs, elapsed_s=5.0)
    assert (result["completed"], result["failed"], result["waiting"]) == (10, 1, 1)
    assert result["unfinished"] == 1
    assert result["jobs_per_s"] == 2.0
    assert result["p50_s"] == pytest.approx(5.5)
    assert result["p95_s"] == pytest.approx(9.55)


def _doc_files(dest: Path, n: int) -> int:
    """Copy ``n`` files of /usr/share/doc (gzip'ed changelogs, copyright texts, no suffix)."""
    dest.mkdir()
    copied = 0
    for src in sorted(Path("/usr/share/doc").glob("*/*")):
        if copied == n:
            break
        if src.is_file() and not src.is_symlink() and src.stat().st_size < 256 * 1024:
            shutil.copyfile(src, dest / f"{src.parent.name}-{src.name}")
            copied += 1
    for i, sample in enumerate(sorted(samples_dir().glob("*.*")) * n):
        if copied >= n:
            break
        shutil.copyfile(sample, dest / f"sample-{i}{sample.suffix}")
        copied += 1
    return copied


def test_demo_without_a_terminal_prints_progress_lines(tmp_path, fresh_dsn):
    """``protomolt-jobs demo DIR --approve-all`` with its output in a pipe: plain progress
    lines while it scans, submits and runs, then the summary with queue wait and run time."""
    docs = tmp_path / "docs"
    count = _doc_files(docs, 40)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PROTOMOLT_")}
    env["PROTOMOLT_JOBS_DSN"] = fresh_dsn
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "protomolt_jobs.host.cli",
            "demo",
            str(docs),
            "--approve-all",
            "--data-dir",
            str(tmp_path / "data"),
            "--http-port",
            "0",
            "--progress-interval",
            "0",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    out = done.stdout
    assert done.returncode == 0, out + done.stderr
    lines = out.splitlines()
    submitting = [
        int(m.group(1)) for m in map(re.compile(r"^submitting: (\d+)/").match, lines) if m
    ]
    running = [int(m.group(1)) for m in map(re.compile(r"^jobs: (\d+)/").match, lines) if m]
    assert "scanning: started" in lines
    # One line per submit, then the closing line.
    assert submitting == [*range(1, count + 1), count]
    # The run phase reported more than once, and moved.
    assert len(running) >= 2 and running[-1] == count and min(running) < count
    assert lines.index("submitting: started") < lines.index("jobs: started")
    summary = _summary(out)
    assert summary["completed"] == str(count)
    assert "p50 queue wait" in summary and "p95 run time" in summary


def test_demo_on_a_terminal_draws_moving_bars(tmp_path, fresh_dsn, monkeypatch):
    monkeypatch.setenv("PROTOMOLT_JOBS_DSN", fresh_dsn)
    docs = tmp_path / "docs"
    count = _doc_files(docs, 40)
    buffer = io.StringIO()
    console = Console(file=buffer, force_terminal=True, width=160, color_system=None)
    code = run_demo(
        path=docs,
        approve_all=True,
        data_dir=tmp_path / "data",
        timeout_s=240,
        console=console,
        http_port=0,
    )
    out = buffer.getvalue()
    assert code == 0, out
    frames = re.findall(r"(submitting|jobs)\s+\S*\s+(\d+)/(\d+)", out)
    submit = {int(done) for phase, done, _ in frames if phase == "submitting"}
    run = {int(done) for phase, done, _ in frames if phase == "jobs"}
    assert count in submit and count in run
    assert len(run) >= 2, "the run's bar never moved"


def test_the_demo_takes_port_8081_or_the_next_free_one():
    with socket.socket() as busy:
        try:
            busy.bind(("127.0.0.1", DEFAULT_PORT))
        except OSError:
            pass  # already taken by someone else: the same case
        busy.listen()
        assert pick_port() > DEFAULT_PORT
