"""PostgreSQL databases for tests: one migrated template per session, cheap copies per test.

The base DSN comes from ``PROTOMOLT_TEST_DSN`` (``.ci/run`` exports a fresh database for each
run); without it the local cluster's ``postgres`` database on 127.0.0.1:5432 is used. Every
database this module creates is named ``pmjt_<pid>_<n>`` and dropped when done.
"""

from __future__ import annotations

import itertools
import os
import uuid

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

BASE_DSN = os.environ.get("PROTOMOLT_TEST_DSN", "postgresql://postgres@127.0.0.1:5432/postgres")
_counter = itertools.count()


def dsn_for(dbname: str) -> str:
    """The base DSN pointed at another database of the same cluster."""
    params = conninfo_to_dict(BASE_DSN)
    params["dbname"] = dbname
    return make_conninfo(**params)


def _admin() -> psycopg.Connection:
    return psycopg.connect(BASE_DSN, autocommit=True)


def new_name(prefix: str = "pmjt") -> str:
    return f"{prefix}_{os.getpid()}_{next(_counter)}_{uuid.uuid4().hex[:6]}"


def create_database(name: str, template: str | None = None) -> str:
    """CREATE DATABASE (optionally from a template); returns its DSN."""
    with _admin() as conn:
        if template:
            conn.execute(
                sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
                    sql.Identifier(name), sql.Identifier(template)
                )
            )
        else:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    return dsn_for(name)


def drop_database(name: str) -> None:
    """DROP DATABASE ... WITH (FORCE): also ends connections a test leaked."""
    with _admin() as conn:
        conn.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
        )
