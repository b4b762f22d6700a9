"""parse_input's direct path for plain fields: it sets exactly what json_format.ParseDict
sets, and leaves to ParseDict everything else (with ParseDict's verdict and words)."""

from __future__ import annotations

from types import SimpleNamespace

from google.protobuf import json_format
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from protomolt_jobs.workflow import envelope
from protomolt_jobs.workflow.types import WorkflowParseError
from tests.support.rich import POOL, Rich

_KEYS = [
    "i32", "i64", "u32", "d", "b", "s", "raw", "color", "tags", "opt", "inner", "sv",
    "pick_s", "pickS", "pick_inner", "byname", "counts", "two_words", "twoWords", "zz",
]  # fmt: skip
_SCALARS = (
    st.integers(-(2**64), 2**64)
    | st.booleans()
    | st.text(alphabet="ab\u00e9\ud800 ", max_size=3)
    | st.none()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.sampled_from(["12", "RED", "1.0"])
)
_VALUES = _SCALARS | st.lists(_SCALARS, max_size=3)
WORKFLOW = SimpleNamespace(input_type=Rich.DESCRIPTOR, pool=POOL)


def _parse(data, *, direct: bool, ignore_unknown: bool):
    saved = envelope._parse_plain
    if not direct:
        envelope._parse_plain = lambda *_: False
    try:
        msg = envelope.parse_input(WORKFLOW, data, ignore_unknown_fields=ignore_unknown)
        return ("ok", msg.SerializeToString(deterministic=True))
    except WorkflowParseError as exc:
        return ("error", exc.message)
    except Exception as exc:  # noqa: BLE001 - e.g. upb's SystemError on an enum name "\ud800"
        return ("raised", type(exc).__name__)
    finally:
        envelope._parse_plain = saved


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.dictionaries(st.sampled_from(_KEYS), _VALUES, max_size=5), ignore=st.booleans())
def test_the_direct_path_parses_as_parse_dict(data, ignore):
    assert _parse(data, direct=True, ignore_unknown=ignore) == _parse(
        data, direct=False, ignore_unknown=ignore
    )


def test_plain_inputs_take_the_direct_path():
    data = {"i32": -3, "i64": 2**40, "b": True, "s": "x", "tags": ["a", "b"], "twoWords": 2}
    msg = Rich()
    assert envelope._parse_plain(data, msg)
    expected = json_format.ParseDict(data, Rich())
    assert msg == expected
    refused_inputs = (
        {"zz": 1},  # unknown (ParseDict refuses or ignores it)
        {"s": None},
        {"i64": "5"},
        {"i32": 2**40},  # out of range
        {"s": "\u00e9"},  # not ASCII: ParseDict checks for unpaired surrogates
        {"u32": 1},  # proto3 optional: a (synthetic) oneof member
        {"pickS": "p"},  # a oneof member
    )
    for refused in refused_inputs:
        assert not envelope._parse_plain(refused, Rich()), refused


def test_plans_are_per_type():
    plan = envelope._input_plan(Rich.DESCRIPTOR)
    assert plan is not None
    assert plan["twoWords"] == plan["two_words"] == ("two_words", envelope._K_INT, False)
    assert plan["tags"] == ("tags", envelope._K_STR, True)
    for name in ("inner", "opt", "pick_s", "pickS"):  # a message; oneof members
        assert name not in plan
    assert envelope._input_plan(Rich.DESCRIPTOR) is plan
    from google.protobuf import struct_pb2

    assert envelope._input_plan(struct_pb2.Struct.DESCRIPTOR) is None


def test_an_enum_named_by_a_lone_surrogate_is_refused_as_input():
    # upb's lookup of the enum name raises SystemError; the submit door must still answer
    # invalid-input naming 'input' (found by the helper that built the direct path).
    for direct in (True, False):
        outcome = _parse({"color": "\ud800"}, direct=direct, ignore_unknown=False)
        assert outcome[0] == "error", outcome
        assert outcome[1].startswith("'input' is not valid proto3 JSON for"), outcome
