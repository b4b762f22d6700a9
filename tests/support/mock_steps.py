"""A real gRPC service on loopback answering a workflow's steps with a test case's mocks, for the
parity tests of ``tests`` cases (in-process vs a real worker on PostgreSQL).

:class:`MockedSteps` serves every method a compiled workflow's steps call. Each call's step is
read from its ``x-protomolt-idempotency-key`` (``<job>:<step>:...``), as the mock transport
reads it, and answered with the current case's next mock for that step (a ``response``, or a
``status`` the call aborts with), after its ``delayMs`` of real time. ``on_call[step]`` runs before the answer, in the server's
thread, with the job id and the call's index (0 for the first): a test issues an operator
action there, while the step's call is in flight.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent import futures
from typing import Any

import grpc
from google.protobuf import json_format

from protomolt_jobs.workflow.envelope import message_class

__all__ = ["MockedSteps"]


class MockedSteps:
    """The mocked steps' service (module docstring); ``stop()`` when done.

    :ivar case: the raw case (its ``mocks``) the calls are answered from.
    :ivar calls: step -> calls so far.
    :ivar on_call: step -> ``hook(job_id, index)`` run before the answer.
    """

    def __init__(self, compiled: Any) -> None:
        self.case: dict[str, Any] = {}
        self.calls: Counter[str] = Counter()
        self.on_call: dict[str, Callable[[str, int], None]] = {}
        self._lock = threading.Lock()
        services: dict[str, dict[str, grpc.RpcMethodHandler]] = {}
        for step in compiled.steps:
            m = step.method
            if m is None:
                continue
            out_cls = message_class(m.output_type)
            services.setdefault(m.containing_service.full_name, {})[m.name] = (
                grpc.unary_unary_rpc_method_handler(
                    self._handler(out_cls),
                    request_deserializer=message_class(m.input_type).FromString,
                    response_serializer=out_cls.SerializeToString,
                )
            )
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
        self.server.add_generic_rpc_handlers(
            tuple(grpc.method_handlers_generic_handler(s, h) for s, h in services.items())
        )
        self.target = f"127.0.0.1:{self.server.add_insecure_port('127.0.0.1:0')}"
        self.server.start()

    def reset(self, case: dict[str, Any]) -> None:
        """Answer from ``case`` from now on, with the counts and hooks cleared."""
        with self._lock:
            self.case, self.calls, self.on_call = case, Counter(), {}

    def _handler(self, out_cls: Any) -> Callable[[Any, grpc.ServicerContext], Any]:
        def handle(request: Any, context: grpc.ServicerContext) -> Any:
            key = dict(context.invocation_metadata()).get("x-protomolt-idempotency-key", "")
            job_id, step = key.split(":")[0], key.split(":")[1]
            with self._lock:
                n = self.calls[step]
                self.calls[step] += 1
                hook = self.on_call.get(step)
            if hook is not None:
                hook(job_id, n)
            seq = self.case.get("mocks", {}).get(step, [])
            seq = seq if isinstance(seq, list) else [seq]
            if n >= len(seq):
                context.abort(grpc.StatusCode.INTERNAL, f"no mock {n} for {step}")
            mock = seq[n]
            if mock.get("delayMs"):
                time.sleep(mock["delayMs"] / 1000.0)  # the call takes that long, for real
            if "status" in mock:
                status = mock["status"]
                context.abort(grpc.StatusCode[status["code"]], status.get("message", ""))
            return json_format.ParseDict(mock["response"], out_cls())

        return handle

    def stop(self) -> None:
        """Stop serving (at most 5 s)."""
        self.server.stop(0.5).wait(5)
