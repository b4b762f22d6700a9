"""Breaker: a child of ``--processes N`` must never itself supervise processes."""

from __future__ import annotations

import pytest

from protomolt_jobs.worker import __main__ as worker_main
from protomolt_jobs.worker import processes


@pytest.mark.parametrize(
    "spelling", [["--processes", "2"], ["--processes=2"], ["--proc", "2"], ["--process=2"]]
)
def test_a_child_never_becomes_a_supervisor_again(monkeypatch, spelling):
    captured: dict = {}
    real = processes.WorkerProcesses

    class FakeGroup:
        def __init__(self, count, *, args, worker_id, env):
            captured["argv"] = real(count, args=args, worker_id=worker_id, env=env).argv(1)

        def start(self, ready_timeout_s=60.0, *, abort=None):
            raise RuntimeError("not started in this test")

    monkeypatch.setattr(processes, "WorkerProcesses", FakeGroup)
    argv = [*spelling, "--dsn", "postgresql://127.0.0.1:1/none"]
    try:
        assert worker_main.main(argv, environ={}) == 1
    except SystemExit as exc:  # refused as a usage error: no child at all
        assert exc.code == 2
        return
    child = captured["argv"][3:]  # past: python -m protomolt_jobs.worker

    supervised: list = []
    monkeypatch.setattr(worker_main, "_supervise", lambda *a: supervised.append(a) or 0)

    def no_db(*_a, **_k):
        raise worker_main.StoreError("no database in this test")

    monkeypatch.setattr(worker_main.JobsApp, "open", no_db)
    worker_main.main(child, environ={})
    # A child that supervised again would spawn children that supervise again, for ever.
    assert supervised == [], child
