"""Small, real gRPC services for the demo: a tokenizer, an embedder and a review desk.

No model is downloaded: the tokenizer lower-cases words and maps each to a stable id (CRC32),
the embedder hashes ids into a fixed-size bag-of-ids vector and L2-normalises it. They are
real gRPC servers on a loopback port, so the demo's jobs make real calls, and the review
desk is the type of the demo's external (parked) step.

The contract (``protomolt.demo.v1``) is compiled at run time with ``grpc_tools.protoc``; the
demo workflow's schema is one FileDescriptorSet holding it and the parse role's proto.
"""

from __future__ import annotations

import base64
import importlib.resources
import math
import re
import tempfile
import threading
import zlib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from protomolt_jobs.host import parse

__all__ = [
    "DEMO_PROTO",
    "DEMO_PROTO_PATH",
    "DemoServices",
    "demo_descriptor_set",
    "demo_workflow",
    "embed",
    "tokenize",
]

DEMO_PROTO_PATH = "protomolt/demo/v1/demo.proto"

#: The demo's contract.
DEMO_PROTO = """\
syntax = "proto3";

package protomolt.demo.v1;

// Text to split into tokens.
message TokenizeRequest {
  string text = 1;
}

// Token ids of a text (at most 4096), and how many tokens the text had.
message Tokens {
  repeated int64 ids = 1;
  int32 count = 2;
}

// Token ids to embed.
message EmbedRequest {
  repeated int64 ids = 1;
}

// A unit-length embedding.
message Embedding {
  repeated float values = 1;
  int32 dims = 2;
}

// What a reviewer sees.
message ReviewRequest {
  string title = 1;
  int32 word_count = 2;
  int32 token_count = 3;
}

// A reviewer's answer: the demo's external step.
message ReviewVerdict {
  bool approved = 1;
  string note = 2;
}

// The demo workflow's output.
message DocumentSummary {
  string name = 1;
  string title = 2;
  int32 word_count = 3;
  int32 token_count = 4;
  int32 dims = 5;
  bool approved = 6;
  string note = 7;
}

service Tokenizer {
  rpc Tokenize(TokenizeRequest) returns (Tokens);
}

service Embedder {
  rpc Embed(EmbedRequest) returns (Embedding);
}

service ReviewDesk {
  rpc Review(ReviewRequest) returns (ReviewVerdict);
}
"""

MAX_TOKEN_IDS = 4096
EMBEDDING_DIMS = 32
_VOCABULARY = 50_000
_WORD = re.compile(r"\w+(?:['’]\w+)*")

_compiled_lock = threading.Lock()
_compiled: descriptor_pb2.FileDescriptorProto | None = None


def _compile_demo_proto() -> descriptor_pb2.FileDescriptorProto:
    global _compiled
    with _compiled_lock:
        if _compiled is not None:
            return _compiled
        from grpc_tools import protoc

        with tempfile.TemporaryDirectory(prefix="pmj-demo-") as tmp:
            src = Path(tmp) / DEMO_PROTO_PATH
            src.parent.mkdir(parents=True)
            src.write_text(DEMO_PROTO)
            out = Path(tmp) / "demo.pb"
            wkt = str(importlib.resources.files("grpc_tools") / "_proto")
            code = protoc.main(
                ["protoc", f"-I{tmp}", f"-I{wkt}", f"--descriptor_set_out={out}", DEMO_PROTO_PATH]
            )
            if code != 0:
                raise RuntimeError("the demo proto did not compile (grpc_tools.protoc)")
            fds = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes())
        _compiled = fds.file[0]
        return _compiled


def demo_descriptor_set() -> descriptor_pb2.FileDescriptorSet:
    """The demo workflow's schema: the parse proto and the demo proto."""
    fds = parse.parse_descriptor_set()
    fds.file.add().CopyFrom(_compile_demo_proto())
    return fds


def tokenize(text: str) -> tuple[list[int], int]:
    """Stable token ids of ``text``: ``(ids[:4096], total token count)``."""
    words = _WORD.findall(text.lower())
    ids = [zlib.crc32(w.encode("utf-8")) % _VOCABULARY + 1 for w in words[:MAX_TOKEN_IDS]]
    return ids, len(words)


def embed(ids: list[int], dims: int = EMBEDDING_DIMS) -> list[float]:
    """A unit-length bag-of-ids vector of ``dims`` floats (all zeros for no ids)."""
    vector = [0.0] * dims
    for i in ids:
        h = zlib.crc32(int(i).to_bytes(8, "little", signed=True))
        vector[h % dims] += 1.0 if (h >> 16) & 1 else -1.0
    norm = math.sqrt(sum(v * v for v in vector))
    return [v / norm for v in vector] if norm else vector


class DemoServices:
    """The three demo services on one loopback port.

    :param host: bind address (loopback by default).
    :param port: 0 picks a free port.
    :param max_workers: concurrent calls served.
    """

    def __init__(self, host: str = "127.0.0.1", port: int = 0, max_workers: int = 32) -> None:
        self.host = host
        self._requested_port = port
        self.max_workers = max_workers
        self._server: grpc.Server | None = None
        self.port = 0
        self.calls: dict[str, int] = {"Tokenize": 0, "Embed": 0, "Review": 0}
        self._lock = threading.Lock()
        pool = descriptor_pool.DescriptorPool()
        pool.Add(_compile_demo_proto())
        self._types = {
            name: message_factory.GetMessageClass(
                pool.FindMessageTypeByName(f"protomolt.demo.v1.{name}")
            )
            for name in (
                "TokenizeRequest",
                "Tokens",
                "EmbedRequest",
                "Embedding",
                "ReviewRequest",
                "ReviewVerdict",
            )
        }

    @property
    def target(self) -> str:
        """``HOST:PORT`` of the running services."""
        return f"{self.host}:{self.port}"

    def _count(self, method: str) -> None:
        with self._lock:
            self.calls[method] += 1

    def _tokenize(self, request: Any, context: grpc.ServicerContext) -> Any:
        self._count("Tokenize")
        ids, count = tokenize(request.text)
        return self._types["Tokens"](ids=ids, count=count)

    def _embed(self, request: Any, context: grpc.ServicerContext) -> Any:
        self._count("Embed")
        values = embed(list(request.ids))
        return self._types["Embedding"](values=values, dims=len(values))

    def _review(self, request: Any, context: grpc.ServicerContext) -> Any:
        self._count("Review")
        return self._types["ReviewVerdict"](
            approved=True, note="auto-approved by the demo review desk"
        )

    def _handler(
        self, service: str, method: str, fn: Any, req: str, resp: str
    ) -> grpc.GenericRpcHandler:
        return grpc.method_handlers_generic_handler(
            f"protomolt.demo.v1.{service}",
            {
                method: grpc.unary_unary_rpc_method_handler(
                    fn,
                    request_deserializer=self._types[req].FromString,
                    response_serializer=self._types[resp].SerializeToString,
                )
            },
        )

    def start(self) -> DemoServices:
        """Bind and serve; returns once the port is bound. Idempotent."""
        if self._server is not None:
            return self
        server = grpc.server(
            ThreadPoolExecutor(max_workers=self.max_workers, thread_name_prefix="demo-grpc")
        )
        server.add_generic_rpc_handlers(
            (
                self._handler("Tokenizer", "Tokenize", self._tokenize, "TokenizeRequest", "Tokens"),
                self._handler("Embedder", "Embed", self._embed, "EmbedRequest", "Embedding"),
                self._handler(
                    "ReviewDesk", "Review", self._review, "ReviewRequest", "ReviewVerdict"
                ),
            )
        )
        port = server.add_insecure_port(f"{self.host}:{self._requested_port}")
        if port == 0:
            raise RuntimeError(
                f"cannot bind the demo services on {self.host}:{self._requested_port}"
            )
        server.start()
        self._server, self.port = server, port
        return self

    def stop(self, grace_s: float = 1.0) -> None:
        """Stop serving. Idempotent."""
        server, self._server = self._server, None
        if server is not None:
            server.stop(grace_s).wait(grace_s + 5)


def demo_workflow(
    services_target: str, *, name: str = "demo-document", parse_target: str = parse.TARGET
) -> dict[str, Any]:
    """The demo workflow: parse -> tokenize -> embed -> review (external), with an output.

    :param services_target: ``HOST:PORT`` of :class:`DemoServices`.
    :param name: the workflow's name.
    :param parse_target: where ParseService is served (``inprocess:parse`` on a node).
    :returns: the workflow JSON envelope; its input type is ``ParseDocumentRequest``.
    """
    schema = base64.b64encode(demo_descriptor_set().SerializeToString()).decode("ascii")
    return {
        "name": name,
        "schema": {"descriptorSetBase64": schema},
        "inputType": "ai.pipestream.proto.parse.v1.ParseDocumentRequest",
        "deadlineMs": 30000,
        "steps": [
            {
                "name": "parse",
                "target": parse_target,
                "method": parse.METHOD,
                "rules": ["text = input.text", "mime_type = input.mime_type", "name = input.name"],
            },
            {
                "name": "tokenize",
                "target": services_target,
                "method": "protomolt.demo.v1.Tokenizer/Tokenize",
                "rules": ["text = parse.text"],
            },
            {
                "name": "embed",
                "target": services_target,
                "method": "protomolt.demo.v1.Embedder/Embed",
                "rules": ["ids = tokenize.ids"],
            },
            {
                "name": "review",
                "target": services_target,
                "method": "protomolt.demo.v1.ReviewDesk/Review",
                "completion": "external",
                "rules": [
                    "title = parse.title",
                    "word_count = parse.word_count",
                    "token_count = tokenize.count",
                ],
            },
        ],
        "output": {
            "type": "protomolt.demo.v1.DocumentSummary",
            "rules": [
                "name = parse.name",
                "title = parse.title",
                "word_count = parse.word_count",
                "token_count = tokenize.count",
                "dims = embed.dims",
                "approved = review.approved",
                "note = review.note",
            ],
        },
    }
