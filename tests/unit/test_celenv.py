"""The CEL runtime (workflow/celenv.py): compiled evaluation, the interpreter's errors, threads."""

from __future__ import annotations

import threading

import pytest
from celpy import celtypes
from celpy.evaluation import CELEvalError
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from protomolt_jobs.workflow import cel, celenv


@pytest.mark.parametrize(
    "text",
    [
        "this.score >= 0 && this.score <= 1000",
        "size(this.title) > 0 || size(this.body) > 0",
        "has(this.meta) && this.meta.lang == 'en'",
        "this.tags.exists(t, t == 'b') && this.tags.all(t, size(t) > 0)",
        "this.type != 4 || size(this.verdict) > 0",
        "this.title.startsWith('Q') ? 'yes' : 'no'",
    ],
)
def test_successful_evaluations_run_compiled_code_not_the_interpreter(text):
    prog = celenv.program(text)
    this = celenv.to_cel(
        {
            "score": 3,
            "title": "Q",
            "body": "",
            "tags": ["a", "b"],
            "type": 2,
            "verdict": "",
            "meta": {"lang": "en"},
        }
    )
    value = prog.evaluate({"this": this})
    assert not isinstance(value, CELEvalError)
    assert prog._code is not None and prog._interpreted is None


def test_strings_extension_is_compiled_too():
    prog = cel.compile_expression("this.lang.lowerAscii() + '-' + this.lang.trim()")
    assert (
        cel.evaluate(
            "this.lang.lowerAscii() + '-' + this.lang.trim()",
            {"this": celenv.to_cel({"lang": " EN "})},
        )
        == " en -EN"
    )
    assert prog._code is not None and prog._interpreted is None


def test_a_failing_evaluation_gets_the_interpreters_verdict_and_text():
    prog = celenv.program("nobody.here")
    with pytest.raises(CELEvalError) as info:
        prog.evaluate({})
    assert "undeclared reference to 'nobody'" in str(info.value.args[0])
    # CEL's || absorbs an error on its left when the right is true: same verdict both ways.
    assert celenv.program("this.x.y || true").evaluate({"this": celenv.to_cel({})}) is not None


def test_threads_never_see_each_others_activations():
    prog = celenv.program("this.n * 2")
    errors: list[str] = []

    def run(k: int) -> None:
        for i in range(300):
            n = k * 1000 + i
            got = prog.evaluate({"this": celenv.to_cel({"n": n})})
            if got != celtypes.IntType(2 * n):
                errors.append(f"{n}: {got}")

    threads = [threading.Thread(target=run, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


# -- the fast path (cel-cpp) answers exactly as cel-python would -------------------------------


#: Expressions of the kinds gates, mapping rules and validation rules use.
EXPRESSIONS = [
    "this.n >= 0 && this.n <= 1000",
    "this.n + 1",
    "this.n * 2 - this.m",
    "this.n / 3",
    "this.n % 4",
    "this.n == this.m",
    "this.n < this.x",
    "this.x * 2.0",
    "this.x == 1.0",
    "this.n == 1.0",
    "size(this.s) > 0 || size(this.t) > 0",
    "this.s + '-' + this.t",
    "this.s.startsWith('a') && this.s.endsWith('z')",
    "this.s.contains(this.t)",
    "this.s.matches('^[a-c]+$')",
    "this.s < this.t",
    "has(this.meta) && this.meta.k == 'v'",
    "has(this.nope)",
    "this.tags.exists(t, t == 'b')",
    "this.tags.all(t, size(t) > 0)",
    "this.tags.map(t, t + '!')",
    "this.tags.filter(t, t != 'a')",
    "size(this.tags)",
    "'a' in this.tags",
    "this.tags[0]",
    "this.n > 2 ? this.s : this.t",
    "string(this.n) + this.s",
    "int(this.x)",
    "double(this.n)",
    "this.flag && this.n > 0",
    "!this.flag",
    "this.flag == true",
    "this.missing || true",
    "this.missing && false",
    "[this.n, this.m]",
    "{'a': this.n}",
    "this.meta",
    "this.s == ''",
    "this.n != 4 || size(this.s) > 0",
    "int(this.big) + 1",
]


@st.composite
def activations(draw):
    return {
        "n": draw(st.integers(-5, 2000)),
        "m": draw(st.integers(-(2**40), 2**40)),
        # a double makes cel-python answer (cel-cpp mixes int and double where it refuses)
        **({"x": draw(st.floats(-1e6, 1e6, allow_nan=False))} if draw(st.booleans()) else {}),
        "s": draw(st.text(alphabet="abcz-é\x00", max_size=6)),
        "t": draw(st.text(alphabet="abz\x00", max_size=3)),
        "tags": draw(st.lists(st.sampled_from(["a", "b", "", "ccc"]), max_size=4)),
        "flag": draw(st.booleans()),
        "big": str(draw(st.integers(-(2**50), 2**50))),
        **({"meta": {"k": draw(st.sampled_from(["v", "w"]))}} if draw(st.booleans()) else {}),
    }


ERROR = object()


def _interpreted(prog, activation):
    try:
        value = prog._interpreter().evaluate(activation)
    except CELEvalError:
        return ERROR
    return ERROR if isinstance(value, CELEvalError) else value


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=activations(), text=st.sampled_from(EXPRESSIONS))
def test_fast_path_answers_exactly_as_the_interpreter(data, text):
    prog = celenv.program(text)
    activation = {"this": celenv.to_cel(data)}
    fast = prog._evaluate_fast(activation)
    slow = _interpreted(prog, activation)
    if fast is celenv._NO_ANSWER:
        return  # the interpreter answers (an error, or a value cel-cpp does not give back)
    assert slow is not ERROR, f"{text}: cel-cpp gave {fast!r}, cel-python an error"
    assert fast == slow, f"{text}: {fast!r} != {slow!r}"
    assert prog.evaluate(activation) == slow


def test_fast_path_answers_most_expressions_without_doubles():
    activation = {
        "this": celenv.to_cel(
            {"n": 3, "m": 4, "s": "abz", "t": "a", "tags": ["a", "b"], "flag": True, "big": "7"}
        )
    }
    answered = [
        t
        for t in EXPRESSIONS
        if celenv.program(t)._evaluate_fast(activation) is not celenv._NO_ANSWER
    ]
    assert len(answered) >= 25, answered


def test_the_realistic_rules_take_the_fast_path():
    prog = celenv.program("size(this.title) > 0 || size(this.body) > 0")
    prog.evaluate({"this": celenv.to_cel({"title": "t", "body": ""})})
    assert prog._fast[("this",)] is not None


def test_names_the_text_does_not_mention_do_not_keep_it_off_the_fast_path():
    # Validation binds ``now`` (a timestamp cel-cpp is not given); a rule that does not read
    # it still runs on cel-cpp, and one that does goes to cel-python.
    this = celenv.to_cel({"score": 3})
    now = celtypes.TimestampType("2026-01-01T00:00:00Z")
    fast = celenv.program("this.score >= 0")
    assert fast._evaluate_fast({"this": this, "now": now}) == celtypes.BoolType(True)
    slow = celenv.program("now > timestamp('2025-01-01T00:00:00Z') && this.score >= 0")
    assert slow._evaluate_fast({"this": this, "now": now}) is celenv._NO_ANSWER
    assert slow.evaluate({"this": this, "now": now}) == celtypes.BoolType(True)


@pytest.mark.parametrize("value", ["\x00", "a\x00b", b"\x00", b"a\x00b"])
def test_a_nul_inside_a_value_is_not_cut_short(value):
    # cel-expr-python reads strings and bytes as C strings ("a\x00b" became "a", size 1):
    # such values are answered by cel-python, whose size counts every character.
    convert = celtypes.StringType if isinstance(value, str) else celtypes.BytesType
    activation = {"x": convert(value)}
    assert celenv.program("size(x)").evaluate(activation) == len(value)
    assert celenv.program("size(x) > 0").evaluate(activation)


def test_results_are_read_by_kind_name_as_by_kind():
    # _from_cx looks the common kinds up by name(); the names must be the kinds' own.
    for name in celenv._FROM_CX_BY_NAME:
        assert getattr(celenv._cx.Type, name).name() == name
    for text, expected in (("1 + 2", 3), ("-(2 * 4611686018427387903) - 2", -(2**63))):
        got = celenv.program(text)._evaluate_fast({})
        assert type(got) is celtypes.IntType and got == celtypes.IntType(expected)
    assert celenv.program("'a' + 'b'")._evaluate_fast({}) == celtypes.StringType("ab")
    assert type(celenv.program("1 < 2")._evaluate_fast({})) is celtypes.BoolType


def test_a_deferred_value_read_again_answers_through_its_kept_activation():
    doc = {"title": "Q1", "score": 7, "tags": ["a", "b"], "lang": "EN"}
    texts = [
        "this.score >= 0 && this.score <= 1000",
        "this.score + 1",
        "this.lang + '!'",
        "size(this.tags) > 1 ? this.title : 'no'",
    ]
    expected = [celenv.program(t).evaluate({"this": celenv.to_cel(doc)}) for t in texts]
    this = celenv.deferred_json(doc)
    for _ in range(3):  # first read without, then through the kept activation
        got = [celenv.program(t).evaluate({"this": this}) for t in texts]
        assert [type(g) for g in got] == [type(e) for e in expected]
        assert got == expected
    assert this.cx_activation("this") is not None
    # Read under another name: the activation is rebuilt for that name.
    assert celenv.program("s0.score + 1").evaluate({"s0": this}) == 8
    assert celenv.program("s0.score + 2").evaluate({"s0": this}) == 9
    assert celenv.program("this.score + 3").evaluate({"this": this}) == 10
