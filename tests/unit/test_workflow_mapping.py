"""Mapping rules and CEL values without any service: parsing, reads, writes, conversions."""

from __future__ import annotations

import pytest
from celpy import celtypes
from google.protobuf import descriptor_pb2, message_factory, struct_pb2
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from protomolt_jobs.workflow import cel, mapping
from tests.support.grpc_servers import message_class
from tests.support.rich import Rich, rich_messages, rich_pool

Text = message_class("jobs.test.Text")
Tokens = message_class("jobs.test.Tokens")
Summary = message_class("jobs.test.Summary")
FieldProto = descriptor_pb2.FieldDescriptorProto


def apply(msg, *rules, **scope):
    parsed = [r for r in (mapping.parse_text_rule(x) for x in rules) if r is not None]
    mapping.apply_text_rules(msg, parsed, scope)
    return msg


# -- parsing -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "op", "target", "source"),
    [
        ("a = b.c", "assign", ("a",), ("b", "c")),
        ("  a.b += x ", "append", ("a", "b"), ("x",)),
        ("-a.b", "clear", ("a", "b"), None),
        ('t = "a = b"', "assign", ("t",), mapping._Literal("a = b")),
        ("n = -12", "assign", ("n",), mapping._Literal(-12)),
        ("r = 0.5", "assign", ("r",), mapping._Literal(0.5)),
        ("f = false", "assign", ("f",), mapping._Literal(False)),
        ("z = null", "assign", ("z",), mapping._Literal(None)),
        ("n = 1.", "assign", ("n",), ("1", "")),  # "1." is no number: a (bad) path
    ],
)
def test_rule_grammar(text, op, target, source):
    rule = mapping.parse_text_rule(text)
    assert (rule.op, rule.target, rule.source, rule.error) == (op, target, source, "")


@pytest.mark.parametrize("text", ["a", "= b", "a =", "a += ", "-"])
def test_malformed_rules_keep_the_reference_error(text):
    rule = mapping.parse_text_rule(text)
    assert rule.error == (
        "Rule is not 'target = source.path', 'target += source.path', or '-target' "
        f"(Rule: '{text.strip()}')"
    )
    with pytest.raises(mapping.MappingError):
        mapping.apply_text_rules(Text(), [rule], {})


def test_blank_rules_are_skipped():
    assert mapping.parse_text_rule("   ") is None


# -- reads and writes ----------------------------------------------------------------------------


def test_unknown_source_names_the_scope():
    with pytest.raises(mapping.MappingError) as info:
        apply(Text(), "text = later.text", input=Text(text="x"))
    assert str(info.value) == (
        "Unknown source 'later'; the scope has [input] (Rule: 'text = later.text')"
    )


def test_unknown_field_and_bad_traversal():
    with pytest.raises(mapping.MappingError, match="Field 'nope' not found in message 'Text'"):
        apply(Text(), "text = input.nope", input=Text(text="x"))
    with pytest.raises(
        mapping.MappingError, match="traverse through non-message or repeated field 'text'"
    ):
        apply(Text(), "text = input.text.more", input=Text(text="x"))


def test_whole_message_source_and_struct_keys():
    src = Tokens(text="t", ids=[1, 2])
    src.meta.update({"a": {"b": "deep"}, "n": 3})
    out = apply(
        Summary(),
        "ids = tok.ids",
        "note = tok.meta.a.b",
        "tier = tok.meta.missing",  # absent at the end: skipped
        "meta = tok",  # a whole message into a Struct: its proto3 JSON
        tok=src,
    )
    assert list(out.ids) == [1, 2]
    assert out.note == "deep"
    assert out.tier == ""
    assert dict(out.meta)["text"] == "t"
    with pytest.raises(mapping.MappingError, match="key 'x' not found in struct"):
        apply(Summary(), "note = tok.meta.x.y", tok=src)


def test_unset_intermediate_message_is_absent():
    out = apply(Summary(note="keep"), "note = input.meta.key", input=Text())
    assert out.note == "keep"


def test_list_assign_replaces_and_append_extends():
    out = Tokens(ids=[9])
    apply(out, "ids = src.ids", src=Tokens(ids=[1, 2]))
    assert list(out.ids) == [1, 2]
    apply(out, "ids += src.ids", "ids += 5", src=Tokens(ids=[3]))
    assert list(out.ids) == [1, 2, 3, 5]
    apply(out, "ids = src.ids", src=Tokens())
    assert list(out.ids) == []


def test_append_to_singular_and_assign_scalar_to_repeated_fail():
    with pytest.raises(mapping.MappingError, match="Cannot append: field 'text' is not repeated"):
        apply(Tokens(), "text += 1")
    with pytest.raises(mapping.MappingError, match="use \\+= to append"):
        apply(Tokens(), "ids = 1")


def test_null_clears_and_clear_through_unset_parent_is_a_noop():
    out = apply(Text(text="x", lang="en"), "text = null", "-lang", "-meta.a")
    assert out.text == "" and out.lang == ""
    assert not out.HasField("meta")


def test_struct_append_turns_a_key_into_a_list():
    out = apply(Text(), 'meta.tags = "a"', 'meta.tags += "b"', "meta.tags += 3")
    assert list(out.meta["tags"]) == ["a", "b", 3.0]


# -- conversions -------------------------------------------------------------------------------


def test_integer_conversions_are_exact():
    assert apply(Tokens(), "count = 7.0").count == 7
    assert apply(Tokens(), 'count = "12"').count == 12
    with pytest.raises(mapping.MappingError, match="cannot be represented exactly as int32"):
        apply(Tokens(), "count = 1.5")
    with pytest.raises(mapping.MappingError, match="out of int32 range"):
        apply(Tokens(), "count = 3000000000")
    with pytest.raises(mapping.MappingError, match="Cannot parse 'many' as int32"):
        apply(Tokens(), 'count = "many"')


def test_string_and_bool_conversions():
    assert apply(Text(), "text = 42").text == "42"
    assert apply(Text(), "text = true").text == "true"
    assert apply(Text(), 'fail = "TRUE"').fail is True
    assert apply(Text(), 'fail = "yes"').fail is False
    with pytest.raises(mapping.MappingError, match="field type STRING"):
        apply(Text(), "text = src", src=Tokens())


def test_enum_conversions():
    f = FieldProto()
    rule = mapping.parse_text_rule('type = "TYPE_STRING"')
    mapping.apply_text_rules(f, [rule], {})
    assert f.type == FieldProto.TYPE_STRING
    mapping.apply_text_rules(f, [mapping.parse_text_rule("type = 5")], {})
    assert f.type == 5
    copy = FieldProto()
    mapping.apply_text_rules(copy, [mapping.parse_text_rule("type = src.type")], {"src": f})
    assert copy.type == 5
    named = FieldProto()
    mapping.apply_text_rules(named, [mapping.parse_text_rule("name = src.type")], {"src": f})
    assert named.name == "TYPE_INT32"
    with pytest.raises(mapping.MappingError, match="give a value name or a defined number"):
        mapping.apply_text_rules(f, [mapping.parse_text_rule("type = 999")], {})


# -- CEL rules and fallbacks -------------------------------------------------------------------


def test_cel_rules_see_the_message_being_built():
    out = Tokens()
    rules = [
        mapping.CelRule(target="ids", selector="[1, 2, 3]"),
        mapping.CelRule(target="count", selector="size(target.ids)"),
        mapping.CelRule(target="text", filter="target.count > 2", selector="input.text.trim()"),
        mapping.CelRule(target="meta.k", selector="{'x': 1}"),
    ]
    scope = {"input": cel.message_to_cel(Text(text="  padded  "))}
    mapping.apply_cel_rules(out, rules, scope)
    assert list(out.ids) == [1, 2, 3]
    assert out.count == 3
    assert out.text == "padded"
    assert dict(out.meta["k"]) == {"x": 1.0}


def test_cel_rule_errors_are_mapping_errors():
    with pytest.raises(mapping.MappingError, match="Failed to evaluate CEL expression: input.nope"):
        mapping.apply_cel_rules(
            Tokens(),
            [mapping.CelRule(target="text", selector="input.nope")],
            {"input": cel.message_to_cel(Text())},
        )
    with pytest.raises(mapping.MappingError, match="did not return a boolean"):
        mapping.apply_cel_rules(
            Tokens(), [mapping.CelRule(target="text", filter="1", selector="'x'")], {}
        )


def test_fallback_rules_are_relative_to_the_built_message():
    out = Text(text="body")
    mapping.apply_cel_rules(out, [mapping.CelRule(target="lang", fallback=("lang = text",))], {})
    assert out.lang == "body"
    with pytest.raises(mapping.MappingError, match="Failed to execute rule: lang = meta.x"):
        mapping.apply_cel_rules(
            out, [mapping.CelRule(target="lang", fallback=("lang = meta.x",))], {}
        )
    assert out.lang == "body"
    with pytest.raises(mapping.MappingError, match="Invalid rule syntax"):
        mapping.apply_unscoped_rules(out, ["no rule here"])


def test_fallback_null_source_clears():
    out = Text(text="body", lang="en")
    mapping.apply_unscoped_rules(out, ["lang = null"])
    assert out.lang == ""


# -- CEL values ----------------------------------------------------------------------------------


def test_message_to_cel_shape():
    msg = Tokens(ids=[2**40], text="t", count=0)
    value = cel.message_to_cel(msg)
    assert value[celtypes.StringType("ids")] == [celtypes.IntType(2**40)]
    assert value[celtypes.StringType("count")] == 0  # implicit presence: always there
    assert celtypes.StringType("meta") not in value  # unset message: absent (has() is false)
    msg.meta.update({"k": [1, "x"]})
    value = cel.message_to_cel(msg)
    assert value[celtypes.StringType("meta")] == {"k": [1.0, "x"]}
    assert cel.evaluate("has(t.meta) && t.ids[0] + 1 > 2", {"t": value}) is not None
    assert cel.evaluate_bool("has(t.meta) && t.ids[0] + 1 > 2", {"t": value}) is True


def test_struct_value_and_wrappers():
    assert cel.message_to_cel(struct_pb2.Value(string_value="s")) == "s"
    lv = struct_pb2.ListValue()
    lv.extend([1, True])
    assert cel.message_to_cel(lv) == [1.0, True]


@pytest.mark.parametrize(
    ("expr", "expected"),
    [
        ("'Hello'.lowerAscii()", "hello"),
        ("'Hello'.upperAscii()", "HELLO"),
        ("'  x '.trim()", "x"),
        ("'a-b-c'.replace('-', '+')", "a+b+c"),
        ("'a,b,c'.split(',')", ["a", "b", "c"]),
        ("'hello'.substring(1, 3)", "el"),
        ("'hello'.charAt(1)", "e"),
        ("'hello'.indexOf('l')", 2),
        ("'hello'.lastIndexOf('l')", 3),
        ("['a', 'b'].join('-')", "a-b"),
    ],
)
def test_strings_extension(expr, expected):
    assert cel.from_cel(cel.evaluate(expr, {})) == expected


def test_blank_and_invalid_expressions():
    with pytest.raises(cel.CelError, match="CEL expression must not be blank"):
        cel.compile_expression("  ")
    with pytest.raises(cel.CelError, match="Invalid CEL expression"):
        cel.compile_expression("a +")
    with pytest.raises(cel.CelError) as info:
        cel.evaluate("nobody.here", {})
    assert "undeclared reference to 'nobody'" in str(info.value)
    assert "activation" not in str(info.value)  # cel-python's dump is trimmed


# -- direct copies (same-typed scalar rules) ---------------------------------------------------

_RICH_FIELDS = ["i32", "i64", "u32", "d", "b", "s", "raw", "color", "tags", "opt", "inner", "sv"]


def _outcome(target, rules, scope, *, direct: bool):
    saved = mapping._direct_copy
    if not direct:
        mapping._direct_copy = lambda *_: None
    try:
        parsed = [mapping.parse_text_rule(r) for r in rules]
        mapping.apply_text_rules(target, parsed, scope)
        return ("ok", target.SerializeToString(deterministic=True))
    except Exception as exc:  # noqa: BLE001 - MappingError, or protobuf's own ValueError
        return ("error", type(exc).__name__, str(exc), target.SerializeToString(deterministic=True))
    finally:
        mapping._direct_copy = saved


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    source=rich_messages(),
    start=rich_messages(),
    pairs=st.lists(
        st.tuples(
            st.sampled_from(_RICH_FIELDS),
            st.sampled_from(_RICH_FIELDS),
            st.sampled_from(["a", "self"]),
        ),
        min_size=1,
        max_size=4,
    ),
)
def test_direct_copies_do_what_the_general_path_does(source, start, pairs):
    rules = [f"{dst} = {name}.{src}" for dst, src, name in pairs]
    outcomes = []
    for direct in (False, True):
        target = Rich()
        target.CopyFrom(start)  # set fields show whether a zero source skips the rule
        outcomes.append(_outcome(target, rules, {"a": source, "self": target}, direct=direct))
    assert outcomes[0] == outcomes[1], rules


def test_direct_copy_plans_are_per_source_and_target_type():
    rule = mapping.parse_text_rule("text = a.text")
    # Text.text and Tokens.text are strings: a direct copy; Rich has no "text" field.
    assert mapping._direct_copy(rule, Text(), {"a": Tokens(text="x")}) is not None
    assert mapping._direct_copy(rule, Text(), {"a": Rich()}) is None
    with pytest.raises(mapping.MappingError, match="Field 'text' not found in message 'Rich'"):
        mapping.apply_text_rules(Text(), [rule], {"a": Rich()})
    out = Text()
    mapping.apply_text_rules(out, [rule], {"a": Tokens(text="y")})
    assert out.text == "y"
    # The same type name from another pool has its own descriptor, so its own plan.
    copy_s = mapping.parse_text_rule("s = a.s")
    other = message_factory.GetMessageClass(
        rich_pool(extra_field=True).FindMessageTypeByName("t.Rich")
    )
    assert mapping._direct_copy(copy_s, Rich(), {"a": Rich()}) is not None
    assert mapping._direct_copy(copy_s, other(), {"a": other()}) is not None
    assert mapping._copies[id(copy_s)][1] is other.DESCRIPTOR
    assert (
        mapping._direct_copy(mapping.parse_text_rule("i32 = a.i64"), Rich(), {"a": Rich()}) is None
    )
