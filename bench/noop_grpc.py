"""The no-op gRPC server the benchmark steps call, and the tiny proto it speaks.

The proto is compiled at run time with ``grpc_tools.protoc`` into a descriptor set, which our
workflow envelope carries as ``schema.descriptorSetBase64``. The server is a real grpcio server
on loopback, in its own process (so it never competes with the system under test for the GIL),
with a generic unary handler:

- ``bench.v1.Noop/Call`` echoes the request (``Ping`` and ``Pong`` share field 1, ``text``);
- ``bench.v1.Noop/Slow`` sleeps ``--slow-ms`` milliseconds, then echoes (the memory scenario).

Run as ``python -m bench.noop_grpc --threads N --slow-ms M``; it prints ``{"port": P}`` on one
line once serving and stops on SIGTERM or when its stdin closes.
"""

from __future__ import annotations

import argparse
import base64
import functools
import importlib.resources
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent import futures
from pathlib import Path
from typing import Self

#: Service and method names the workflows and peers call.
SERVICE = "bench.v1.Noop"
CALL = f"/{SERVICE}/Call"
SLOW = f"/{SERVICE}/Slow"

PROTO_PATH = "bench/v1/noop.proto"
PROTO_TEXT = """syntax = "proto3";
package bench.v1;

message Ping { string text = 1; }
message Pong { string text = 1; }

service Noop {
  rpc Call(Ping) returns (Pong);
  rpc Slow(Ping) returns (Pong);
}
"""


#: The realistic workload's message: ~1 KB, with declared field rules and two CEL rules, echoed
#: by ``bench.v1.Docs/Echo`` (the same raw-bytes echo as ``Call``).
DOC_SERVICE = "bench.v1.Docs"
DOC_PROTO_PATH = "bench/v1/doc.proto"
DOC_PROTO_TEXT = """syntax = "proto3";
package bench.v1;

import "ai/pipestream/proto/validate/v1/validate.proto";

message Doc {
  option (ai.pipestream.proto.validate.v1.message) = {
    cel: {
      id: "doc-has-content"
      message: "a document needs a title or a body"
      expression: "size(this.title) > 0 || size(this.body) > 0"
    }
    cel: {
      id: "doc-score-range"
      message: "score must be 0..1000"
      expression: "this.score >= 0 && this.score <= 1000"
    }
  };
  string id = 1 [(ai.pipestream.proto.validate.v1.field) = {required: true, string: {max_len: 64}}];
  string title = 2 [(ai.pipestream.proto.validate.v1.field) = {string: {max_len: 200}}];
  string body = 3 [(ai.pipestream.proto.validate.v1.field) = {string: {max_len: 4000}}];
  repeated string tags = 4 [(ai.pipestream.proto.validate.v1.field) = {repeated: {max_items: 32}}];
  int32 score = 5 [(ai.pipestream.proto.validate.v1.field) = {int32: {gte: 0}}];
  string lang = 6 [(ai.pipestream.proto.validate.v1.field) = {string: {max_len: 16}}];
}

service Docs {
  rpc Echo(Doc) returns (Doc);
}
"""

#: The repository's proto sources (validate.proto for the realistic workload's imports).
_PROTO_ROOT = Path(__file__).resolve().parent.parent / "proto"


def _compile_set(files: dict[str, str], targets: list[str]) -> str:
    from grpc_tools import protoc

    with tempfile.TemporaryDirectory() as tmp:
        for path, text in files.items():
            src = Path(tmp, path)
            src.parent.mkdir(parents=True, exist_ok=True)
            src.write_text(text)
        out = Path(tmp, "set.pb")
        include = str(importlib.resources.files("grpc_tools") / "_proto")
        rc = protoc.main(
            [
                "protoc",
                f"-I{tmp}",
                f"-I{_PROTO_ROOT}",
                f"-I{include}",
                "--include_imports",
                f"--descriptor_set_out={out}",
                *targets,
            ]
        )
        if rc != 0:
            raise RuntimeError(f"protoc failed on {', '.join(targets)} (exit {rc})")
        return base64.b64encode(out.read_bytes()).decode("ascii")


@functools.cache
def descriptor_set_b64() -> str:
    """Base64 of the ``FileDescriptorSet`` of :data:`PROTO_TEXT` (compiled once per process).

    :raises RuntimeError: protoc rejected the proto (its stderr is not captured).
    """
    return _compile_set({PROTO_PATH: PROTO_TEXT}, [PROTO_PATH])


@functools.cache
def doc_descriptor_set_b64() -> str:
    """Base64 of the ``FileDescriptorSet`` of :data:`DOC_PROTO_TEXT` and its imports."""
    return _compile_set({DOC_PROTO_PATH: DOC_PROTO_TEXT}, [DOC_PROTO_PATH])


def encode_ping(text: str) -> bytes:
    """Wire bytes of ``Ping{text}`` without generated classes (field 1, length-delimited)."""
    raw = text.encode()
    if len(raw) > 127:
        raise ValueError("bench payload text must be at most 127 bytes")
    return b"\x0a" + bytes([len(raw)]) + raw if raw else b""


def decode_text(payload: bytes) -> str:
    """``text`` of a ``Ping``/``Pong`` encoded by :func:`encode_ping` (or empty)."""
    return payload[2:].decode() if payload else ""


def serve(threads: int, slow_ms: int) -> None:
    """Serve until SIGTERM/SIGINT or stdin EOF; prints the bound port as one JSON line."""
    import grpc

    def call(request: bytes, context: object) -> bytes:
        return request

    def slow(request: bytes, context: object) -> bytes:
        time.sleep(slow_ms / 1000.0)
        return request

    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=threads),
        options=[("grpc.so_reuseport", 0)],
    )
    server.add_generic_rpc_handlers(
        (
            grpc.method_handlers_generic_handler(
                SERVICE,
                {
                    # No (de)serializers: requests and responses pass as raw bytes.
                    "Call": grpc.unary_unary_rpc_method_handler(call),
                    "Slow": grpc.unary_unary_rpc_method_handler(slow),
                },
            ),
            grpc.method_handlers_generic_handler(
                DOC_SERVICE, {"Echo": grpc.unary_unary_rpc_method_handler(call)}
            ),
        )
    )
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())

    def watch_stdin() -> None:
        # The parent holds our stdin; if it dies without stopping us, EOF stops us.
        sys.stdin.read()
        stop.set()

    threading.Thread(target=watch_stdin, daemon=True).start()
    print(json.dumps({"port": port}), flush=True)
    stop.wait()
    server.stop(grace=1.0).wait()


class NoopServer:
    """The server process, as a context manager: ``with NoopServer() as s: s.target``.

    :param threads: server worker threads; must cover the calls in flight (a sync server ties
        one thread to each call).
    :param slow_ms: how long ``Slow`` sleeps.
    """

    def __init__(self, threads: int = 64, slow_ms: int = 1000) -> None:
        self.threads = threads
        self.slow_ms = slow_ms
        self.proc: subprocess.Popen | None = None
        self.port = 0

    @property
    def target(self) -> str:
        """``127.0.0.1:<port>``."""
        return f"127.0.0.1:{self.port}"

    def __enter__(self) -> Self:
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "bench.noop_grpc",
                "--threads",
                str(self.threads),
                "--slow-ms",
                str(self.slow_ms),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=str(Path(__file__).resolve().parent.parent),
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        try:
            line = self.proc.stdout.readline()
            self.port = int(json.loads(line)["port"])
        except (ValueError, KeyError, TypeError):
            self.__exit__()
            raise RuntimeError("the no-op gRPC server did not start") from None
        return self

    def __exit__(self, *exc: object) -> None:
        proc = self.proc
        if proc is None:
            return
        self.proc = None
        try:
            proc.terminate()
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
        finally:
            for stream in (proc.stdin, proc.stdout):
                if stream:
                    stream.close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.noop_grpc")
    parser.add_argument("--threads", type=int, default=64)
    parser.add_argument("--slow-ms", type=int, default=1000)
    args = parser.parse_args(argv)
    serve(args.threads, args.slow_ms)


if __name__ == "__main__":
    main()
