"""What the guide tests share: read a doc's marked blocks, compile its proto, serve its service.

A guide (docs/approvals.md, docs/workflows.md, docs/artifacts.md, ...) marks the blocks a test
plays as written with ``<!-- MARKER: DIRECTIVE -->`` followed by a fenced block (or, where
``tables`` is asked for, a Markdown table). The proto block is compiled with
``grpc_tools.protoc`` into a ``FileDescriptorSet`` and its service served on loopback by a real
grpcio server whose answers come from the test.
"""

from __future__ import annotations

import importlib.resources
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool, json_format, message_factory

DOCS = Path(__file__).resolve().parents[2] / "docs"


def doc_blocks(guide: Path, marker: str, *, tables: bool = False) -> dict[str, str]:
    """The blocks of ``guide`` marked ``<!-- MARKER: DIRECTIVE -->``, by directive (stripped).

    ``marker`` is a regular expression (``"(?:approval|floor)-example"``); when it has a group
    named ``kind`` the key is ``"KIND DIRECTIVE"``. A block is the fenced block right after the
    marker, or with ``tables`` also a Markdown table (up to the next blank line).
    """
    body = (
        r"(?:```[^\n]*\n(?P<body>.*?)```|(?P<table>\|.*?)\n\n)"
        if tables
        else (r"```[^\n]*\n(?P<body>.*?)```")
    )
    pattern = re.compile(rf"<!-- {marker}: (?P<directive>[^>]*?) -->\n{body}", re.DOTALL)
    found: dict[str, str] = {}
    for m in pattern.finditer(guide.read_text(encoding="utf-8")):
        key = m.group("directive").strip()
        if "kind" in pattern.groupindex:
            key = f"{m.group('kind')} {key}"
        found[key] = m.group("body") if m.group("body") is not None else m.group("table")
    return found


def compile_proto(proto_path: str, text: str) -> bytes:
    """:func:`compile_protos` of one file ``text`` placed at ``proto_path``."""
    return compile_protos({proto_path: text})


def compile_protos(files: dict[str, str]) -> bytes:
    """The serialized ``FileDescriptorSet`` (imports included) of proto files given as
    ``{path: text}``; the well-known types come from ``grpc_tools``.

    :raises AssertionError: protoc refused a file (its stderr is the message).
    """
    with tempfile.TemporaryDirectory() as tmp:
        for proto_path, text in files.items():
            path = Path(tmp) / proto_path
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
        out = Path(tmp) / "set.pb"
        wkt = importlib.resources.files("grpc_tools") / "_proto"
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "grpc_tools.protoc",
                f"-I{tmp}",
                f"-I{wkt}",
                "--include_imports",
                f"--descriptor_set_out={out}",
                *files,
            ],
            capture_output=True,
            text=True,
            check=False,
            cwd=tmp,
        )
        assert proc.returncode == 0, proc.stderr
        return out.read_bytes()


#: ``answer(method_name, request, context) -> response as a JSON dict`` (json_format names).
Answer = Callable[[str, Any, grpc.ServicerContext], dict[str, Any]]


class LoopbackService:
    """One service of a descriptor set served on ``127.0.0.1`` (``target``), every method
    answered by ``answer``; ``context.abort`` in it fails the call as usual. ``stop()`` ends it.
    """

    def __init__(self, fds: bytes, service: str, answer: Answer) -> None:
        pool = descriptor_pool.DescriptorPool()
        for f in descriptor_pb2.FileDescriptorSet.FromString(fds).file:
            pool.Add(f)
        desc = pool.FindServiceByName(service)
        methods = {}
        for m in desc.methods:
            request = message_factory.GetMessageClass(m.input_type)
            response = message_factory.GetMessageClass(m.output_type)
            methods[m.name] = grpc.unary_unary_rpc_method_handler(
                self._handler(m.name, answer, response),
                request_deserializer=request.FromString,
                response_serializer=response.SerializeToString,
            )
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
        self.server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler(desc.full_name, methods),)
        )
        self.target = f"127.0.0.1:{self.server.add_insecure_port('127.0.0.1:0')}"
        self.server.start()

    @staticmethod
    def _handler(name: str, answer: Answer, response: Any) -> Callable[..., Any]:
        def handle(request: Any, context: grpc.ServicerContext) -> Any:
            return json_format.ParseDict(answer(name, request, context), response())

        return handle

    def stop(self) -> None:
        self.server.stop(0.5).wait(5)
