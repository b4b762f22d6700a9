"""``ProtoMoltService`` over gRPC: typed RPCs transcoded to the action catalog.

Each RPC is one verb: ``SubmitWorkflow`` is ``submit-workflow`` (kebab case of the RPC name).
A call prints its request as canonical proto3 JSON (lowerCamelCase, default values omitted),
which is the verb's JSON envelope, runs ``catalog.execute`` and parses the answer into the
response message, ignoring keys the message does not declare.

Errors (DESIGN.md section 4): an :class:`~protomolt_jobs.errors.ActionError` aborts the call with
``grpc.StatusCode[err.grpc_status]`` and the description ``"<code>: <message>"``; the trailing
metadata carries ``protomolt-error`` (the code) and, when the error has details,
``protomolt-error-details-bin`` (UTF-8 JSON). Both travel as metadata, which clients cap at
16 KiB: the description is cut to :data:`MAX_STATUS_MESSAGE` characters and the details to
:data:`MAX_DETAILS_BYTES` (then only ``field`` and ``path``), so a refusal that names a huge
value still arrives as itself. Requests arrive as raw bytes and are parsed in
the handler: bytes that are not the request message (malformed, invalid UTF-8 in a string,
a ``Struct`` nested past protobuf's limit) and a ``Struct`` holding NaN or an infinity are
``INVALID_ARGUMENT`` ``"invalid-input: ..."`` (naming the field when it can). Nothing yields
``UNKNOWN``: an unexpected exception anywhere in a call is ``INTERNAL``
``"internal-error: <Method> failed"``; the traceback stays in the server log.

The same handlers answer under upstream's service name as well,
``ai.pipestream.proto.grpc.service.v1.ProtoMoltService`` (:data:`UPSTREAM_SERVICE_NAME`), so a
client generated from the Java ProtoMolt's ``protomolt_service.proto`` reaches every RPC both
declare; every RPC of our service gets the alias, and reflection lists and describes both
names (the alias is our file re-packaged, :func:`alias_file`). The differences from upstream's
service are listed in the header of ``proto/ai/pipestream/proto/service/v1/protomolt_service.proto``.

The server also serves health (``grpc.health.v1``) and server reflection under both
``grpc.reflection.v1alpha`` and ``grpc.reflection.v1`` (grpcio-reflection serves only v1alpha;
the v1 service is the same servicer under the v1 name, LIBRARIES.md section 5). With an API
token configured every call but health needs metadata ``api_token: <t>`` or
``authorization: Bearer <t>``, otherwise ``UNAUTHENTICATED``. It binds 127.0.0.1 by default.

Who calls: each RPC asks the node's :class:`~protomolt_jobs.host.authority.Authority` once,
before its request bytes are parsed, and runs the verb as the :class:`Caller` it answers
(``UNAUTHENTICATED`` when it answers none); a verb whose scope the caller does not hold is
``PERMISSION_DENIED`` ``"permission-denied: ..."`` naming the scope, and the refusal is
reported to the roles (:meth:`~protomolt_jobs.host.catalog.Catalog.authorize`). Reflection and
any extra handlers need a token the authority resolves (an interceptor checks it).
"""

from __future__ import annotations

import json
import logging
import re
import threading
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool, json_format
from google.protobuf.message import DecodeError
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection, reflection_pb2

from protomolt_jobs.errors import ActionError
from protomolt_jobs.host.authority import Authority
from protomolt_jobs.host.upstream_service import (
    ALIAS_FILE_NAME,
    UPSTREAM_PACKAGE,
    UPSTREAM_SERVICE_NAME,
    alias_classes,
    alias_file,
)
from protomolt_jobs.pb.ai.pipestream.proto.service.v1 import protomolt_service_pb2 as pb

__all__ = [
    "ALIAS_FILE_NAME",
    "REFLECTION_V1",
    "REFLECTION_V1ALPHA",
    "RPCS",
    "SERVICE_NAME",
    "SERVICE_NAMES",
    "UPSTREAM_PACKAGE",
    "UPSTREAM_SERVICE_NAME",
    "ProtoMoltGrpcServer",
    "alias_file",
    "verb_of",
]

log = logging.getLogger("protomolt_jobs.grpc_service")

#: Full name of the service.
SERVICE_NAME: str = pb.DESCRIPTOR.services_by_name["ProtoMoltService"].full_name
REFLECTION_V1ALPHA = "grpc.reflection.v1alpha.ServerReflection"
REFLECTION_V1 = "grpc.reflection.v1.ServerReflection"
HEALTH_SERVICE = "grpc.health.v1.Health"

_SERVICE_DESCRIPTOR = pb.DESCRIPTOR.services_by_name["ProtoMoltService"]

#: Every name the service answers under: ours first, then upstream's (same handlers; requests
#: under upstream's name parse with the alias's classes, :mod:`.upstream_service`).
SERVICE_NAMES: tuple[str, ...] = (SERVICE_NAME, UPSTREAM_SERVICE_NAME)


def verb_of(rpc_name: str) -> str:
    """The verb an RPC name stands for: ``SubmitWorkflow`` -> ``submit-workflow``."""
    return re.sub(r"(?<!^)(?=[A-Z])", "-", rpc_name).lower()


def _message_class(descriptor: Any) -> type:
    return getattr(pb, descriptor.name)


#: ``{rpc name: (verb, request class, response class)}`` for every RPC of the service.
RPCS: dict[str, tuple[str, Any, Any]] = {
    m.name: (verb_of(m.name), _message_class(m.input_type), _message_class(m.output_type))
    for m in _SERVICE_DESCRIPTOR.methods
}


def _ensure_reflection_v1_descriptor(pool: descriptor_pool.DescriptorPool) -> None:
    """Describe ``grpc.reflection.v1`` in ``pool`` so reflection can describe itself.

    grpcio-reflection ships only the v1alpha proto; v1 is the same file under another package.
    """
    try:
        pool.FindServiceByName(REFLECTION_V1)
        return
    except KeyError:
        pass
    fdp = descriptor_pb2.FileDescriptorProto.FromString(reflection_pb2.DESCRIPTOR.serialized_pb)
    fdp.name = "grpc/reflection/v1/reflection.proto"
    fdp.package = "grpc.reflection.v1"
    # Type references are fully qualified (".grpc.reflection.v1alpha.X"): point them at v1.
    for message in fdp.message_type:
        for f in message.field:
            if f.type_name.startswith(".grpc.reflection.v1alpha."):
                f.type_name = f.type_name.replace(".v1alpha.", ".v1.", 1)
    for service in fdp.service:
        for method in service.method:
            method.input_type = method.input_type.replace(".v1alpha.", ".v1.", 1)
            method.output_type = method.output_type.replace(".v1alpha.", ".v1.", 1)
    text = fdp.SerializeToString()
    try:
        pool.AddSerializedFile(text)
    except (TypeError, ValueError):  # a conflicting definition: reflection still works
        log.debug("reflection v1 descriptor not added", extra={"action": "reflection_v1_skipped"})


def _ensure_alias_descriptor(pool: descriptor_pool.DescriptorPool) -> None:
    """Describe the upstream-named alias in ``pool`` so reflection can serve it."""
    try:
        pool.FindServiceByName(UPSTREAM_SERVICE_NAME)
        return
    except KeyError:
        pass
    try:
        pool.AddSerializedFile(alias_file().SerializeToString())
    except (TypeError, ValueError):  # a conflicting definition: the calls still work
        log.warning(
            "the upstream-named service alias is not described by reflection",
            extra={"action": "grpc_alias_descriptor_skipped"},
        )


#: Method prefixes whose handlers resolve their caller themselves (once per call).
_SELF_AUTHENTICATING = tuple(f"/{name}/" for name in SERVICE_NAMES)


def _unauthenticated_message(presented: str | None) -> str:
    return "Missing API token 'api_token'" if presented is None else "Invalid API token"


class _TokenInterceptor(grpc.ServerInterceptor):
    """Refuses every call but health without a token the node's authority resolves.
    ProtoMoltService's own RPCs are passed through: they resolve their caller in the handler
    (once per call, which they need anyway) and refuse the same way."""

    def __init__(self, authority: Authority) -> None:
        self._authority = authority

    def intercept_service(self, continuation, handler_call_details):
        method = handler_call_details.method
        if method.startswith(f"/{HEALTH_SERVICE}/") or method.startswith(_SELF_AUTHENTICATING):
            return continuation(handler_call_details)
        presented = _presented(handler_call_details.invocation_metadata)
        if self._authority.resolve(presented) is not None:
            return continuation(handler_call_details)
        handler = continuation(handler_call_details)
        return _refusing(handler, _unauthenticated_message(presented))


def _presented(metadata: Iterable[tuple[str, Any]] | None) -> str | None:
    """The token a call presents: metadata ``api_token``, else ``authorization: Bearer``."""
    values = {k.lower(): v for k, v in (metadata or ())}
    presented = values.get("api_token")
    if presented:
        return str(presented).strip()
    scheme, _, value = str(values.get("authorization", "")).partition(" ")
    return value.strip() if scheme.lower() == "bearer" and value.strip() else None


def _refusing(handler: grpc.RpcMethodHandler | None, message: str) -> grpc.RpcMethodHandler:
    # Raw bytes in (no request_deserializer): a caller without the token learns nothing from
    # how its bytes parse, and malformed bytes are still UNAUTHENTICATED, not INTERNAL.
    def deny(request_or_iterator: Any, context: grpc.ServicerContext) -> Any:
        context.abort(grpc.StatusCode.UNAUTHENTICATED, message)

    if handler is None or handler.unary_unary:
        return grpc.unary_unary_rpc_method_handler(
            deny, response_serializer=handler.response_serializer if handler else None
        )
    kind = (
        grpc.unary_stream_rpc_method_handler
        if handler.unary_stream
        else grpc.stream_unary_rpc_method_handler
        if handler.stream_unary
        else grpc.stream_stream_rpc_method_handler
    )
    return kind(deny, response_serializer=handler.response_serializer)


class _ReadinessHealth(health.HealthServicer):
    """``grpc.health.v1`` whose ``Check`` asks the node: a service set SERVING answers
    NOT_SERVING while ``ready()`` is false (a role's component or its database is down).
    ``Watch`` streams the statuses set at start and shutdown only."""

    def __init__(self, ready: Callable[[], bool] | None) -> None:
        super().__init__()
        self._ready = ready

    def Check(self, request: Any, context: Any) -> Any:
        response = super().Check(request, context)
        if (
            self._ready is not None
            and response.status == health_pb2.HealthCheckResponse.SERVING
            and not self._ready()
        ):
            return health_pb2.HealthCheckResponse(status=health_pb2.HealthCheckResponse.NOT_SERVING)
        return response


class ProtoMoltGrpcServer:
    """A sync ``grpc.server`` serving ProtoMoltService, health and reflection (v1 and v1alpha).

    :param catalog: the node catalog (``execute(name, input) -> dict``, raising ActionError).
    :param host: bind address; 127.0.0.1 by default.
    :param port: TCP port; 0 picks a free one (read :attr:`port` after :meth:`start`).
    :param api_token: when set, calls need it (health excepted); its principal is ``api``.
        Ignored when ``authority`` is given.
    :param tokens: named tokens (``[node.tokens]``); each is accepted and its name is the
        verb's principal (the history's actor), with every scope. No token at all: principal
        ``anonymous``. Ignored when ``authority`` is given.
    :param authority: the node's resolver (tokens, groups, scopes, identity hook); None: one
        built from ``api_token`` and ``tokens``.
    :param max_workers: handler threads, the number of calls served at once.
    :param extra_handlers: more generic handlers to serve on the same port.
    :param ready: readiness of the node (``Node.health()["status"] == "UP"``); health
        ``Check`` answers NOT_SERVING while it is false. None: SERVING while the server runs.
    """

    def __init__(
        self,
        catalog: Any,
        *,
        host: str = "127.0.0.1",
        port: int = 9090,
        api_token: str | None = None,
        tokens: Mapping[str, str] | None = None,
        authority: Authority | None = None,
        max_workers: int = 64,
        extra_handlers: Iterable[grpc.GenericRpcHandler] = (),
        ready: Callable[[], bool] | None = None,
    ) -> None:
        self.catalog = catalog
        self.host = host
        self._requested_port = port
        self.authority = authority or Authority(api_token=api_token, tokens=tokens)
        self.max_workers = max_workers
        self._extra = tuple(extra_handlers)
        self._ready = ready
        self._server: grpc.Server | None = None
        self._port: int | None = None
        self._health: health.HealthServicer | None = None
        self._lock = threading.Lock()

    @property
    def api_token(self) -> str | None:
        """The node's single ``api_token`` (None: none configured)."""
        return self.authority.api_token

    @property
    def port(self) -> int:
        """The bound port (after :meth:`start`), else the requested one."""
        return self._port if self._port is not None else self._requested_port

    @property
    def target(self) -> str:
        """``HOST:PORT`` a client dials."""
        host = self.host if ":" not in self.host else f"[{self.host}]"
        return f"{host}:{self.port}"

    def start(self) -> ProtoMoltGrpcServer:
        """Bind and start serving; returns once the port is bound.

        :raises RuntimeError: when the address cannot be bound.
        """
        with self._lock:
            if self._server is not None:
                return self
            interceptors = [] if self.authority.open else [_TokenInterceptor(self.authority)]
            server = grpc.server(
                ThreadPoolExecutor(
                    max_workers=self.max_workers, thread_name_prefix="protomolt-grpc"
                ),
                interceptors=interceptors,
                maximum_concurrent_rpcs=None,
            )
            handlers = {name: self._rpc_handler(name) for name in RPCS}
            upstream = {name: self._rpc_handler(name, upstream=True) for name in RPCS}
            server.add_generic_rpc_handlers(
                (
                    grpc.method_handlers_generic_handler(SERVICE_NAME, handlers),
                    grpc.method_handlers_generic_handler(UPSTREAM_SERVICE_NAME, upstream),
                    *self._extra,
                )
            )
            hs = _ReadinessHealth(self._ready)
            health_pb2_grpc.add_HealthServicer_to_server(hs, server)
            pool = descriptor_pool.Default()
            _ensure_reflection_v1_descriptor(pool)
            _ensure_alias_descriptor(pool)
            names = (*SERVICE_NAMES, HEALTH_SERVICE, REFLECTION_V1ALPHA, REFLECTION_V1)
            reflection.enable_server_reflection(names, server)
            servicer = reflection.ReflectionServicer(names)
            server.add_generic_rpc_handlers(
                (
                    grpc.method_handlers_generic_handler(
                        REFLECTION_V1,
                        {
                            "ServerReflectionInfo": grpc.stream_stream_rpc_method_handler(
                                servicer.ServerReflectionInfo,
                                request_deserializer=reflection_pb2.ServerReflectionRequest.FromString,
                                response_serializer=reflection_pb2.ServerReflectionResponse.SerializeToString,
                            )
                        },
                    ),
                )
            )
            address = f"{self.host if ':' not in self.host else '[' + self.host + ']'}:{self._requested_port}"
            try:
                port = server.add_insecure_port(address)
            except RuntimeError as exc:
                raise RuntimeError(f"cannot bind gRPC on {address}: {exc}") from exc
            if port == 0:
                raise RuntimeError(f"cannot bind gRPC on {address}")
            server.start()
            for name in ("", *SERVICE_NAMES):
                hs.set(name, health_pb2.HealthCheckResponse.SERVING)
            self._server, self._port, self._health = server, port, hs
        log.info(
            "grpc listening on %s",
            self.target,
            extra={"action": "grpc_started", "target": self.target},
        )
        return self

    def close(self, grace_s: float = 2.0) -> None:
        """Stop serving: health turns NOT_SERVING, in-flight calls get ``grace_s`` seconds.
        Idempotent."""
        with self._lock:
            server, hs = self._server, self._health
            self._server = self._health = None
        if server is None:
            return
        if hs is not None:
            hs.enter_graceful_shutdown()
        server.stop(grace_s).wait(grace_s + 5)
        log.info("grpc stopped", extra={"action": "grpc_stopped"})

    def _rpc_handler(self, rpc_name: str, *, upstream: bool = False) -> grpc.RpcMethodHandler:
        verb, request_cls, response_cls = RPCS[rpc_name]
        if upstream:
            # The same verb; the bytes are upstream's messages (a typed CompiledWorkflow).
            classes = alias_classes()
            request_cls = classes[request_cls.DESCRIPTOR.name]
            response_cls = classes[response_cls.DESCRIPTOR.name]
        call = self._transcoder(rpc_name, verb, request_cls, response_cls)
        # No request_deserializer: the handler parses the bytes itself, so a malformed request
        # is INVALID_ARGUMENT naming the problem instead of grpc's INTERNAL
        # "Exception deserializing request!".
        return grpc.unary_unary_rpc_method_handler(
            call, response_serializer=response_cls.SerializeToString
        )

    def _transcoder(
        self, rpc_name: str, verb: str, request_cls: Any, response_cls: Any
    ) -> Callable[[bytes, grpc.ServicerContext], Any]:
        catalog = self.catalog
        type_name = request_cls.DESCRIPTOR.full_name
        server = self

        def answer(raw: bytes, context: grpc.ServicerContext) -> Any:
            """The response message, or ``(status, description)`` to abort with."""
            # Who calls, before the bytes are parsed: a caller without a token learns nothing
            # from how its bytes parse.
            presented = _presented(context.invocation_metadata())
            caller = server.authority.resolve(presented)
            if caller is None:
                return (grpc.StatusCode.UNAUTHENTICATED, _unauthenticated_message(presented))
            try:
                request = request_cls.FromString(raw)
            except (DecodeError, RecursionError, ValueError) as exc:
                return _refuse(
                    context,
                    f"the request is not a valid {type_name} message: {exc or 'malformed bytes'}",
                )
            try:
                envelope = json_format.MessageToDict(request)
            except (json_format.Error, ValueError, TypeError, RecursionError) as exc:
                field = _failing_field(request)
                where = f"field '{field}'" if field else "the request"
                return _refuse(
                    context,
                    f"{where} cannot be read as JSON (numbers must be finite): {exc}",
                    field,
                )
            try:
                result = catalog.execute(verb, envelope, caller=caller)
            except ActionError as err:
                trailers: list[tuple[str, Any]] = [("protomolt-error", err.code)]
                if err.details:
                    trailers.append(("protomolt-error-details-bin", _details_bin(err.details)))
                context.set_trailing_metadata(tuple(trailers))
                return (
                    grpc.StatusCode[err.grpc_status],
                    _bounded(f"{err.code}: {err.message}"),
                )
            try:
                return json_format.ParseDict(result, response_cls(), ignore_unknown_fields=True)
            except Exception:  # ParseError, TypeError, ValueError, OverflowError, ...
                log.exception(
                    "result of %s does not parse as %s",
                    verb,
                    response_cls.DESCRIPTOR.full_name,
                    extra={"action": "grpc_result_unparseable", "rpc": rpc_name},
                )
                context.set_trailing_metadata((("protomolt-error", "internal-error"),))
                full_name = response_cls.DESCRIPTOR.full_name
                return (
                    grpc.StatusCode.INTERNAL,
                    f"internal-error: Result of '{verb}' does not parse as {full_name}",
                )

        def handle(raw: bytes, context: grpc.ServicerContext) -> Any:
            try:
                outcome = answer(raw, context)
            except Exception:  # INTERNAL with a log, not a crash
                log.exception(
                    "%s failed",
                    rpc_name,
                    extra={"action": "grpc_internal_error", "rpc": rpc_name},
                )
                context.set_trailing_metadata((("protomolt-error", "internal-error"),))
                outcome = (grpc.StatusCode.INTERNAL, f"internal-error: {rpc_name} failed")
            if isinstance(outcome, tuple):
                context.abort(*outcome)
            return outcome

        return handle


#: Most characters of a status message sent (gRPC carries it as metadata, and clients refuse
#: more than 16 KiB of it: a refusal echoing a huge value would reach them as
#: RESOURCE_EXHAUSTED, not as what it is).
MAX_STATUS_MESSAGE = 2048
#: Most bytes of the ``protomolt-error-details-bin`` trailer (beyond: only its ``field`` and
#: ``path``).
MAX_DETAILS_BYTES = 4096


def _bounded(message: str) -> str:
    """``message`` cut to :data:`MAX_STATUS_MESSAGE` characters (with ``…`` when cut)."""
    if len(message) <= MAX_STATUS_MESSAGE:
        return message
    return message[: MAX_STATUS_MESSAGE - 1] + "…"


def _details_bin(details: Mapping[str, Any]) -> bytes:
    """The error details as the trailer's UTF-8 JSON, at most :data:`MAX_DETAILS_BYTES` (else
    only the ``field`` and ``path`` that name what was refused, each bounded)."""
    raw = json.dumps(details).encode("utf-8")
    if len(raw) <= MAX_DETAILS_BYTES:
        return raw
    kept = {k: _bounded(str(details[k]))[:512] for k in ("field", "path") if k in details}
    return json.dumps({**kept, "truncated": True}).encode("utf-8")


def _refuse(
    context: grpc.ServicerContext, message: str, field: str | None = None
) -> tuple[grpc.StatusCode, str]:
    """An ``invalid-input`` abort with the same trailers a verb's InvalidInput gets."""
    trailers: list[tuple[str, Any]] = [("protomolt-error", "invalid-input")]
    if field:
        details = json.dumps({"field": field}).encode("utf-8")
        trailers.append(("protomolt-error-details-bin", details))
    context.set_trailing_metadata(tuple(trailers))
    return (grpc.StatusCode.INVALID_ARGUMENT, _bounded(f"invalid-input: {message}"))


def _failing_field(request: Any) -> str | None:
    """The JSON name of the first top-level field that does not print as JSON, or None."""
    for descriptor, value in request.ListFields():
        if descriptor.message_type is None:
            continue
        if descriptor.message_type.GetOptions().map_entry:
            values = list(value.values())
        else:
            values = list(value) if descriptor.is_repeated else [value]
        for item in values:
            if not hasattr(item, "ListFields"):
                continue
            try:
                json_format.MessageToDict(item)
            except (json_format.Error, ValueError, TypeError, RecursionError):
                return descriptor.json_name
    return None
