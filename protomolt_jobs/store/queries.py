"""The named queries of ``queries.sql``, loaded once into a read-only mapping.

Each block of ``queries.sql`` opens with ``-- name: <verb_noun>`` and one
``-- description: ...`` line, and takes only ``%(name)s`` parameters. Store methods bear the
name of the query they run. The values are typed :data:`typing.LiteralString` so a type
checker flags SQL assembled from untrusted strings.

A part several statements share verbatim is written once as a block opening with
``-- fragment: <name>`` (and its description line), before its first use; a query takes it
with a line ``-- include: <name>``, which is replaced by the fragment's lines. Fragments are
not queries: they are in neither mapping.
"""

from __future__ import annotations

import re
from importlib import resources
from types import MappingProxyType
from typing import LiteralString, cast

__all__ = ["DESCRIPTIONS", "QUERIES", "parse_queries"]

_NAME = re.compile(r"^--\s*(name|fragment):\s*([a-z][a-z0-9_]*)\s*$")
_INCLUDE = re.compile(r"^\s*--\s*include:\s*([a-z][a-z0-9_]*)\s*$")
_DESCRIPTION = re.compile(r"^--\s*description:\s*(.+?)\s*$")


def _compact(sql: str) -> str:
    """The SQL the server gets: whole-line ``--`` comments, blank lines and indentation dropped.

    A query's text is its cache key twice over: psycopg caches the parsed form and prepares a
    server-side statement only for texts of at most 4096 characters
    (``psycopg._queries.MAX_CACHED_STATEMENT_LENGTH``); a longer one is re-split in Python and
    re-parsed and re-planned by the server on every call. Comments at a line's end stay (they
    may follow a string literal), so a block's line comments go on lines of their own.
    """
    lines = (line.strip() for line in sql.splitlines())
    return "\n".join(line for line in lines if line and not line.startswith("--"))


def parse_queries(text: str) -> tuple[dict[str, LiteralString], dict[str, str]]:
    """Split the text of a named-query file into its blocks.

    :param text: the file's contents.
    :returns: ``(queries, descriptions)``, both keyed by query name; each query is the block's
        SQL without its header lines, whole-line comments, blank lines, indentation and
        trailing semicolon (:func:`_compact`).
    :raises ValueError: on a duplicate name, a block without a description line, text before
        the first ``-- name:`` line, an empty block, or an include of a fragment not defined
        before it; the message names the query or fragment.
    """
    queries: dict[str, LiteralString] = {}
    descriptions: dict[str, str] = {}
    fragments: dict[str, list[str]] = {}
    name: str | None = None
    kind = "name"
    described = False
    body: list[str] = []

    def flush() -> None:
        if name is None:
            return
        what = "query" if kind == "name" else "fragment"
        if not described:
            raise ValueError(f"{what} {name!r} in queries.sql has no '-- description:' line")
        if kind == "fragment":
            if not _compact("\n".join(body)):
                raise ValueError(f"fragment {name!r} in queries.sql has no SQL")
            fragments[name] = list(body)
            return
        sql = _compact("\n".join(body)).rstrip(";").strip()
        if not sql:
            raise ValueError(f"query {name!r} in queries.sql has no SQL")
        queries[name] = cast(LiteralString, sql)

    for line in text.splitlines():
        named = _NAME.match(line)
        if named:
            flush()
            kind, name = named.group(1), named.group(2)
            if name in queries or name in fragments:
                what = "query" if kind == "name" else "fragment"
                raise ValueError(f"{what} {name!r} is defined twice in queries.sql")
            described = False
            body = []
            continue
        if name is None:
            if line.strip() and not line.lstrip().startswith("--"):
                raise ValueError("queries.sql has SQL before its first '-- name:' line")
            continue
        description = _DESCRIPTION.match(line)
        if description and not described:
            described = True
            if kind == "name":
                descriptions[name] = description.group(1)
            continue
        include = _INCLUDE.match(line)
        if include:
            part = fragments.get(include.group(1))
            if part is None:
                raise ValueError(
                    f"query {name!r} in queries.sql includes {include.group(1)!r}, which no "
                    "'-- fragment:' block before it defines"
                )
            body.extend(part)
            continue
        body.append(line)
    flush()
    return queries, descriptions


def _load() -> tuple[dict[str, LiteralString], dict[str, str]]:
    text = resources.files("protomolt_jobs.store").joinpath("queries.sql").read_text("utf-8")
    return parse_queries(text)


_queries, _descriptions = _load()


def _derive_one_queue_claim(
    queries: dict[str, LiteralString], descriptions: dict[str, str]
) -> None:
    """Add ``job_claim_one_queue``: ``job_claim`` with its served-queue list as one ``VALUES``
    row bound to ``%(queue)s``, for the common worker that serves a single queue.

    PostgreSQL estimates ``unnest`` of a parameter array at 10 elements, so the generic plan
    of ``job_claim`` looks about ten times dearer than the custom plan for a one-queue array,
    and the plan cache re-plans the claim on every execution (measured: 0.63 against 0.39 ms
    of server CPU per claim). With a one-row ``VALUES`` the generic plan costs what the custom
    one does and is kept after the first few executions. Derived here, not written twice.
    """
    served = "unnest(%(queues)s::text[])"
    claim = queries["job_claim"]
    if claim.count(served) != 1:
        raise ValueError("job_claim in queries.sql must read its served queues from " + served)
    queries["job_claim_one_queue"] = cast(
        LiteralString, claim.replace(served, "(VALUES (%(queue)s::text))")
    )
    descriptions["job_claim_one_queue"] = descriptions["job_claim"] + " (one served queue)"


_derive_one_queue_claim(_queries, _descriptions)

#: Query name -> SQL text as sent: ``queries.sql``'s block, compacted (:func:`_compact`).
QUERIES: MappingProxyType[str, LiteralString] = MappingProxyType(_queries)
#: Query name -> its one-line description.
DESCRIPTIONS: MappingProxyType[str, str] = MappingProxyType(_descriptions)
