"""The named queries as sent to the server: compact enough for psycopg to cache and prepare."""

from __future__ import annotations

import re

import pytest
from psycopg._queries import MAX_CACHED_STATEMENT_LENGTH, MAX_CACHED_STATEMENT_PARAMS

from protomolt_jobs.store.queries import QUERIES, parse_queries


def test_every_query_is_short_enough_for_psycopg_to_cache_and_prepare():
    # A longer text is re-split in Python and re-parsed and re-planned by the server on every
    # call (job_insert was 4184 characters with its comments: about a third of a submit's CPU).
    long = {
        name: len(sql) for name, sql in QUERIES.items() if len(sql) > MAX_CACHED_STATEMENT_LENGTH
    }
    assert long == {}
    many = {
        name: n
        for name, sql in QUERIES.items()
        if (n := len(set(re.findall(r"%\((\w+)\)s", sql)))) > MAX_CACHED_STATEMENT_PARAMS
    }
    assert many == {}


def test_comment_lines_blank_lines_and_indentation_are_not_sent():
    text = """
-- name: job_thing
-- description: a thing
-- a comment about the statement
SELECT a,   -- keeps this one: it may follow a literal
       '-- not a comment' AS b

    -- another comment
FROM t;
"""
    queries, descriptions = parse_queries(text)
    assert descriptions == {"job_thing": "a thing"}
    assert queries["job_thing"] == (
        "SELECT a,   -- keeps this one: it may follow a literal\n'-- not a comment' AS b\nFROM t"
    )


def test_no_query_holds_a_whole_line_comment():
    for name, sql in QUERIES.items():
        assert not any(line.startswith("--") for line in sql.splitlines()), name


def test_no_string_literal_spans_lines_so_compacting_cannot_change_one():
    # _compact strips each line's indentation and drops lines starting with "--": inside a
    # literal that spans lines either would change the literal. Every SQL line of the file
    # (comments aside) must close the literals it opens.
    from importlib import resources

    text = resources.files("protomolt_jobs.store").joinpath("queries.sql").read_text("utf-8")
    open_literals = [
        n
        for n, line in enumerate(text.splitlines(), 1)
        if not line.lstrip().startswith("--") and line.split("--")[0].count("'") % 2
    ]
    assert open_literals == []


def test_a_fragment_is_included_where_a_query_names_it_and_is_no_query():
    text = """
-- fragment: tail
-- description: a shared tail
), b AS (
    SELECT 2 AS y
)

-- name: one_thing
-- description: first
WITH a AS (
    SELECT 1 AS x
-- include: tail
SELECT x FROM a, b

-- name: other_thing
-- description: second
WITH a AS (
    SELECT 3 AS x
-- include: tail
SELECT y FROM a, b
"""
    queries, descriptions = parse_queries(text)
    assert set(queries) == set(descriptions) == {"one_thing", "other_thing"}
    assert (
        queries["one_thing"]
        == "WITH a AS (\nSELECT 1 AS x\n), b AS (\nSELECT 2 AS y\n)\nSELECT x FROM a, b"
    )
    assert queries["other_thing"].endswith("), b AS (\nSELECT 2 AS y\n)\nSELECT y FROM a, b")


def test_an_include_of_an_unknown_or_later_fragment_is_refused_naming_both():
    later = """
-- name: one_thing
-- description: first
SELECT 1
-- include: tail

-- fragment: tail
-- description: defined too late
, 2
"""
    with pytest.raises(ValueError, match="'one_thing' in queries.sql includes 'tail'"):
        parse_queries(later)
    with pytest.raises(ValueError, match="fragment 'tail' in queries.sql has no '-- description:'"):
        parse_queries("-- fragment: tail\nSELECT 1\n")
    with pytest.raises(ValueError, match="fragment 'tail' is defined twice"):
        parse_queries(
            "-- fragment: tail\n-- description: a\n, 1\n-- fragment: tail\n-- description: b\n, 2\n"
        )


def test_the_three_artifact_statements_share_one_artifact_rows_text():
    tails = {
        name: QUERIES[name][QUERIES[name].index("), wanted AS (") :]
        for name in (
            "job_checkpoint_artifacts",
            "job_complete_parked_artifacts",
            "job_recover_artifacts",
        )
    }
    shared = "INSERT INTO workflow_artifact_transition (artifact_id, actor, from_state, to_state, reason)\nSELECT u.artifact_id, %(actor)s,"
    assert all(shared in t for t in tails.values())
    bodies = {t[: t.index("RETURNING 1\n)")] for t in tails.values()}
    assert len(bodies) == 1


def test_each_artifact_statement_writes_its_base_statements_row_change_verbatim():
    # The base's change (without its own RETURNING / final SELECT) is the variant's "moved".
    for base in ("job_checkpoint", "job_complete_parked", "job_recover"):
        text = QUERIES[base]
        cut = (
            text.index("\nSELECT job_id") if base == "job_checkpoint" else text.index("\nRETURNING")
        )
        change = text[:cut].rstrip(")").rstrip()
        assert change in QUERIES[base + "_artifacts"], base
