"""``sources`` schemas accept what upstream's compiler accepts: bare rpc types are resolved in
the package before protoc sees the text (protomolt_jobs/workflow/proto_sources.py)."""

from __future__ import annotations

import pytest

from protomolt_jobs.workflow import Runtime, WorkflowParseError, check, parse_workflow
from protomolt_jobs.workflow.proto_sources import qualify_rpc_types

# The schema of upstream's jobs test fixture (TestWorkflows.PROTO in the Java ProtoMolt: the
# same package, messages, fields and services), written out here. protoc alone refuses it:
# inside ReviewDesk, "Review" finds the method before the message.
UPSTREAM_JOBS_TEST_PROTO = """syntax = "proto3";
package jobs.test;

message Text { string text = 1; bool fail = 2; }
message Tokens { repeated int64 ids = 1; bool fail = 2; }
message Review { string notes = 1; int32 score = 2; }
message Vector { repeated double values = 1; }
message Embedding {
  string source_text = 1;
  repeated double vector = 2;
  string notes = 3;
}

service Tokenizer { rpc Tokenize(Text) returns (Tokens); }
service Embedder { rpc Embed(Tokens) returns (Vector); }
service ReviewDesk { rpc Review(Text) returns (Review); }
"""


def _workflow(sources: dict[str, str]) -> dict:
    # Upstream's three-step fixture workflow: tokenize -> review (external) -> embed.
    return {
        "name": "embed-text",
        "schema": {"sources": sources},
        "inputType": "jobs.test.Text",
        "steps": [
            {
                "name": "tokenize",
                "target": "127.0.0.1:1",
                "method": "jobs.test.Tokenizer/Tokenize",
                "rules": ["text = input.text", "fail = input.fail"],
            },
            {
                "name": "review",
                "target": "127.0.0.1:1",
                "method": "jobs.test.ReviewDesk/Review",
                "rules": ["text = input.text"],
                "completion": "external",
            },
            {
                "name": "embed",
                "target": "127.0.0.1:1",
                "method": "jobs.test.Embedder/Embed",
                "rules": ["ids = tokenize.ids", "fail = tokenize.fail"],
            },
        ],
        "output": {
            "type": "jobs.test.Embedding",
            "rules": ["source_text = input.text", "vector = embed.values", "notes = review.notes"],
        },
    }


def test_upstreams_jobs_test_proto_compiles_as_a_sources_schema():
    runtime = Runtime()
    wf = _workflow({"jobs/test/jobs.proto": UPSTREAM_JOBS_TEST_PROTO})
    compiled = parse_workflow(wf, runtime)
    review = compiled.steps[1]
    assert review.method.output_type.full_name == "jobs.test.Review"
    assert review.method.input_type.full_name == "jobs.test.Text"
    assert check(wf, runtime) == []


def test_the_rewrite_touches_only_bare_package_types_in_rpcs():
    text = (
        'syntax = "proto3";\npackage a.b;\n'
        "// rpc Review(Text) returns (Review); in a comment stays\n"
        "message Review { string s = 1; message Inner {} }\n"
        "message Text { Review r = 1; }\n"
        "service S {\n"
        "  rpc Review(Text) returns (stream Review);\n"
        "  rpc Other(.a.b.Text) returns (google.protobuf.Empty);\n"
        "  rpc Inner(Text) returns (Inner);\n"
        '  option deprecated = false; // "rpc X(Text) returns (Text)"\n'
        "}\n"
    )
    out = qualify_rpc_types({"x.proto": text})["x.proto"]
    assert "rpc Review(.a.b.Text) returns (stream .a.b.Review);" in out
    assert "rpc Other(.a.b.Text) returns (google.protobuf.Empty);" in out
    assert "rpc Inner(.a.b.Text) returns (Inner);" in out  # Inner is not top-level
    assert "// rpc Review(Text) returns (Review); in a comment stays" in out
    assert "message Text { Review r = 1; }" in out
    # Lines keep their numbers (protoc's error positions point into the caller's text).
    assert out.count("\n") == text.count("\n")


def test_messages_of_the_package_in_another_file_count():
    sources = {
        "m.proto": 'syntax = "proto3";\npackage p;\nmessage Review { string s = 1; }\n',
        "s.proto": (
            'syntax = "proto3";\npackage p;\nimport "m.proto";\n'
            "service D { rpc Review(Review) returns (Review); }\n"
        ),
    }
    out = qualify_rpc_types(sources)
    assert "rpc Review(.p.Review) returns (.p.Review);" in out["s.proto"]
    assert out["m.proto"] == sources["m.proto"]


def test_a_real_error_still_names_the_callers_line():
    bad = UPSTREAM_JOBS_TEST_PROTO.replace("returns (Vector)", "returns (Nope)")
    with pytest.raises(WorkflowParseError, match=r"jobs/test/jobs.proto:15:.*Nope"):
        parse_workflow(_workflow({"jobs/test/jobs.proto": bad}), Runtime())


@pytest.mark.parametrize(
    "name",
    [
        "@args.proto",  # protoc reads its arguments from the file args.proto
        "--descriptor_set_out=/tmp/x.proto",
        "-Iinclude.proto",
        "a/-b.proto",
        "a//b.proto",
        "./a.proto",
        "a b.proto",
        "a\nb.proto",
        ".proto",
    ],
)
def test_a_source_path_that_protoc_could_read_as_an_option_is_refused(tmp_path, name):
    # A path is handed to protoc as a command-line argument: "@args.proto" made protoc take
    # its arguments from another source file, among them "--plugin=protoc-gen-x=/bin/sh" and
    # "--x_out=;<command>;:dir", and check-workflow ran the command on the node.
    proof = tmp_path / "ran"
    args = f"--plugin=protoc-gen-evil=/bin/sh\n--evil_out=;touch {proof};:{tmp_path}\nt.proto\n"
    text = UPSTREAM_JOBS_TEST_PROTO
    wf = _workflow({"t.proto": text, "args.proto": args, name: text})
    wf["schema"]["root"] = name
    with pytest.raises(WorkflowParseError) as info:
        parse_workflow(wf, Runtime())
    assert "is not a relative .proto path" in info.value.message
    assert not proof.exists()


def test_nested_source_paths_with_dashes_dots_and_underscores_compile():
    wf = _workflow({"ai/pipe-stream/jobs_v1/test.v1.proto": UPSTREAM_JOBS_TEST_PROTO})
    assert check(wf, Runtime()) == []
