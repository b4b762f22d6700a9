"""A real gRPC render service on loopback that renders ONE frame per call and counts frames
(the resumable step of docs/long-steps.md and tests/integration/test_long_steps.py).

``render.v1.Renderer/Render(RenderRequest) -> RenderChunk``: renders frame
``state.next_frame`` (1 when unset), sleeping ``frame_s``, and answers ``state.next_frame + 1``,
``frames_done``, ``frames_total``, ``details = "frame k of n"`` and ``done`` after the last
frame. :meth:`RenderService.hold` makes the rendering of one frame wait until
:meth:`release` (so a test can act "during frame k"); :attr:`started` lists every frame whose
rendering began, :attr:`rendered` every frame whose call answered.
"""

from __future__ import annotations

import functools
import importlib.resources
import subprocess
import sys
import tempfile
import threading
import time
from concurrent import futures
from pathlib import Path
from typing import Any, Self

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

ROOT = Path(__file__).resolve().parents[2] / "tests" / "protos"
PROTO_PATH = "render/v1/render.proto"


@functools.lru_cache(maxsize=1)
def _pool() -> descriptor_pool.DescriptorPool:
    wkt = importlib.resources.files("grpc_tools") / "_proto"
    with tempfile.TemporaryDirectory(prefix="pmj-render-") as tmp:
        out = Path(tmp) / "set.pb"
        subprocess.run(
            [sys.executable, "-m", "grpc_tools.protoc", f"-I{ROOT}", f"-I{wkt}",
             "--include_imports", f"--descriptor_set_out={out}", PROTO_PATH],
            check=True, capture_output=True,
        )  # fmt: skip
        fds = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes())
    pool = descriptor_pool.DescriptorPool()
    for f in fds.file:
        pool.Add(f)
    return pool


def message_class(name: str) -> Any:
    return message_factory.GetMessageClass(_pool().FindMessageTypeByName(name))


def render_workflow(target: str, *, name: str = "render", deadline_ms: int = 60_000) -> dict:
    """The render workflow: one resumable step rendering ``input.frames`` frames."""
    return {
        "name": name,
        "schema": {"sources": {PROTO_PATH: (ROOT / PROTO_PATH).read_text()}, "root": PROTO_PATH},
        "inputType": "render.v1.RenderRequest",
        "deadlineMs": deadline_ms,
        "steps": [
            {
                "name": "render",
                "target": target,
                "method": "render.v1.Renderer/Render",
                "rules": ["scene = input.scene", "frames = input.frames"],
                "adapterVersion": "render-1.0",
                "resumable": {
                    "state": "state",
                    "done": "response.done",
                    "progress": "100.0 * double(response.frames_done) / "
                    "double(response.frames_total)",
                },
            }
        ],
    }


class RenderService:
    """The render server; use as a context manager. ``target`` is ``127.0.0.1:<port>``."""

    def __init__(self, frame_s: float = 0.02) -> None:
        self.frame_s = frame_s
        self.started: list[int] = []
        self.rendered: list[int] = []
        self._lock = threading.Lock()
        self._holds: dict[int, threading.Event] = {}
        self.reached: dict[int, threading.Event] = {}
        self._server: grpc.Server | None = None
        self.target = ""

    def hold(self, frame: int) -> threading.Event:
        """Make frame ``frame`` wait (after it starts) until :meth:`release`; returns the
        event set once that frame has started."""
        self._holds[frame] = threading.Event()
        self.reached[frame] = threading.Event()
        return self.reached[frame]

    def release(self, frame: int) -> None:
        self._holds[frame].set()

    def _render(self, request: Any, context: grpc.ServicerContext) -> Any:
        frame = request.state.next_frame or 1
        with self._lock:
            self.started.append(frame)
        if frame in self.reached:
            self.reached[frame].set()
        gate = self._holds.get(frame)
        if gate is not None:
            gate.wait(30)
        time.sleep(self.frame_s)
        with self._lock:
            self.rendered.append(frame)
        out = message_class("render.v1.RenderChunk")()
        out.state.next_frame = frame + 1
        out.frames_done = frame
        out.frames_total = request.frames
        out.done = frame >= request.frames
        out.details = f"frame {frame} of {request.frames}"
        return out

    def __enter__(self) -> Self:
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
        handler = grpc.unary_unary_rpc_method_handler(
            self._render,
            request_deserializer=message_class("render.v1.RenderRequest").FromString,
            response_serializer=message_class("render.v1.RenderChunk").SerializeToString,
        )
        server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler("render.v1.Renderer", {"Render": handler}),)
        )
        port = server.add_insecure_port("127.0.0.1:0")
        server.start()
        self._server = server
        self.target = f"127.0.0.1:{port}"
        return self

    def __exit__(self, *exc: object) -> None:
        for gate in self._holds.values():
            gate.set()
        if self._server is not None:
            self._server.stop(0.5)
