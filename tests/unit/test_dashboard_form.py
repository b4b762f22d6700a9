"""The dashboard's complete-step form: fields from a message type, answers from the form."""

from __future__ import annotations

from google.protobuf import descriptor_pb2, struct_pb2, wrappers_pb2

from protomolt_jobs.host.dashboard.answer_form import answer_from_form as _answer_from_form
from protomolt_jobs.host.dashboard.answer_form import form_field as _form_field


def test_fields_follow_the_answer_type():
    kinds = {
        f.name: _form_field(f)["kind"]
        for f in descriptor_pb2.FieldDescriptorProto.DESCRIPTOR.fields
    }
    assert kinds["name"] == "text"
    assert kinds["number"] == "integer"
    assert kinds["type"] == "enum"
    assert kinds["options"] == "json"  # a message
    assert kinds["proto3_optional"] == "bool"
    enum = _form_field(descriptor_pb2.FieldDescriptorProto.DESCRIPTOR.fields_by_name["label"])
    assert "LABEL_REPEATED" in enum["options"]
    assert _form_field(struct_pb2.ListValue.DESCRIPTOR.fields_by_name["values"])["kind"] == "json"
    assert (
        _form_field(wrappers_pb2.DoubleValue.DESCRIPTOR.fields_by_name["value"])["kind"] == "number"
    )


def test_answers_are_typed_and_what_does_not_read_is_passed_for_the_verb_to_refuse():
    fields = [
        {"name": "approved", "kind": "bool"},
        {"name": "count", "kind": "integer"},
        {"name": "score", "kind": "number"},
        {"name": "meta", "kind": "json"},
        {"name": "note", "kind": "text"},
        {"name": "label", "kind": "enum"},
    ]
    form = {"count": " 12 ", "score": "0.5", "meta": '{"a": [1]}', "note": "fine", "label": ""}
    assert _answer_from_form(fields, form) == {
        "approved": False,
        "count": 12,
        "score": 0.5,
        "meta": {"a": [1]},
        "note": "fine",
    }
    wrong = {"approved": "on", "count": "eleven", "score": "x", "meta": "{not json"}
    assert _answer_from_form(fields, wrong) == {
        "approved": True,
        "count": "eleven",
        "score": "x",
        "meta": "{not json",
    }


def test_json_nested_past_the_parser_is_passed_as_text_not_raised():
    # json.loads raises RecursionError (not ValueError) on deep nesting: the page answered 500.
    deep = "[" * 100_000
    assert _answer_from_form([{"name": "labels", "kind": "json"}], {"labels": deep}) == {
        "labels": deep
    }
