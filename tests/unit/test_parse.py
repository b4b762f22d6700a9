"""The parse role's document parser, without a server."""

from __future__ import annotations

import grpc
import pytest

from protomolt_jobs.host.parse import (
    MAX_DOCUMENT_BYTES,
    METHOD,
    TARGET,
    DocumentRefused,
    parse_document_workflow,
    parse_request,
    parse_text,
)
from protomolt_jobs.pb.ai.pipestream.proto.parse.v1 import parse_pb2

MARKDOWN = """Intro before any heading.

# The Title

First *emphasised* paragraph with a [link](http://example.com)
that continues on a second line.

## Details
- item one
- item two

```
code_block = 1
```

Setext heading
--------------
Last paragraph about snake_case names.
"""


def test_markdown_title_sections_paragraphs_and_words():
    doc = parse_text(MARKDOWN, "text/markdown", "a.md")
    assert doc.title == "The Title"
    assert [(s.heading, s.level) for s in doc.sections] == [
        ("", 0),
        ("The Title", 1),
        ("Details", 2),
        ("Setext heading", 2),
    ]
    assert list(doc.sections[1].paragraphs) == [
        "First emphasised paragraph with a link that continues on a second line."
    ]
    assert list(doc.sections[2].paragraphs) == ["item one item two", "code_block = 1"]
    assert list(doc.paragraphs) == [p for s in doc.sections for p in s.paragraphs]
    assert doc.text == "\n\n".join(doc.paragraphs)
    assert "snake_case" in doc.text
    # headings count as words; markup, URLs and list markers do not
    # headings 2 + 1 + 2; paragraphs 4 + 12 + 4 + 2 + 5
    assert doc.word_count == 5 + 27
    assert (doc.mime_type, doc.name) == ("text/markdown", "a.md")


def test_markdown_title_falls_back_to_first_heading_then_first_line():
    assert parse_text("## Only level two\n\ntext", "text/markdown").title == "Only level two"
    assert parse_text("no headings\nat all", "text/markdown").title == "no headings"


def test_plain_text_paragraphs_keep_their_lines():
    doc = parse_text("  Title line\nsecond\n\n\nnext para\n", "text/plain")
    assert doc.title == "Title line"
    assert list(doc.paragraphs) == ["  Title line\nsecond", "next para"]
    assert len(doc.sections) == 1 and doc.sections[0].level == 0
    assert doc.word_count == 5


def test_empty_document_is_parsed_not_refused():
    doc = parse_request(parse_pb2.ParseDocumentRequest(text="", name="e.txt"))
    assert (doc.title, doc.word_count, list(doc.paragraphs)) == ("", 0, [])


@pytest.mark.parametrize(
    ("name", "mime", "expected"),
    [
        ("a.md", "", "text/markdown"),
        ("a.MARKDOWN", "", "text/markdown"),
        ("a.txt", "", "text/plain"),
        ("noext", "", "text/plain"),
        ("a.txt", "text/x-markdown", "text/markdown"),
        ("a.md", "text/plain; charset=utf-8", "text/plain"),
    ],
)
def test_mime_type_from_request_or_name(name, mime, expected):
    req = parse_pb2.ParseDocumentRequest(text="# h\n\nbody", name=name, mime_type=mime)
    assert parse_request(req).mime_type == expected


def _refusal(request):
    with pytest.raises(DocumentRefused) as info:
        parse_request(request)
    return info.value


def test_unsupported_mime_type_is_invalid_argument():
    err = _refusal(parse_pb2.ParseDocumentRequest(text="x", mime_type="application/pdf"))
    assert err.code == grpc.StatusCode.INVALID_ARGUMENT
    assert "application/pdf" in err.message


@pytest.mark.parametrize(
    "request_",
    [
        parse_pb2.ParseDocumentRequest(text="abc\x00def", name="n.txt"),
        parse_pb2.ParseDocumentRequest(content=b"abc\x00def", name="n.txt"),
        parse_pb2.ParseDocumentRequest(content=b"\xff\xfe\x00\x01binary", name="n.bin"),
        parse_pb2.ParseDocumentRequest(content="caf\u00e9".encode("latin-1")),
    ],
)
def test_binary_input_is_invalid_argument(request_):
    err = _refusal(request_)
    assert err.code == grpc.StatusCode.INVALID_ARGUMENT
    assert "binary" in err.message


def test_utf8_content_bytes_are_parsed():
    doc = parse_request(parse_pb2.ParseDocumentRequest(content="Caf\u00e9 ol\u00e9".encode()))
    assert doc.title == "Caf\u00e9 ol\u00e9"
    assert doc.word_count == 2


@pytest.mark.parametrize("field", ["text", "content"])
def test_oversized_input_is_resource_exhausted(field):
    big = "a" * (MAX_DOCUMENT_BYTES + 1)
    value = big if field == "text" else big.encode()
    err = _refusal(parse_pb2.ParseDocumentRequest(**{field: value}))
    assert err.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert str(MAX_DOCUMENT_BYTES) in err.message


def test_exactly_the_limit_is_accepted():
    doc = parse_request(parse_pb2.ParseDocumentRequest(text="a" * MAX_DOCUMENT_BYTES))
    assert doc.word_count == 1


def test_parse_document_workflow_shape():
    wf = parse_document_workflow()
    assert wf["name"] == "parse-document"
    assert wf["inputType"] == "ai.pipestream.proto.parse.v1.ParseDocumentRequest"
    assert [s["name"] for s in wf["steps"]] == ["parse"]
    assert wf["steps"][0]["target"] == TARGET == "inprocess:parse"
    assert wf["steps"][0]["method"] == METHOD
    assert "descriptorSetBase64" in wf["schema"]
