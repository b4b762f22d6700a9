"""The mock transport of ``test-workflow``: a ``Runtime.channel_factory`` whose channels answer
from a case's mocks and never open a socket.

The engine calls every step through ``calls.call_unary(channel, ...)`` over the channel its
``SegmentChannels`` takes from ``Runtime.channel_factory`` (in-process and network targets
alike). :class:`MockTransport` is such a factory: the channel's multicallables find the step
from the call's idempotency key (``effects.IDEMPOTENCY_HEADER``, sent on every call of a run
with an ``EffectContext``), take that step's next mock, advance the :class:`VirtualClock` by its
``delayMs`` and answer: the response serialised and read back with the method's own
deserializer, or a ``grpc.RpcError`` with the mocked code. A call past a step's last mock, or of
a step without mocks, raises :class:`Unmocked`, which ends the case naming the step.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import grpc

from protomolt_jobs.errors import ProtomoltJobsError
from protomolt_jobs.workflow.effects import IDEMPOTENCY_HEADER
from protomolt_jobs.workflow.testing.cases import Mock

__all__ = ["MockTransport", "Unmocked", "VirtualClock"]

_TAIL = re.compile(r"^:\d+(?::\d+)?$")


class Unmocked(ProtomoltJobsError):
    """A step was called (or parked) with no mock left; the case fails naming it."""

    def __init__(self, step: str, message: str) -> None:
        super().__init__(message)
        self.step = step
        self.message = message


@dataclass
class VirtualClock:
    """The case's clock, in milliseconds since the case started; only events, mock delays
    and retry backoffs move it."""

    now_ms: int = 0

    def advance(self, ms: float) -> None:
        self.now_ms += int(ms)


class _MockRpcError(ProtomoltJobsError, grpc.RpcError):
    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(details)
        self._code, self._details = code, details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details


@dataclass
class MockTransport:
    """Answers calls from ``mocks`` (step -> sequence), counting them per step.

    :ivar job_id: the stand-in run's id (the idempotency key's first part).
    :ivar steps: the workflow's step names (to read a key back to its step).
    :ivar calls: step -> calls answered (a parked step's mocked answer counts as one).
    """

    job_id: str
    steps: tuple[str, ...]
    mocks: Mapping[str, tuple[Mock, ...]]
    clock: VirtualClock
    calls: dict[str, int] = field(default_factory=dict)
    #: the first :class:`Unmocked` raised (the engine may wrap what a call raises).
    unmocked: Unmocked | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def factory(self, target: str, tls: bool) -> Any:
        """``Runtime.channel_factory``: a channel that answers from the mocks."""
        return _Channel(self)

    def take(self, step: str, what: str = "called") -> Mock:
        """The next mock of ``step`` (counted as a call).

        :raises Unmocked: ``step`` has no mock left.
        """
        with self._lock:
            n = self.calls.get(step, 0)
            seq = self.mocks.get(step, ())
            if n >= len(seq):
                if not seq:
                    missing = Unmocked(step, f"step '{step}' was {what} and has no mock")
                else:
                    missing = Unmocked(
                        step,
                        f"step '{step}' was {what} {n + 1} times; its mocks answer {len(seq)}",
                    )
                if self.unmocked is None:
                    self.unmocked = missing
                raise missing
            self.calls[step] = n + 1
            return seq[n]

    def step_of(self, metadata: Any) -> str | None:
        for key, value in metadata or ():
            if key != IDEMPOTENCY_HEADER or not isinstance(value, str):
                continue
            rest = value.removeprefix(f"{self.job_id}:")
            best = None
            for name in self.steps:
                fits = rest.startswith(name) and _TAIL.match(rest[len(name) :])
                if fits and (best is None or len(name) > len(best)):
                    best = name
            return best
        return None


class _Channel:
    def __init__(self, transport: MockTransport) -> None:
        self._t = transport

    def unary_unary(
        self,
        method: str,
        request_serializer: Callable[[Any], bytes] | None = None,
        response_deserializer: Callable[[bytes], Any] | None = None,
        **_: Any,
    ) -> _Callable:
        return _Callable(self._t, method, response_deserializer)

    def close(self) -> None:
        return None


class _Callable:
    def __init__(
        self, transport: MockTransport, method: str, read: Callable[[bytes], Any] | None
    ) -> None:
        self._t, self._method, self._read = transport, method, read

    def __call__(self, request: Any, timeout: float | None = None, metadata: Any = None) -> Any:
        step = self._t.step_of(metadata)
        if step is None:
            missing = Unmocked("", f"a call of {self._method} carried no step's idempotency key")
            if self._t.unmocked is None:
                self._t.unmocked = missing
            raise missing
        mock = self._t.take(step)
        if mock.delay_ms:
            self._t.clock.advance(mock.delay_ms)
            if timeout is not None and mock.delay_ms > timeout * 1000.0:
                raise _MockRpcError(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded")
        if mock.code is not None:
            raise _MockRpcError(mock.code, mock.message)
        if mock.response is None:
            raise Unmocked(step, f"step '{step}' was called; its mock holds votes, no response")
        data = mock.response.SerializeToString()
        return self._read(data) if self._read is not None else mock.response

    def future(self, request: Any, timeout: float | None = None, metadata: Any = None) -> Any:
        return _Done(lambda: self(request, timeout=timeout, metadata=metadata))


class _Done:
    """A finished call as a future (``call_unary`` with ``watch_cancel``)."""

    def __init__(self, fn: Callable[[], Any]) -> None:
        self._fn = fn

    def cancel(self) -> bool:
        return False

    def result(self) -> Any:
        return self._fn()
