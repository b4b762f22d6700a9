"""The CLI's list view without a node: compact times and the fitted table (issue 31)."""

from __future__ import annotations

import datetime

import pytest
from rich.console import Console

from protomolt_jobs.host.cli import _jobs_table, compact_time

NOW = datetime.datetime(2026, 12, 2, 10, 0, tzinfo=datetime.UTC)


@pytest.mark.parametrize(
    ("stamp", "shown"),
    [
        ("2026-12-02T09:58:07.120Z", "09:58:07"),
        ("2026-12-01T23:59:59Z", "12-01 23:59"),
        ("2025-12-02T09:58:07Z", "2025-12-02"),
        ("2026-12-02T11:30:00+01:00", "10:30:00"),
        ("", ""),
        (None, ""),
        ("not a time", "not a time"),
        ("2026-12-02T10:00:00", "2026-12-02T10:00:00"),
    ],
)
def test_compact_time(stamp, shown):
    assert compact_time(stamp, NOW) == shown


JOBS = [
    {
        "jobId": "3f9465f2-6c6d-41de-b331-71bcffc23cf2",
        "workflowName": "a-workflow-with-a-rather-long-name",
        "status": "RECOVERY_REQUIRED",
        "attempt": 3,
        "outstandingStep": "charge-the-customer-card",
        "updatedAt": "2026-11-02T10:04:10.120Z",
        "error": "GRPC: gRPC UNAVAILABLE from 127.0.0.1:9090: [model] loading\nsecond line",
    },
    {
        "jobId": "00000000-0000-0000-0000-000000000001",
        "workflowName": "s",
        "status": "COMPLETED",
        "attempt": 1,
        "updatedAt": "2025-11-02T10:04:10.120Z",
        "verdict": "3 steps, output jobs.test.Summary",
    },
]


@pytest.mark.parametrize("width", [60, 80, 100, 200])
def test_the_table_fits_the_width_one_line_per_job(width):
    console = Console(width=width, record=True, file=open("/dev/null", "w"))  # noqa: SIM115
    console.print(_jobs_table(JOBS, console.width))
    lines = console.export_text().splitlines()
    assert max(len(line) for line in lines) <= width
    assert len(lines) == 1 + len(JOBS)  # the header, one line per job
    assert lines[1].startswith("3f9465f2  ") and lines[2].startswith("00000000  ")
    assert "second line" not in "\n".join(lines)
    if width >= 200:
        assert "GRPC: gRPC UNAVAILABLE from 127.0.0.1:9090: [model] loading" in lines[1]
