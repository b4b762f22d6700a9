"""The ``parse`` role: a small document parser for text and markdown, served in-process.

``ParseService/ParseDocument`` (``proto/ai/pipestream/proto/parse/v1/parse.proto``) turns one
document into a title, sections, paragraphs and a word count. It refuses, with a gRPC status:

- binary input (a NUL byte, or ``content`` bytes that are not UTF-8): ``INVALID_ARGUMENT``;
- input over :data:`MAX_DOCUMENT_BYTES` (1 MiB of UTF-8): ``RESOURCE_EXHAUSTED``;
- a ``mime_type`` other than text/plain or text/markdown: ``INVALID_ARGUMENT``.

The role requires ``registry``. At wire it contributes the service as the
:class:`~protomolt_jobs.hooks.contract.InProcessService` named ``parse`` (target
``inprocess:parse``, stable across restarts, so snapshotted job definitions keep working), the
parse file descriptor for the node's type pool, and stores two workflows in the registry's
repository: ``parse-document`` (one step calling ``ParseDocument``) and ``review-document``
(``parse``, then a human ``review`` step that parks the job until ``complete-step``).
"""

from __future__ import annotations

import base64
import logging
import re
from dataclasses import dataclass, field
from typing import Any

import grpc
from google.protobuf import descriptor_pb2

from protomolt_jobs.errors import ProtomoltJobsError
from protomolt_jobs.hooks.contract import (
    ComposerError,
    FileDescriptorContribution,
    InertMount,
    InProcessService,
    Mount,
    WireContext,
    WorkflowRepository,
)
from protomolt_jobs.hooks.hookspecs import hookimpl
from protomolt_jobs.pb.ai.pipestream.proto.parse.v1 import parse_pb2

__all__ = [
    "MAX_DOCUMENT_BYTES",
    "METHOD",
    "SERVICE_NAME",
    "TARGET",
    "WORKFLOW_NAME",
    "DocumentRefused",
    "ParseModule",
    "parse_descriptor_set",
    "parse_document_workflow",
    "parse_request",
    "parse_service_handler",
    "parse_text",
    "protomolt_role_module",
]

log = logging.getLogger("protomolt_jobs.parse")

#: Largest document accepted, in bytes of UTF-8.
MAX_DOCUMENT_BYTES = 1024 * 1024
SERVICE_NAME = "ai.pipestream.proto.parse.v1.ParseService"
#: The method a workflow step names.
METHOD = f"{SERVICE_NAME}/ParseDocument"
#: The in-process endpoint name and the target workflows use.
ENDPOINT = "parse"
TARGET = f"inprocess:{ENDPOINT}"
WORKFLOW_NAME = "parse-document"
#: parse, then a human review (an external step): the workflow a node can park on.
REVIEW_WORKFLOW_NAME = "review-document"

MARKDOWN = "text/markdown"
PLAIN = "text/plain"
_MIME_ALIASES = {
    "text/markdown": MARKDOWN,
    "text/x-markdown": MARKDOWN,
    "text/plain": PLAIN,
}
_MARKDOWN_SUFFIXES = (".md", ".markdown", ".mdown", ".mkd")


class DocumentRefused(ProtomoltJobsError, ValueError):
    """The parser will not parse this document; ``code`` is the gRPC status to answer with."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass
class _Section:
    heading: str
    level: int
    paragraphs: list[str] = field(default_factory=list)


_ATX = re.compile(r"^ {0,3}(#{1,6})(?:[ \t]+(.*?))?(?:[ \t]+#+)?[ \t]*$")
_SETEXT_1 = re.compile(r"^ {0,3}=+[ \t]*$")
_SETEXT_2 = re.compile(r"^ {0,3}-+[ \t]*$")
_FENCE = re.compile(r"^ {0,3}(```|~~~)")
_LINK = re.compile(r"!?\[([^\]]*)\]\([^)]*\)")
# Underscores inside a word (snake_case) are text, not emphasis.
_EMPHASIS = re.compile(r"(\*\*|\*|`|(?<!\w)__?|__?(?!\w))")
_LIST_MARK = re.compile(r"^\s*(?:[-*+]|\d+[.)])\s+")
_QUOTE_MARK = re.compile(r"^\s*>\s?")
_WORD = re.compile(r"\w+(?:['’]\w+)*")


def _inline(text: str) -> str:
    """Markdown inline markup to plain text: links keep their label, emphasis marks go."""
    text = _LINK.sub(r"\1", text)
    return _EMPHASIS.sub("", text)


def _markdown(text: str) -> tuple[str, list[_Section]]:
    sections: list[_Section] = [_Section("", 0)]
    lines: list[str] = []
    in_fence = False
    fence_lines: list[str] = []

    def flush() -> None:
        if lines:
            paragraph = " ".join(
                _inline(_QUOTE_MARK.sub("", _LIST_MARK.sub("", ln))).strip() for ln in lines
            )
            paragraph = " ".join(paragraph.split())
            if paragraph:
                sections[-1].paragraphs.append(paragraph)
            lines.clear()

    for raw in text.splitlines():
        if in_fence:
            if _FENCE.match(raw):
                in_fence = False
                code = "\n".join(fence_lines).strip("\n")
                if code.strip():
                    sections[-1].paragraphs.append(code)
                fence_lines.clear()
            else:
                fence_lines.append(raw.rstrip())
            continue
        if _FENCE.match(raw):
            flush()
            in_fence = True
            continue
        m = _ATX.match(raw)
        if m:
            flush()
            sections.append(_Section(_inline(m.group(2) or "").strip(), len(m.group(1))))
            continue
        if len(lines) == 1 and (_SETEXT_1.match(raw) or _SETEXT_2.match(raw)):
            heading = _inline(lines[0]).strip()
            lines.clear()
            sections.append(_Section(heading, 1 if _SETEXT_1.match(raw) else 2))
            continue
        if not raw.strip():
            flush()
            continue
        lines.append(raw)
    flush()
    if in_fence and any(ln.strip() for ln in fence_lines):
        sections[-1].paragraphs.append("\n".join(fence_lines).strip("\n"))
    headed = [s for s in sections if s.level > 0]
    title = next((s.heading for s in headed if s.level == 1 and s.heading), "")
    title = title or next((s.heading for s in headed if s.heading), "")
    if not title:
        title = next((_inline(ln).strip() for ln in text.splitlines() if ln.strip()), "")
    kept = [s for s in sections if s.level > 0 or s.paragraphs]
    return title, kept


def _plain(text: str) -> tuple[str, list[_Section]]:
    paragraphs: list[str] = []
    block: list[str] = []
    for raw in text.splitlines():
        if raw.strip():
            block.append(raw.rstrip())
        elif block:
            paragraphs.append("\n".join(block))
            block = []
    if block:
        paragraphs.append("\n".join(block))
    title = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
    return title, ([_Section("", 0, paragraphs)] if paragraphs else [])


def parse_text(
    text: str, mime_type: str = PLAIN, name: str = ""
) -> parse_pb2.ParseDocumentResponse:
    """Parse ``text`` as ``mime_type`` (``text/plain`` or ``text/markdown``).

    :param text: the document; already checked for size and NUL bytes (see :func:`parse_request`).
    :param mime_type: ``text/plain`` or ``text/markdown``.
    :param name: echoed into the answer.
    :returns: the ``ParseDocumentResponse``; the title is at most 200 characters.
    """
    title, sections = _markdown(text) if mime_type == MARKDOWN else _plain(text)
    paragraphs = [p for s in sections for p in s.paragraphs]
    body = "\n\n".join(paragraphs)
    words = len(_WORD.findall(" ".join([*(s.heading for s in sections), body])))
    return parse_pb2.ParseDocumentResponse(
        title=title[:200],
        sections=[
            parse_pb2.Section(heading=s.heading, level=s.level, paragraphs=s.paragraphs)
            for s in sections
        ],
        paragraphs=paragraphs,
        word_count=words,
        text=body,
        mime_type=mime_type,
        name=name,
    )


def _mime_of(request: parse_pb2.ParseDocumentRequest) -> str:
    given = request.mime_type.strip().lower()
    if given:
        mime = _MIME_ALIASES.get(given.split(";")[0].strip())
        if mime is None:
            raise DocumentRefused(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"mime_type must be text/plain or text/markdown; got '{request.mime_type}'",
            )
        return mime
    return MARKDOWN if request.name.lower().endswith(_MARKDOWN_SUFFIXES) else PLAIN


def parse_request(request: parse_pb2.ParseDocumentRequest) -> parse_pb2.ParseDocumentResponse:
    """Check and parse one request.

    :raises DocumentRefused: binary input or an unsupported mime type (INVALID_ARGUMENT),
        input over 1 MiB (RESOURCE_EXHAUSTED).
    """
    label = f"document '{request.name}'" if request.name else "the document"
    if request.text:
        size = len(request.text.encode("utf-8"))
        if size > MAX_DOCUMENT_BYTES:
            raise DocumentRefused(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"{label} is {size} bytes; the parser takes at most {MAX_DOCUMENT_BYTES}",
            )
        text = request.text
    else:
        raw = request.content
        if len(raw) > MAX_DOCUMENT_BYTES:
            raise DocumentRefused(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"{label} is {len(raw)} bytes; the parser takes at most {MAX_DOCUMENT_BYTES}",
            )
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise DocumentRefused(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"{label} is binary: its content is not UTF-8 text ({exc.reason} at byte "
                f"{exc.start})",
            ) from None
    if "\x00" in text:
        raise DocumentRefused(
            grpc.StatusCode.INVALID_ARGUMENT, f"{label} is binary: it contains NUL bytes"
        )
    return parse_text(text, _mime_of(request), request.name)


def _parse_document(request: parse_pb2.ParseDocumentRequest, context: grpc.ServicerContext) -> Any:
    try:
        return parse_request(request)
    except DocumentRefused as refused:
        log.info(
            "refused %s: %s",
            request.name or "a document",
            refused.message,
            extra={"action": "parse_refused", "document": request.name},
        )
        context.abort(refused.code, refused.message)


def parse_service_handler() -> grpc.GenericRpcHandler:
    """The generic gRPC handler serving ``ParseService``."""
    return grpc.method_handlers_generic_handler(
        SERVICE_NAME,
        {
            "ParseDocument": grpc.unary_unary_rpc_method_handler(
                _parse_document,
                request_deserializer=parse_pb2.ParseDocumentRequest.FromString,
                response_serializer=parse_pb2.ParseDocumentResponse.SerializeToString,
            )
        },
    )


def parse_descriptor_set() -> descriptor_pb2.FileDescriptorSet:
    """A FileDescriptorSet of the parse proto (it imports nothing)."""
    fds = descriptor_pb2.FileDescriptorSet()
    fds.file.add().ParseFromString(parse_pb2.DESCRIPTOR.serialized_pb)
    return fds


def parse_document_workflow(target: str = TARGET) -> dict[str, Any]:
    """The ``parse-document`` workflow: input ``ParseDocumentRequest``, one ``parse`` step.

    :param target: where ParseService is served (``inprocess:parse`` on a node).
    """
    schema = base64.b64encode(parse_descriptor_set().SerializeToString()).decode("ascii")
    return {
        "name": WORKFLOW_NAME,
        "schema": {"descriptorSetBase64": schema},
        "inputType": "ai.pipestream.proto.parse.v1.ParseDocumentRequest",
        "steps": [
            {
                "name": "parse",
                "target": target,
                "method": METHOD,
                "rules": [
                    "text = input.text",
                    "content = input.content",
                    "mime_type = input.mime_type",
                    "name = input.name",
                ],
            }
        ],
    }


def review_document_workflow(target: str = TARGET) -> dict[str, Any]:
    """The ``review-document`` workflow: ``parse``, then a human ``review`` step declared
    ``completion: "external"``: the job parks WAITING on ``review`` until ``complete-step``
    supplies a ``ReviewVerdict`` (``{"approved": bool, "note": str}``). Output:
    ``ReviewedDocument``.

    :param target: where ParseService is served (``inprocess:parse`` on a node). The review
        step names the same target, but an external step is never called.
    """
    workflow = parse_document_workflow(target)
    workflow["name"] = REVIEW_WORKFLOW_NAME
    workflow["steps"].append(
        {
            "name": "review",
            "target": target,
            "method": "ai.pipestream.proto.parse.v1.ReviewDesk/Review",
            "completion": "external",
            "rules": [
                "title = parse.title",
                "word_count = parse.word_count",
                "name = parse.name",
            ],
        }
    )
    workflow["output"] = {
        "type": "ai.pipestream.proto.parse.v1.ReviewedDocument",
        "rules": [
            "name = parse.name",
            "title = parse.title",
            "word_count = parse.word_count",
            "approved = review.approved",
            "note = review.note",
        ],
    }
    return workflow


class ParseModule:
    """The parse role: requires ``registry``; contributes the in-process ParseService, its
    descriptor and the ``parse-document`` and ``review-document`` workflows at wire."""

    role = "parse"
    requires: frozenset[str] = frozenset({"registry"})

    def wire(self, ctx: WireContext) -> Mount:
        """Contribute the service and descriptor; store ``parse-document`` in the registry.

        :raises ComposerError: no WorkflowRepository was contributed (registry not mounted).
        """
        repository = ctx.contributions.first(WorkflowRepository)
        if repository is None:
            raise ComposerError(
                "parse requires a co-mounted registry contributing a WorkflowRepository"
            )
        ctx.contributions.contribute(
            InProcessService, InProcessService(ENDPOINT, [parse_service_handler()])
        )
        ctx.contributions.contribute(
            FileDescriptorContribution,
            FileDescriptorContribution(parse_pb2.DESCRIPTOR.serialized_pb),
        )
        repository.put(WORKFLOW_NAME, parse_document_workflow())
        repository.put(REVIEW_WORKFLOW_NAME, review_document_workflow())
        log.info(
            "parse wired at %s",
            TARGET,
            extra={"action": "parse_wired", "target": TARGET},
        )
        return InertMount()


@hookimpl
def protomolt_role_module() -> ParseModule:
    """The parse role module (entry point ``protomolt.roles: parse``)."""
    return ParseModule()
