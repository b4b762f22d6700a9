"""``protomolt-jobs demo`` on real text files, on the embedded PostgreSQL, run twice."""

from __future__ import annotations

import io
import json
import re
import shutil
from pathlib import Path

import pytest
from rich.console import Console

from protomolt_jobs.host.demo import (
    collect_documents,
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


def test_demo_completes_every_job_and_reuses_the_embedded_database(tmp_path, documents):
    docs, count = documents
    data = tmp_path / "data"
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


def test_demo_without_approve_all_parks_and_prints_the_complete_step_command(tmp_path):
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


def test_collect_documents_skips_what_the_parser_refuses(tmp_path):
    (tmp_path / "a.txt").write_text("hello")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b.md").write_text("# B")
    (tmp_path / "c.bin").write_bytes(b"\x00\x01")
    (tmp_path / "d.txt").write_bytes(b"bin\x00ary")
    (tmp_path / "e.md").write_bytes(b"x" * (1024 * 1024 + 1))
    (tmp_path / "f.txt").write_bytes("caf\u00e9".encode("latin-1"))
    found = collect_documents(tmp_path)
    assert [d.name for d in found.documents] == ["a.txt", "e.md", "f.txt", "sub/b.md"]
    assert [d.mime_type for d in found.documents] == [
        "text/plain",
        "text/markdown",
        "text/plain",
        "text/markdown",
    ]
    assert [name for name, _ in found.skipped] == ["d.txt"]
    assert found.truncated == ["e.md"]
    assert len(found.documents[1].text.encode()) == 1024 * 1024
    assert found.documents[2].text == "caf\ufffd"


def test_no_documents_is_exit_2(tmp_path):
    (tmp_path / "x.bin").write_bytes(b"1")
    assert run_demo(path=tmp_path, data_dir=tmp_path / "data", console=_console()) == 2


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
