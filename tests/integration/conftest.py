"""Fixtures most integration modules share: the gRPC test servers and a job store.

A module that needs another shape (more server threads, a bigger pool) defines a fixture of
the same name; pytest takes the module's over this one.

- ``svc``: one set of real gRPC test servers on loopback per module.
- ``services``: ``svc`` with its counters, failures and handler overrides reset around a test.
- ``store``: a :class:`JobStore` on the test's fresh database, pool of at most 4.
"""

from __future__ import annotations

import pytest

from protomolt_jobs.store import JobStore
from tests.support.grpc_servers import TestServices


@pytest.fixture(scope="module")
def svc():
    with TestServices() as services:
        yield services


@pytest.fixture
def services(svc):
    svc.reset()
    yield svc
    svc.reset()


@pytest.fixture
def store(fresh_dsn):
    s = JobStore.open(fresh_dsn, max_size=4)
    yield s
    s.close()
