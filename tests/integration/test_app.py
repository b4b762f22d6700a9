"""The composition root closes in bounded time with every component stopped: after a normal
run, when a component was stopped twice already, when the app never started, and when a
start failed half-way (the rest never started)."""

from __future__ import annotations

import threading
import time

import pytest

from protomolt_jobs.app import JobsApp
from protomolt_jobs.service import ServiceState
from protomolt_jobs.workflow import Runtime
from tests.support.worker_proc import jobs_config


def _ours() -> set[str]:
    return {t.name for t in threading.enumerate() if t.name.startswith("protomolt-jobs-")}


def _all_stopped(app: JobsApp) -> bool:
    return all(s.health().state is ServiceState.STOPPED for s in app.services)


def test_close_is_bounded_after_a_double_stop_of_one_component(fresh_dsn):
    before = _ours()
    app = JobsApp.open(jobs_config(fresh_dsn), runtime=Runtime())
    app.start()
    assert app.health()["database"]["status"] == "UP"
    assert app.sweeper is not None
    assert app.sweeper.stop() is True
    assert app.sweeper.stop() is True  # stopped twice before the app closes
    t0 = time.monotonic()
    assert app.close() is True
    assert app.close() is True  # idempotent
    assert time.monotonic() - t0 < 10.0
    assert _all_stopped(app)
    assert _ours() <= before


def test_close_of_an_app_that_never_started(fresh_dsn):
    app = JobsApp.open(jobs_config(fresh_dsn), runtime=Runtime())
    t0 = time.monotonic()
    assert app.close() is True
    assert time.monotonic() - t0 < 2.0
    assert _all_stopped(app)


def test_a_start_that_fails_half_way_closes_what_started(fresh_dsn, monkeypatch):
    before = _ours()
    app = JobsApp.open(jobs_config(fresh_dsn), runtime=Runtime())

    def refuse() -> None:
        raise RuntimeError("the pruner cannot start")

    assert app.pruner is not None
    monkeypatch.setattr(app.pruner, "start", refuse)
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match="cannot start"):
        app.start()  # the sweeper started, the pruner failed, the worker never started
    assert time.monotonic() - t0 < 10.0
    assert _all_stopped(app)
    assert app.worker.health().state is ServiceState.STOPPED
    assert app.close() is True
    assert _ours() <= before
