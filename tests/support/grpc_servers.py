"""Real gRPC servers for tests: the ``jobs.test`` services on a free 127.0.0.1 port.

:class:`TestServices` compiles ``tests/protos/jobs/test/v1/jobs_test.proto`` at run time with
``grpc_tools.protoc`` (LIBRARIES.md section 5), builds message classes from the resulting
descriptor set in a private pool and serves ``jobs.test.Tokenizer/Tokenize``,
``jobs.test.Embedder/Embed`` and ``jobs.test.ReviewDesk/Review`` (plus the server-streaming
``jobs.test.Streamer/Stream``) through generic handlers on a real ``grpc.server``.

Behaviour of the default handlers (deterministic, so tests can compute expectations):

- ``Tokenize(Text) -> Tokens``: one id per whitespace word (the sum of the word's code points),
  ``text`` echoed, ``count = len(ids)``, ``meta`` = the request's meta plus
  ``{"tokenizer": "whitespace"}``; ``fail: true`` answers FAILED_PRECONDITION "asked to fail".
- ``Embed(Tokens) -> Embedding``: ``values = [(id % 1000) / 1000 for id in ids]``,
  ``model = "test-embed-v1"``, ``meta`` copied (an empty token list gives no values, which breaks
  the ``min_items = 1`` rule declared on ``Embedding.values``).
- ``Review(ReviewRequest) -> Review``: approved when there is at least one value; note
  ``"auto-approved"`` or ``"no values"``.

Test controls, keyed by the method's simple name (``"Tokenize"``) or full name
(``"jobs.test.Tokenizer/Tokenize"``): :meth:`TestServices.calls`, :meth:`~TestServices.fail_next`,
:meth:`~TestServices.set_delay`, :meth:`~TestServices.max_in_flight`,
:meth:`~TestServices.requests`, :meth:`~TestServices.set_handler`, :meth:`~TestServices.reset`.

:func:`seed_workflow` builds the seed's workflow JSON (tokenize -> embed -> review) for a target
in any of the three schema forms.
"""

from __future__ import annotations

import base64
import copy
import functools
import importlib.resources
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent import futures
from pathlib import Path
from typing import Any, Self

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

REPO_ROOT = Path(__file__).resolve().parents[2]
TEST_PROTO_ROOT = REPO_ROOT / "tests" / "protos"
#: The house protos (validate.v1) the test proto imports.
HOUSE_PROTO_ROOT = REPO_ROOT / "proto"
TEST_PROTO_PATH = "jobs/test/v1/jobs_test.proto"
PACKAGE = "jobs.test"

#: method simple name -> (service full name, request type, response type)
METHODS: dict[str, tuple[str, str, str]] = {
    "Tokenize": ("jobs.test.Tokenizer", "jobs.test.Text", "jobs.test.Tokens"),
    "Embed": ("jobs.test.Embedder", "jobs.test.Tokens", "jobs.test.Embedding"),
    "Review": ("jobs.test.ReviewDesk", "jobs.test.ReviewRequest", "jobs.test.Review"),
    "Run": ("jobs.test.Steps", "jobs.test.StepRequest", "jobs.test.StepReply"),
}
STREAM_METHOD = ("jobs.test.Streamer", "Stream")


def _protoc_includes() -> list[str]:
    wkt = importlib.resources.files("grpc_tools") / "_proto"
    return [f"-I{TEST_PROTO_ROOT}", f"-I{HOUSE_PROTO_ROOT}", f"-I{wkt}"]


@functools.lru_cache(maxsize=1)
def _compiled_set_bytes() -> bytes:
    """Compile the test proto (with imports) once per process; the serialized FileDescriptorSet."""
    with tempfile.TemporaryDirectory(prefix="pmj-testproto-") as tmp:
        out = Path(tmp) / "set.pb"
        # protoc in a subprocess: its stderr is the only place compile errors appear.
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "grpc_tools.protoc",
                *_protoc_includes(),
                "--include_imports",
                f"--descriptor_set_out={out}",
                TEST_PROTO_PATH,
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        if proc.returncode != 0:
            raise RuntimeError(f"protoc failed on {TEST_PROTO_PATH}: {proc.stderr.strip()}")
        return out.read_bytes()


def descriptor_set() -> descriptor_pb2.FileDescriptorSet:
    """The test proto and its imports as a FileDescriptorSet (dependencies first)."""
    return descriptor_pb2.FileDescriptorSet.FromString(_compiled_set_bytes())


def descriptor_set_b64() -> str:
    """The compiled descriptor set, base64 (the ``descriptorSetBase64`` schema form)."""
    return base64.b64encode(_compiled_set_bytes()).decode("ascii")


def sources() -> dict[str, str]:
    """The ``sources`` schema form: ``{"jobs/test/v1/jobs_test.proto": <proto text>}``.

    The house ``validate.proto`` import is left for the engine to satisfy from its fallbacks,
    as upstream does.
    """
    return {TEST_PROTO_PATH: (TEST_PROTO_ROOT / TEST_PROTO_PATH).read_text(encoding="utf-8")}


@functools.lru_cache(maxsize=1)
def _pool() -> descriptor_pool.DescriptorPool:
    pool = descriptor_pool.DescriptorPool()
    for f in descriptor_set().file:
        pool.Add(f)
    return pool


def message_class(full_name: str) -> type:
    """A message class for ``full_name`` from the test proto's private pool."""
    return message_factory.GetMessageClass(_pool().FindMessageTypeByName(full_name))


def _canonical(method: str) -> str:
    """``"jobs.test.Tokenizer/Tokenize"`` or ``"Tokenize"`` -> ``"Tokenize"``."""
    name = method.rsplit("/", 1)[-1]
    if name not in METHODS and name != STREAM_METHOD[1]:
        raise KeyError(f"unknown test method {method!r}; known: {sorted(METHODS)}")
    return name


class _Injected:
    def __init__(self, remaining: int, code: grpc.StatusCode, details: str) -> None:
        self.remaining = remaining
        self.code = code
        self.details = details


class TestServices:
    """The ``jobs.test`` services on a real gRPC server on 127.0.0.1 (a free port).

    Usage: ``svc = TestServices().start()`` ... ``svc.stop()`` (or as a context manager).

    :param max_workers: server worker threads; a sync server ties one up per call in flight
        (LIBRARIES.md section 6), so the default covers 300 concurrent slow calls.
    """

    __test__ = False  # not a pytest test class despite the name

    def __init__(self, *, max_workers: int = 320) -> None:
        self.max_workers = max_workers
        self._lock = threading.Lock()
        self._server: grpc.Server | None = None
        self.port = 0
        self.target = ""
        self._calls: dict[str, int] = {}
        self._in_flight: dict[str, int] = {}
        self._max_in_flight: dict[str, int] = {}
        self._delays: dict[str, float] = {}
        self._failures: dict[str, _Injected] = {}
        self._requests: dict[str, list[Any]] = {}
        self._metadata: dict[str, list[dict[str, str]]] = {}
        self._handlers: dict[str, Callable[[Any, grpc.ServicerContext], Any]] = {}
        self._spans: list[tuple[str, float, float]] = []
        self.reset()

    # -- schema forms -------------------------------------------------------------------------

    @property
    def descriptor_set_b64(self) -> str:
        return descriptor_set_b64()

    @property
    def sources(self) -> dict[str, str]:
        return sources()

    @staticmethod
    def message_class(full_name: str) -> type:
        return message_class(full_name)

    # -- lifecycle ----------------------------------------------------------------------------

    def start(self) -> TestServices:
        """Start the server; returns ``self`` once it listens."""
        if self._server is not None:
            return self
        server = grpc.server(
            futures.ThreadPoolExecutor(
                max_workers=self.max_workers, thread_name_prefix="jobs-test"
            ),
            maximum_concurrent_rpcs=None,
        )
        handlers = []
        by_service: dict[str, dict[str, grpc.RpcMethodHandler]] = {}
        for method, (service, req_name, resp_name) in METHODS.items():
            req_cls, resp_cls = message_class(req_name), message_class(resp_name)
            by_service.setdefault(service, {})[method] = grpc.unary_unary_rpc_method_handler(
                self._unary(method),
                request_deserializer=req_cls.FromString,
                response_serializer=resp_cls.SerializeToString,
            )
        for service, methods in by_service.items():
            handlers.append(grpc.method_handlers_generic_handler(service, methods))
        handlers.append(
            grpc.method_handlers_generic_handler(
                STREAM_METHOD[0],
                {
                    STREAM_METHOD[1]: grpc.unary_stream_rpc_method_handler(
                        self._stream,
                        request_deserializer=message_class("jobs.test.Text").FromString,
                        response_serializer=message_class("jobs.test.Tokens").SerializeToString,
                    )
                },
            )
        )
        server.add_generic_rpc_handlers(tuple(handlers))
        self.port = server.add_insecure_port("127.0.0.1:0")
        if not self.port:
            raise RuntimeError("could not bind a loopback port for the test gRPC server")
        server.start()
        self._server = server
        self.target = f"127.0.0.1:{self.port}"
        return self

    def stop(self, grace_s: float | None = 0.5) -> None:
        """Stop the server (idempotent)."""
        server, self._server = self._server, None
        if server is not None:
            server.stop(grace_s).wait()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- controls -----------------------------------------------------------------------------

    def reset(self) -> None:
        """Clear counters, injected failures, delays, recorded requests and handler overrides."""
        with self._lock:
            names = [*METHODS, STREAM_METHOD[1]]
            self._calls = dict.fromkeys(names, 0)
            self._in_flight = dict.fromkeys(names, 0)
            self._max_in_flight = dict.fromkeys(names, 0)
            self._delays = {}
            self._failures = {}
            self._requests = {n: [] for n in names}
            self._metadata = {n: [] for n in names}
            self._handlers = {}
            self._spans = []

    def calls(self, method: str) -> int:
        """How many calls ``method`` has received (failed and injected ones included)."""
        with self._lock:
            return self._calls[_canonical(method)]

    def requests(self, method: str) -> list[Any]:
        """Copies of the requests ``method`` received, oldest first."""
        with self._lock:
            return list(self._requests[_canonical(method)])

    def metadata(self, method: str) -> list[dict[str, str]]:
        """The invocation metadata of each call of ``method`` (key -> value), oldest first."""
        with self._lock:
            return list(self._metadata[_canonical(method)])

    def spans(self, step: str | None = None) -> list[tuple[str, float, float]]:
        """``Steps/Run`` calls as ``(step, started, ended)`` (``time.monotonic()`` seconds on
        the server, which shares the test's clock), in the order they ended; ``step`` filters."""
        with self._lock:
            return [s for s in self._spans if step is None or s[0] == step]

    def step_calls(self, step: str) -> int:
        """How many ``Steps/Run`` calls named ``step`` started (failed ones included)."""
        with self._lock:
            return sum(1 for r in self._requests["Run"] if r.step == step)

    def max_in_flight(self, method: str) -> int:
        """The most calls of ``method`` seen in flight at once."""
        with self._lock:
            return self._max_in_flight[_canonical(method)]

    def fail_next(
        self, method: str, n: int, code: grpc.StatusCode, details: str = "injected failure"
    ) -> None:
        """Answer the next ``n`` calls of ``method`` with status ``code`` (after any delay)."""
        with self._lock:
            self._failures[_canonical(method)] = _Injected(n, code, details)

    def set_delay(self, method: str, seconds: float) -> None:
        """Sleep ``seconds`` inside every call of ``method`` before answering (0 clears)."""
        with self._lock:
            self._delays[_canonical(method)] = float(seconds)

    def set_handler(
        self, method: str, handler: Callable[[Any, grpc.ServicerContext], Any] | None
    ) -> None:
        """Replace ``method``'s behaviour: ``handler(request, context) -> response`` (None restores)."""
        with self._lock:
            if handler is None:
                self._handlers.pop(_canonical(method), None)
            else:
                self._handlers[_canonical(method)] = handler

    # -- handlers -----------------------------------------------------------------------------

    def _enter(
        self, method: str, request: Any, context: grpc.ServicerContext | None = None
    ) -> tuple[float, _Injected | None, Callable | None]:
        metadata = dict(context.invocation_metadata()) if context is not None else {}
        with self._lock:
            self._metadata[method].append(metadata)
            self._calls[method] += 1
            self._in_flight[method] += 1
            self._max_in_flight[method] = max(self._max_in_flight[method], self._in_flight[method])
            self._requests[method].append(copy.deepcopy(request))
            injected = self._failures.get(method)
            if injected is not None:
                injected.remaining -= 1
                if injected.remaining <= 0:
                    del self._failures[method]
            return self._delays.get(method, 0.0), injected, self._handlers.get(method)

    def _leave(self, method: str) -> None:
        with self._lock:
            self._in_flight[method] -= 1

    def _unary(self, method: str) -> Callable[[Any, grpc.ServicerContext], Any]:
        default = getattr(self, f"_do_{method.lower()}")

        def handle(request: Any, context: grpc.ServicerContext) -> Any:
            delay, injected, override = self._enter(method, request, context)
            try:
                if delay > 0:
                    # Sleep in slices so a cancelled (deadline-exceeded) call frees its thread.
                    end = time.monotonic() + delay
                    while context.is_active() and time.monotonic() < end:
                        time.sleep(min(0.01, max(0.0, end - time.monotonic())))
                if injected is not None:
                    context.abort(injected.code, injected.details)
                return (override or default)(request, context)
            finally:
                self._leave(method)

        return handle

    def _stream(self, request: Any, context: grpc.ServicerContext) -> Any:
        self._enter(STREAM_METHOD[1], request)
        try:
            yield self._do_tokenize(request, context)
        finally:
            self._leave(STREAM_METHOD[1])

    @staticmethod
    def _do_tokenize(request: Any, context: grpc.ServicerContext) -> Any:
        if request.fail:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, "asked to fail")
        out = message_class("jobs.test.Tokens")()
        out.ids.extend(sum(ord(c) for c in word) for word in request.text.split())
        out.text = request.text
        out.count = len(out.ids)
        out.meta.CopyFrom(request.meta)
        out.meta["tokenizer"] = "whitespace"
        return out

    @staticmethod
    def _do_embed(request: Any, context: grpc.ServicerContext) -> Any:
        out = message_class("jobs.test.Embedding")()
        out.values.extend((i % 1000) / 1000 for i in request.ids)
        out.model = "test-embed-v1"
        if request.HasField("meta"):
            out.meta.CopyFrom(request.meta)
        return out

    def _do_run(self, request: Any, context: grpc.ServicerContext) -> Any:
        """``Steps/Run``: sleep ``sleep_ms`` (in slices, so a cancelled call frees its thread),
        record the span, fail with ``fail`` (a status code name) when set, else answer."""
        started = time.monotonic()
        end = started + request.sleep_ms / 1000.0
        while context.is_active() and time.monotonic() < end:
            time.sleep(min(0.01, max(0.0, end - time.monotonic())))
        with self._lock:
            self._spans.append((request.step, started, time.monotonic()))
        if request.fail:
            context.abort(grpc.StatusCode[request.fail], f"step {request.step} asked to fail")
        out = message_class("jobs.test.StepReply")()
        out.step = request.step
        out.index = request.index
        out.seen.extend(request.seen)
        out.seen.append(request.step)
        return out

    @staticmethod
    def _do_review(request: Any, context: grpc.ServicerContext) -> Any:
        out = message_class("jobs.test.Review")()
        out.approved = len(request.values) > 0
        out.note = "auto-approved" if out.approved else "no values"
        return out


def expected_tokens(text: str) -> list[int]:
    """The ids the default tokenizer answers for ``text``."""
    return [sum(ord(c) for c in word) for word in text.split()]


def expected_values(text: str) -> list[float]:
    """The embedding values (as float32, the way they travel) the default embedder gives ``text``."""
    import struct

    return [
        struct.unpack("f", struct.pack("f", (i % 1000) / 1000))[0] for i in expected_tokens(text)
    ]


def schema_for(form: str) -> dict[str, Any]:
    """The ``schema`` object in one of the forms ``descriptorSetBase64``, ``sources``, ``type``."""
    if form == "descriptorSetBase64":
        return {"descriptorSetBase64": descriptor_set_b64()}
    if form == "sources":
        return {"sources": sources(), "root": TEST_PROTO_PATH}
    if form == "type":
        # Resolved from the host's type pool: register descriptor_set() into it first.
        return {"type": "jobs.test.Text"}
    raise ValueError(f"unknown schema form {form!r}")


def seed_workflow(
    target: str,
    *,
    schema: str = "descriptorSetBase64",
    review: str = "external",
    name: str = "seed-review",
    deadline_ms: int | None = 10_000,
    step_deadline_ms: int | None = None,
) -> dict[str, Any]:
    """The seed's workflow JSON: tokenize -> embed -> review, with an output mapping.

    :param target: the gRPC target of every step (``TestServices().target``, ``inprocess:NAME``).
    :param schema: ``"descriptorSetBase64"``, ``"sources"`` or ``"type"`` (see :func:`schema_for`).
    :param review: ``"external"`` (the review parks the job) or ``"invoke"`` (the desk is called).
    :param deadline_ms: the workflow budget (None omits the key: 30 s default).
    :param step_deadline_ms: per-step ``deadlineMs`` on every step when given.
    :returns: the envelope as a JSON-ready dict.
    """
    review_step: dict[str, Any] = {
        "name": "review",
        "target": target,
        "method": "jobs.test.ReviewDesk/Review",
        "rules": ["text = input.text", "values = embed.values", "model = embed.model"],
        "validate": True,
    }
    if review == "external":
        review_step["completion"] = "external"
    elif review != "invoke":
        raise ValueError(f"review must be 'external' or 'invoke', not {review!r}")
    steps: list[dict[str, Any]] = [
        {
            "name": "tokenize",
            "target": target,
            "method": "jobs.test.Tokenizer/Tokenize",
            "rules": ["text = input.text", "fail = input.fail", "meta = input.meta"],
        },
        {
            "name": "embed",
            "target": target,
            "method": "jobs.test.Embedder/Embed",
            "rules": ["ids = tokenize.ids", "text = tokenize.text", "meta = tokenize.meta"],
            "validate": True,
        },
        review_step,
    ]
    if step_deadline_ms is not None:
        for step in steps:
            step["deadlineMs"] = step_deadline_ms
    workflow: dict[str, Any] = {
        "name": name,
        "schema": schema_for(schema),
        "inputType": "jobs.test.Text",
        "steps": steps,
        "output": {
            "type": "jobs.test.Summary",
            "rules": [
                "text = input.text",
                "ids = tokenize.ids",
                "count = tokenize.count",
                "meta = tokenize.meta",
                "values = embed.values",
                "model = embed.model",
                "approved = review.approved",
                "note = review.note",
            ],
            "celRules": [
                {"filter": "size(tokenize.ids) > 2", "selector": "'long'", "target": "tier"},
                {"filter": "size(tokenize.ids) <= 2", "selector": "'short'", "target": "tier"},
            ],
        },
    }
    if deadline_ms is not None:
        workflow["deadlineMs"] = deadline_ms
    return workflow


# -- a service answering google.protobuf.Any ---------------------------------------------------

ANY_FILE = "jobs/anytest/v1/boxes.proto"


@functools.lru_cache(maxsize=1)
def any_descriptor_set() -> descriptor_pb2.FileDescriptorSet:
    """``jobs.anytest``: ``Inner {string word}``, ``Box {Any item; string label}`` and
    ``Boxer/Pack(Inner) -> Box``, with ``google/protobuf/any.proto`` (built by hand, no protoc)."""
    from google.protobuf import any_pb2

    f = descriptor_pb2.FieldDescriptorProto
    fd = descriptor_pb2.FileDescriptorProto(
        name=ANY_FILE,
        package="jobs.anytest",
        syntax="proto3",
        dependency=["google/protobuf/any.proto"],
    )
    inner = fd.message_type.add(name="Inner")
    inner.field.add(
        name="word", number=1, type=f.TYPE_STRING, label=f.LABEL_OPTIONAL, json_name="word"
    )
    box = fd.message_type.add(name="Box")
    box.field.add(
        name="item",
        number=1,
        type=f.TYPE_MESSAGE,
        type_name=".google.protobuf.Any",
        label=f.LABEL_OPTIONAL,
        json_name="item",
    )
    box.field.add(
        name="label", number=2, type=f.TYPE_STRING, label=f.LABEL_OPTIONAL, json_name="label"
    )
    service = fd.service.add(name="Boxer")
    service.method.add(
        name="Pack", input_type=".jobs.anytest.Inner", output_type=".jobs.anytest.Box"
    )
    any_file = descriptor_pb2.FileDescriptorProto()
    any_pb2.DESCRIPTOR.CopyToProto(any_file)
    return descriptor_pb2.FileDescriptorSet(file=[any_file, fd])


@functools.lru_cache(maxsize=1)
def _any_pool() -> descriptor_pool.DescriptorPool:
    pool = descriptor_pool.DescriptorPool()
    for f in any_descriptor_set().file:
        pool.Add(f)
    return pool


class BoxServer:
    """Serves ``jobs.anytest.Boxer/Pack`` on 127.0.0.1: the answer's ``item`` packs
    ``Inner(word=request.word)`` under the type URL of :attr:`packed_type` (set it to a name
    the workflow's schema lacks to get an ``Any`` nobody can render)."""

    __test__ = False

    def __init__(self) -> None:
        self.packed_type = "jobs.anytest.Inner"
        self._calls = 0
        self._lock = threading.Lock()
        self._server: grpc.Server | None = None
        self.target = ""

    def start(self) -> BoxServer:
        inner_cls = message_factory.GetMessageClass(
            _any_pool().FindMessageTypeByName("jobs.anytest.Inner")
        )
        box_cls = message_factory.GetMessageClass(
            _any_pool().FindMessageTypeByName("jobs.anytest.Box")
        )

        def pack(request: Any, context: grpc.ServicerContext) -> Any:
            with self._lock:
                self._calls += 1
            box = box_cls(label="boxed")
            box.item.type_url = f"type.googleapis.com/{self.packed_type}"
            box.item.value = inner_cls(word=request.word).SerializeToString()
            return box

        handler = grpc.method_handlers_generic_handler(
            "jobs.anytest.Boxer",
            {
                "Pack": grpc.unary_unary_rpc_method_handler(
                    pack,
                    request_deserializer=inner_cls.FromString,
                    response_serializer=lambda m: m.SerializeToString(),
                )
            },
        )
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        self._server.add_generic_rpc_handlers((handler,))
        port = self._server.add_insecure_port("127.0.0.1:0")
        self._server.start()
        self.target = f"127.0.0.1:{port}"
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop(0.5).wait(5)
            self._server = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def calls(self) -> int:
        with self._lock:
            return self._calls

    def workflow(self, target: str | None = None) -> dict[str, Any]:
        """One step, ``pack``, calling ``Boxer/Pack`` with ``word = input.word``; no output
        mapping, so the Box is the result."""
        return {
            "name": "box-any",
            "schema": {
                "descriptorSetBase64": base64.b64encode(
                    any_descriptor_set().SerializeToString()
                ).decode("ascii")
            },
            "inputType": "jobs.anytest.Inner",
            "steps": [
                {
                    "name": "pack",
                    "target": target or self.target,
                    "method": "jobs.anytest.Boxer/Pack",
                    "rules": ["word = input.word"],
                }
            ],
            "deadlineMs": 10_000,
        }


if __name__ == "__main__":  # a quick manual check: python -m tests.support.grpc_servers
    with TestServices() as svc:
        print(svc.target, len(svc.descriptor_set_b64), os.getpid())


# -- a StructuredGenerator (graph workflows' structured steps) --------------------------------------


class GeneratorServer:
    """Serves ``ai.pipestream.proto.jobs.v1.StructuredGenerator/Generate`` on 127.0.0.1.

    For target type ``jobs.test.StepReply`` it answers ``StepReply(step="gen:<model>", index)``
    where ``index`` (and ``seen = [step]``) come from the grounding when it packs a
    ``jobs.test.StepRequest``; a grounding whose ``fail`` is set is answered INTERNAL.
    ``garbage = True`` answers bytes that parse as no message. Requests are kept in
    :attr:`requests`.
    """

    __test__ = False

    def __init__(self) -> None:
        self.requests: list[Any] = []
        self.garbage = False
        self._lock = threading.Lock()
        self._server: grpc.Server | None = None
        self.target = ""

    def start(self) -> GeneratorServer:
        from protomolt_jobs.pb.ai.pipestream.proto.jobs.v1 import structured_pb2

        step_request = message_class("jobs.test.StepRequest")
        step_reply = message_class("jobs.test.StepReply")

        def generate(request: Any, context: grpc.ServicerContext) -> Any:
            with self._lock:
                self.requests.append(copy.deepcopy(request))
            answer = structured_pb2.GenerateStructuredResponse()
            if self.garbage:
                answer.message.type_url = f"type.googleapis.com/{request.target_type}"
                answer.message.value = b"\xff\xff\xff"
                return answer
            reply = step_reply(step=f"gen:{request.model}")
            if request.HasField("grounding"):
                item = step_request()
                item.ParseFromString(request.grounding.value)
                if item.fail:
                    context.abort(grpc.StatusCode.INTERNAL, f"cannot generate for {item.step}")
                reply.index = item.index
                reply.seen.append(item.step)
            answer.message.type_url = "type.googleapis.com/jobs.test.StepReply"
            answer.message.value = reply.SerializeToString()
            return answer

        handler = grpc.method_handlers_generic_handler(
            "ai.pipestream.proto.jobs.v1.StructuredGenerator",
            {
                "Generate": grpc.unary_unary_rpc_method_handler(
                    generate,
                    request_deserializer=structured_pb2.GenerateStructuredRequest.FromString,
                    response_serializer=lambda m: m.SerializeToString(),
                )
            },
        )
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=16))
        self._server.add_generic_rpc_handlers((handler,))
        port = self._server.add_insecure_port("127.0.0.1:0")
        self._server.start()
        self.target = f"127.0.0.1:{port}"
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop(0.5).wait(5)
            self._server = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
