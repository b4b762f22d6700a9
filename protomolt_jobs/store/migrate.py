"""The migration runner: plain SQL files from ``migrations/``, applied in order, exactly once.

Files are named ``NNNN_name.sql`` (``NNNN`` is the version, compared as text, so keep it
zero-padded). They are append-only: once applied anywhere, a file is never edited; a changed
file is refused loudly because its checksum no longer matches the history row.

Protocol (one call of :func:`migrate`):

1. take the session advisory lock :data:`MIGRATION_LOCK_KEY` (a second runner blocks here and,
   once it gets the lock, finds every file applied and does nothing);
2. create ``protomolt_jobs_schema_history`` if missing;
3. for each file not in the history, in version order: one transaction runs the file's SQL and
   inserts its history row (version, name, sha256 checksum); a failing file rolls back whole and
   stops the run;
4. release the lock; close the connection if :func:`migrate` opened it.

Adopting upstream's database: when the history does not record 0001 but ``workflow_run`` and
``workflow_run_events_outbox`` exist with exactly upstream's ``V1__workflow_runs.sql`` columns
(the Java ProtoMolt's Flyway migration), step 3 first applies
``0007_adopt_upstream_v1.sql`` (which brings the schema to what 0001 makes and installs the
foreign-writer fence) and records 0001 as adopted and 0007 as applied, in one transaction; the
other files then apply as usual. Tables that exist in any other shape are refused
(:class:`MigrationError`), never altered. Flyway's ``flyway_schema_history`` is left alone,
so Java nodes keep starting against the same database.

Where the files are found: the repository's top-level ``migrations/`` (an editable install or a
source checkout, recognised by the ``pyproject.toml`` beside it), else
``protomolt_jobs/_migrations`` inside an installed wheel: in the repository that is a symlink to
``../migrations``, so the wheel build packs the files as package data (``**/*.sql``).
"""

from __future__ import annotations

import hashlib
import logging
import re
from dataclasses import dataclass
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Any, LiteralString, cast

import psycopg

from protomolt_jobs.errors import StoreError
from protomolt_jobs.store.queries import QUERIES

__all__ = [
    "MIGRATION_LOCK_KEY",
    "MigrationError",
    "MigrationFile",
    "migrate",
    "migration_files",
    "migrations_dir",
]

log = logging.getLogger("protomolt_jobs.migrate")

#: Key of the session advisory lock that serialises migration runners ("pmjobs" + 1).
MIGRATION_LOCK_KEY = 0x706D6A6F62730001

_FILE_NAME = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")

#: The file that adopts upstream's V1 schema in place of 0001.
ADOPTION_VERSION = "0007"
#: Columns of upstream's ``V1__workflow_runs.sql`` (reference/upstream-jobs.md section 2).
UPSTREAM_V1_COLUMNS: dict[str, frozenset[str]] = {
    "workflow_run": frozenset(
        [
            "job_id",
            "workflow_name",
            "workflow_definition",
            "input",
            "input_ref",
            "status",
            "attempt",
            "max_attempts",
            "run_after",
            "outstanding_step",
            "checkpoints",
            "result",
            "result_ref",
            "verdict",
            "error",
            "lease_owner",
            "lease_until",
            "created_at",
            "updated_at",
            "completed_at",
        ]
    ),
    "workflow_run_events_outbox": frozenset(
        [
            "event_id",
            "event_type",
            "payload",
            "kafka_key",
            "attempts",
            "status",
            "created_at",
            "published_at",
            "last_error",
        ]
    ),
}


class MigrationError(StoreError):
    """A migration cannot be applied: a malformed file name, an applied file whose contents
    changed (checksum mismatch), or a file whose SQL failed (the driver error is the cause)."""


@dataclass(frozen=True, slots=True)
class MigrationFile:
    """One migration file: ``version`` ("0001"), ``name`` ("workflow_run"), ``filename``,
    the SQL text and its sha256 hex ``checksum``."""

    version: str
    name: str
    filename: str
    sql: str
    checksum: str


def migrations_dir() -> Traversable:
    """The directory that holds the migration files.

    :returns: the repository's ``migrations/`` when it exists next to the package (source
        checkout, editable install), else the ``_migrations`` resource of the installed package.
    :raises MigrationError: when neither exists.
    """
    root = Path(__file__).resolve().parents[2]
    checkout = root / "migrations"
    # pyproject.toml marks a source tree; in site-packages a stray "migrations" dir is not ours
    if checkout.is_dir() and (root / "pyproject.toml").is_file():
        return checkout
    packaged = resources.files("protomolt_jobs") / "_migrations"
    if packaged.is_dir():
        return packaged
    raise MigrationError(
        f"no migrations found: neither {checkout} nor protomolt_jobs/_migrations exists"
    )


def migration_files(directory: Traversable | Path | None = None) -> list[MigrationFile]:
    """The migration files in version order.

    :param directory: where to read them; default :func:`migrations_dir`.
    :returns: one :class:`MigrationFile` per ``*.sql`` file, ordered by version.
    :raises MigrationError: on a ``.sql`` file not named ``NNNN_name.sql`` or a version used twice.
    """
    root = directory if directory is not None else migrations_dir()
    files: dict[str, MigrationFile] = {}
    for entry in root.iterdir():
        if not entry.name.endswith(".sql"):
            continue
        match = _FILE_NAME.match(entry.name)
        if not match:
            raise MigrationError(
                f"migration file {entry.name!r} is not named NNNN_name.sql "
                "(four digits, underscore, lowercase name)"
            )
        version, name = match.groups()
        if version in files:
            raise MigrationError(
                f"migration version {version} is used twice: "
                f"{files[version].filename!r} and {entry.name!r}"
            )
        raw = entry.read_bytes()
        files[version] = MigrationFile(
            version=version,
            name=name,
            filename=entry.name,
            sql=raw.decode("utf-8"),
            checksum=hashlib.sha256(raw).hexdigest(),
        )
    return [files[v] for v in sorted(files)]


def migrate(
    dsn_or_conn: str | psycopg.Connection[Any],
    *,
    directory: Traversable | Path | None = None,
) -> list[str]:
    """Apply every migration file not yet applied, in order, under the advisory lock.

    SQL effect: creates ``protomolt_jobs_schema_history`` if missing, runs each pending file and
    inserts its history row, one transaction per file. Re-running is a no-op; two runners at
    once apply each file exactly once (the second waits for the lock, then finds nothing to do).

    :param dsn_or_conn: a libpq DSN (a connection is opened and always closed), or an open, idle
        connection (left open, its autocommit setting restored).
    :param directory: where the files are; default :func:`migrations_dir`.
    :returns: the file names applied by this call, in order (empty when up to date).
    :raises MigrationError: on a malformed file name, a checksum mismatch of an applied file
        (nothing is applied then), or a failing file (that file is rolled back; earlier files of
        this run stay applied).
    :raises StoreError: when the database cannot be reached.
    """
    files = migration_files(directory)
    if isinstance(dsn_or_conn, psycopg.Connection):
        return _migrate_on(dsn_or_conn, files)
    try:
        conn = psycopg.connect(dsn_or_conn, autocommit=True)
    except psycopg.Error as exc:
        raise StoreError(f"migrate: cannot connect to the database: {exc}") from exc
    with conn:
        return _migrate_on(conn, files)


def _migrate_on(conn: psycopg.Connection[Any], files: list[MigrationFile]) -> list[str]:
    was_autocommit = conn.autocommit
    try:
        # the advisory lock is session-level, so the file transactions are explicit blocks
        conn.autocommit = True
        conn.execute(QUERIES["migrate_lock"], {"key": MIGRATION_LOCK_KEY})
    except psycopg.Error as exc:
        raise StoreError(f"migrate: cannot take the migration lock: {exc}") from exc
    try:
        return _apply_pending(conn, files)
    finally:
        try:
            conn.execute(QUERIES["migrate_unlock"], {"key": MIGRATION_LOCK_KEY})
            conn.autocommit = was_autocommit
        except psycopg.Error:
            # a broken connection releases the session lock by itself
            log.warning("migration lock release failed", extra={"action": "migrate_unlock_failed"})


def _apply_pending(conn: psycopg.Connection[Any], files: list[MigrationFile]) -> list[str]:
    try:
        conn.execute(QUERIES["migrate_history_create"])
        applied = {
            row[0]: (row[1], row[2]) for row in conn.execute(QUERIES["migrate_history_list"])
        }
    except psycopg.Error as exc:
        raise StoreError(f"migrate: cannot read the migration history: {exc}") from exc

    for mf in files:
        if mf.version in applied and applied[mf.version][1] != mf.checksum:
            raise MigrationError(
                f"migration {mf.filename} was changed after it was applied "
                f"(recorded checksum {applied[mf.version][1]}, file has {mf.checksum}); "
                "migrations are append-only: restore the file and add a new one"
            )
    known = {mf.version for mf in files}
    for version, (name, _) in sorted(applied.items()):
        if version not in known:
            # a newer release migrated this database; this code runs on the older schema
            log.info(
                "database has migration %s_%s that this release does not ship",
                version,
                name,
                extra={"action": "migrate_unknown_version", "version": version},
            )

    done: list[str] = []
    if "0001" not in applied and _has_upstream_v1(conn):
        _adopt(conn, files)
        done.append(next(mf.filename for mf in files if mf.version == ADOPTION_VERSION))
        applied = {
            row[0]: (row[1], row[2]) for row in conn.execute(QUERIES["migrate_history_list"])
        }
    for mf in files:
        if mf.version in applied:
            continue
        try:
            with conn.transaction():
                conn.execute(cast(LiteralString, mf.sql))
                conn.execute(
                    QUERIES["migrate_history_insert"],
                    {"version": mf.version, "name": mf.name, "checksum": mf.checksum},
                )
        except psycopg.Error as exc:
            raise MigrationError(
                f"migration {mf.filename} failed and was rolled back: {exc}"
            ) from exc
        log.info(
            "applied migration %s",
            mf.filename,
            extra={"action": "migration_applied", "version": mf.version, "migration": mf.name},
        )
        done.append(mf.filename)
    return done


def _has_upstream_v1(conn: psycopg.Connection[Any]) -> bool:
    """True when the jobs tables exist exactly as upstream's V1 makes them (adopt them);
    False when neither exists (a fresh database).

    :raises MigrationError: when they exist in another shape (never altered, never guessed).
    """
    try:
        rows = conn.execute(QUERIES["migrate_existing_columns"]).fetchall()
    except psycopg.Error as exc:
        raise StoreError(f"migrate: cannot read the existing schema: {exc}") from exc
    existing: dict[str, set[str]] = {}
    for table, column in rows:
        existing.setdefault(table, set()).add(column)
    if not existing:
        return False
    if {t: frozenset(c) for t, c in existing.items()} == UPSTREAM_V1_COLUMNS:
        return True
    described = "; ".join(f"{t}: {', '.join(sorted(c))}" for t, c in sorted(existing.items()))
    raise MigrationError(
        "the jobs tables exist but protomolt_jobs_schema_history does not record 0001, and "
        "they are not upstream's V1__workflow_runs.sql schema either (found "
        f"{described}); refusing to alter them"
    )


def _adopt(conn: psycopg.Connection[Any], files: list[MigrationFile]) -> None:
    """Adopt upstream's V1 schema: apply 0007, record 0001 (adopted) and 0007, one transaction."""
    by_version = {mf.version: mf for mf in files}
    if "0001" not in by_version or ADOPTION_VERSION not in by_version:
        raise MigrationError(
            f"cannot adopt upstream's schema: migrations 0001 and {ADOPTION_VERSION} must both "
            "ship with this release"
        )
    first, adoption = by_version["0001"], by_version[ADOPTION_VERSION]
    try:
        with conn.transaction():
            conn.execute(cast(LiteralString, adoption.sql))
            conn.execute(
                QUERIES["migrate_history_insert"],
                {
                    "version": first.version,
                    "name": f"{first.name} (adopted from upstream V1__workflow_runs.sql)",
                    "checksum": first.checksum,
                },
            )
            conn.execute(
                QUERIES["migrate_history_insert"],
                {
                    "version": adoption.version,
                    "name": adoption.name,
                    "checksum": adoption.checksum,
                },
            )
    except psycopg.Error as exc:
        raise MigrationError(
            f"adopting upstream's schema ({adoption.filename}) failed and was rolled back: {exc}"
        ) from exc
    log.info(
        "adopted upstream's V1__workflow_runs.sql schema with %s; 0001 recorded as adopted",
        adoption.filename,
        extra={"action": "migration_adopted_upstream", "version": adoption.version},
    )
