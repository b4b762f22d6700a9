"""Deferred activation values (celenv.Deferred, cel.bind_message, celenv.json_plain): the plain
form given to cel-cpp is exactly what the CEL values would have become, conversions happen
only when an expression reads the name, and per-type plans are never shared between types."""

from __future__ import annotations

import datetime

import pytest
from celpy import celtypes
from google.protobuf import message_factory
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from protomolt_jobs.workflow import cel, celenv
from tests.support.rich import Rich, WithTime, rich_messages, rich_pool, texts


def _plain_of_cel(value):
    try:
        return celenv._plain(value)
    except celenv.Unrepresentable:
        return celenv.Unrepresentable


def _plain_direct(fn, value):
    try:
        return fn(value)
    except celenv.Unrepresentable:
        return celenv.Unrepresentable


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(msg=rich_messages())
def test_message_to_plain_is_the_plain_form_of_message_to_cel(msg):
    expected = _plain_of_cel(cel.message_to_cel(msg))
    assert _plain_direct(cel.message_to_plain, msg) == expected


def test_message_to_plain_answers_for_plain_kinds_and_refuses_doubles_and_uints():
    m = Rich(i64=2**40, s="x", color=1, tags=["a"])
    m.counts["k"] = 3
    m.sv.value = "w"
    m.meta.update({"k": "v"})
    plain = cel.message_to_plain(m)
    assert plain["i64"] == 2**40 and plain["counts"] == {"k": 3} and plain["sv"] == "w"
    assert plain["meta"] == {"k": "v"} and "inner" not in plain and "opt" not in plain
    for bad in (Rich(d=0.5), Rich(u32=1), Rich(s="a\x00")):
        with pytest.raises(celenv.Unrepresentable):
            cel.message_to_plain(bad)


_json = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**64), 2**64)
    | st.floats(allow_nan=False)
    | texts
    | st.binary(max_size=3),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(texts, inner, max_size=3),
    max_leaves=8,
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(value=_json)
def test_json_plain_is_the_plain_form_of_to_cel(value):
    try:
        converted = celenv.to_cel(value)
    except ValueError:
        # to_cel refuses (an int beyond int64): json_plain must not answer for it either.
        assert _plain_direct(celenv.json_plain, value) is celenv.Unrepresentable
        return
    assert _plain_direct(celenv.json_plain, value) == _plain_of_cel(converted)


class _Counting:
    def __init__(self, fn):
        self.fn = fn
        self.calls = 0

    def __call__(self, value):
        self.calls += 1
        return self.fn(value)


def test_a_deferred_value_converts_only_what_is_read_and_only_once():
    to_cel = _Counting(cel.message_to_cel)
    to_plain = _Counting(cel.message_to_plain)
    read = celenv.Deferred(Rich(i64=4), to_cel, to_plain)
    unread_cel = _Counting(cel.message_to_cel)
    unread_plain = _Counting(cel.message_to_plain)
    unread = celenv.Deferred(Rich(), unread_cel, unread_plain)
    for _ in range(3):
        assert cel.evaluate("a.i64 + 1", {"a": read, "b": unread}) == 5
    assert (to_plain.calls, to_cel.calls) == (1, 0)  # cel-cpp answered from the plain form
    assert (unread_plain.calls, unread_cel.calls) == (0, 0)
    # A double keeps cel-cpp out: cel-python answers from CEL values of every bound name.
    cel_side = _Counting(cel.message_to_cel)
    plain_side = _Counting(cel.message_to_plain)
    doubled = celenv.Deferred(Rich(d=1.5), cel_side, plain_side)
    for _ in range(2):
        assert cel.evaluate(
            "a.d * 2.0 == 3.0 && has(b.inner) == false", {"a": doubled, "b": unread}
        )
    assert (plain_side.calls, cel_side.calls) == (0, 1)  # the text has a double literal
    assert unread_cel.calls == 1


def test_a_deferred_value_gives_the_same_answers_and_errors_as_cel_values():
    msg = Rich(i64=3, s="a\x00b", tags=["x"])
    cases = ["a.i64 * 2", "size(a.s)", "a.tags[0] + a.s", "a.nope", "a.tags[4]", "a.d + 1.0"]
    for text in cases:
        outcomes = []
        for value in (cel.message_to_cel(msg), cel.bind_message(msg)):
            try:
                outcomes.append(("ok", cel.evaluate(text, {"a": value})))
            except cel.CelError as exc:
                outcomes.append(("error", str(exc)))
        assert outcomes[0] == outcomes[1], text


def test_types_that_reach_a_timestamp_are_converted_at_once():
    # Their conversion can fail (a time out of datetime's range): it must fail where it
    # always did (binding the scope: "gate failed", "mapping failed"), not inside a rule.
    ok = WithTime(s="x")
    ok.at.seconds = 60
    bound = cel.bind_message(ok)
    assert not isinstance(bound, celenv.Deferred)
    assert bound[celtypes.StringType("at")] == celtypes.TimestampType(
        datetime.datetime(1970, 1, 1, 0, 1, tzinfo=datetime.UTC)
    )
    bad = WithTime()
    bad.at.seconds = 300_000_000_000
    with pytest.raises((ValueError, OverflowError)):
        cel.bind_message(bad)
    assert isinstance(cel.bind_message(Rich()), celenv.Deferred)


def test_types_of_the_same_name_in_two_pools_do_not_share_a_plan():
    other = message_factory.GetMessageClass(
        rich_pool(extra_field=True).FindMessageTypeByName("t.Rich")
    )
    assert "extra" in cel.message_to_plain(other(extra="e"))
    assert "extra" not in cel.message_to_plain(Rich())
    assert "extra" in cel.message_to_plain(other())
    assert cel._plain_plan(other.DESCRIPTOR) is not cel._plain_plan(Rich.DESCRIPTOR)


@pytest.mark.skipif(celenv._cx is None, reason="cel-cpp (cel-expr-python) is not installed")
def test_a_value_known_to_be_read_twice_enters_cel_cpp_at_the_first_read():
    doc = {"a": 1, "b": "x"}
    once = celenv.deferred_json(doc)
    assert once.cx_activation("this") is None  # the first read goes by data
    assert once.cx_activation("this") is not None
    twice = celenv.deferred_json(doc, reads=2)
    first = twice.cx_activation("this")
    assert first is not None and twice.cx_activation("this") is first
    assert twice.cx_activation("that") is None  # another name: as always
    for text, want in (("this.a == 1", True), ("this.b + 'y'", "xy"), ("this.a > 1", False)):
        got = celenv.program(text).evaluate({"this": celenv.deferred_json(doc, reads=2)})
        assert got == want
