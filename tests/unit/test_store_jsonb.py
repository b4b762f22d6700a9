"""``checks.jsonb``: a definition's long ``descriptorSetBase64`` is escaped once and reused, and
the stored text is exactly what ``json.dumps`` gives (scrubbed where PostgreSQL refuses)."""

from __future__ import annotations

import base64
import json

from protomolt_jobs.store import checks

B64 = base64.b64encode(bytes(range(256)) * 40).decode()  # ~13.6 KB, past the threshold


def _definition(b64: str = B64, **extra: object) -> dict:
    return {
        "name": "wf",
        "schema": {"descriptorSetBase64": b64},
        "inputType": "bench.v1.Doc",
        "steps": [{"name": "s0", "rules": ['title = "a \\" quote"'], "when": "input.n > 1"}],
        **extra,
    }


def _text(value: dict) -> str:
    return checks.jsonb("workflow_definition", value, dict).dumps(value)


def test_the_text_is_json_dumps_of_the_definition_first_and_again() -> None:
    d = _definition()
    assert _text(d) == json.dumps(d, allow_nan=False)
    again = _definition(b64=(B64 + " ")[:-1])  # an equal string, another object
    assert _text(again) == json.dumps(again, allow_nan=False)


def test_a_placeholder_lookalike_elsewhere_is_encoded_as_it_is() -> None:
    d = _definition(other={"descriptorSetBase64": ""}, note='{"descriptorSetBase64": ""}')
    assert _text(d) == json.dumps(d, allow_nan=False)


def test_a_nul_in_the_descriptor_set_or_elsewhere_is_still_scrubbed() -> None:
    in_set = _text(_definition(b64=B64 + "\x00"))
    assert "\\u0000" not in in_set and "\\ufffd" in in_set
    elsewhere = _text(_definition(name="a\x00b"))
    assert "\\u0000" not in elsewhere and json.loads(elsewhere)["name"] == "a\ufffdb"


def test_a_short_or_mixed_schema_is_encoded_as_always() -> None:
    short = _definition(b64="QUJD")
    assert _text(short) == json.dumps(short)
    mixed = _definition()
    mixed["schema"] = {"descriptorSetBase64": B64, "x": 1}
    assert _text(mixed) == json.dumps(mixed)


def test_the_stored_value_is_the_callers_object_only_when_it_decodes_back_to_itself() -> None:
    plain = _definition(n=1, f=1.5, flag=True, none=None, items=[1, "a", {"k": [2.0]}])
    assert checks.jsonb_value(checks.jsonb("d", plain, dict)) is plain
    odd = [
        {"t": (1, 2)},  # a tuple comes back a list
        {"k": {1: "a"}},  # an int key comes back a string
        {"f": 1e16},  # jsonb prints it without an exponent: an int comes back
        {"f": 1e-05},
        {"s": "a\x00b"},  # scrubbed
        {"k\ud800": 1},
    ]
    for value in odd:
        param = checks.jsonb("d", value, dict)
        got = checks.jsonb_value(param)
        assert got is not value
        assert got == json.loads(param.dumps(value))
