"""The CEL runtime (workflow/celenv.py): compiled evaluation, the interpreter's errors, threads."""

from __future__ import annotations

import threading

import pytest
from celpy import celtypes
from celpy.evaluation import CELEvalError

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
