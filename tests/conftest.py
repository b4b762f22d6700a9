"""Session fixtures every test tier uses: real PostgreSQL databases and a real broker.

- ``pg_template``: a database migrated once per session; never connected to by tests.
- ``fresh_dsn``: a ``CREATE DATABASE ... TEMPLATE`` copy for one test, dropped afterwards.
  Use it for anything that commits, LISTENs or runs workers.
- ``session_dsn``: one migrated database shared by the session (read-mostly tests).
- ``broker``: one Tansu broker for the session (see tests/support/broker.py).
"""

from __future__ import annotations

import os

import pytest

from tests.support import pg
from tests.support.broker import Broker


@pytest.fixture(autouse=True)
def _no_protomolt_env(monkeypatch):
    """A developer's PROTOMOLT_* variables must not leak into tests."""
    for key in list(os.environ):
        if key.startswith("PROTOMOLT_") and key != "PROTOMOLT_TEST_DSN":
            monkeypatch.delenv(key, raising=False)


def _migrate(dsn: str) -> None:
    from protomolt_jobs.store.migrate import migrate

    migrate(dsn)


@pytest.fixture(scope="session")
def pg_template():
    name = pg.new_name("pmjt_tpl")
    dsn = pg.create_database(name)
    try:
        _migrate(dsn)
        yield name
    finally:
        pg.drop_database(name)


@pytest.fixture
def fresh_dsn(pg_template):
    name = pg.new_name()
    dsn = pg.create_database(name, template=pg_template)
    try:
        yield dsn
    finally:
        pg.drop_database(name)


@pytest.fixture(scope="session")
def session_dsn(pg_template):
    name = pg.new_name("pmjt_sess")
    dsn = pg.create_database(name, template=pg_template)
    try:
        yield dsn
    finally:
        pg.drop_database(name)


@pytest.fixture
def empty_dsn():
    """A brand-new, unmigrated database (migration tests)."""
    name = pg.new_name("pmjt_empty")
    dsn = pg.create_database(name)
    try:
        yield dsn
    finally:
        pg.drop_database(name)


@pytest.fixture(scope="session")
def broker():
    b = Broker().start()
    try:
        yield b
    finally:
        b.stop()


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item, call):
    """Keep each phase's report on the item (``item.rep_call``), so a fixture's teardown can
    tell a failed test (the browser tests save a screenshot then)."""
    report = yield
    setattr(item, f"rep_{report.when}", report)
    return report
