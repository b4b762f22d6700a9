"""The workflow JSON envelope -> :class:`CompiledWorkflow` (reference section 1 and 2.1).

Only the camelCase keys below are read; other keys are ignored (as upstream). "Text" means a
JSON string that is not blank; anything else counts as absent. Booleans are read leniently
(``"true"`` is coerced), as Jackson does upstream.

``deadlineMs`` (the workflow's segment budget, and a step's call deadline) is strict, unlike
upstream: absent, null or 0 means the default (30 s for the workflow, the remaining budget for
a step); otherwise it must be a JSON number holding a whole number of milliseconds from 1 to
:data:`MAX_DEADLINE_MS` (24 h). Booleans, strings, fractions, negatives and larger values are a
parse error naming ``deadlineMs`` (a huge value would otherwise overflow the call timeout at
run time).

Schemas (exactly one of):

- ``{"descriptorSetBase64": ...}``: a serialized FileDescriptorSet;
- ``{"sources": {path: proto text}, "root"?: path}``: compiled at run time with
  ``grpc_tools.protoc``;
- ``{"type": "pkg.Msg"}``: resolved from the host's type pool (``Runtime.pool``).

Imports missing from a set or from the sources are satisfied from fallbacks: the well-known
types and the house protos (``ai/pipestream/proto/validate/v1/validate.proto``,
``.../meta/v1/metadata.proto``).

Caching (the worker parses the same definition for every job): compiled workflows are cached
per :class:`Runtime` by canonical definition text; descriptor pools are cached process-wide by
the digest of the descriptor set (or of the sources), so ``sources`` are compiled once per
process per text.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import hashlib
import importlib
import importlib.resources
import json
import logging
import math
import os
import re
import subprocess
import sys
import tempfile
import threading
from collections import OrderedDict
from collections.abc import Mapping
from pathlib import PurePosixPath
from typing import Any

from google.protobuf import descriptor as _d
from google.protobuf import descriptor_pb2, descriptor_pool, json_format, message_factory
from google.protobuf.message import DecodeError, Message

from protomolt_jobs.config import duration_s
from protomolt_jobs.workflow import mapping
from protomolt_jobs.workflow.proto_sources import qualify_rpc_types
from protomolt_jobs.workflow.types import (
    APPROVAL,
    DEFAULT_DEADLINE_MS,
    DEFAULT_DECISIONS,
    DEFAULT_MAX_PARALLEL,
    EFFECT_EXTERNAL,
    EFFECT_IDEMPOTENT,
    EFFECTS,
    ON_DECISION,
    ON_DONE,
    ON_EXHAUSTED,
    ON_FAILURE,
    ON_SUCCESS,
    ApprovalSpec,
    CompiledWorkflow,
    Dependency,
    EdgeSpec,
    FanOutSpec,
    LoopSpec,
    Output,
    ResumableSpec,
    Runtime,
    Step,
    StructuredSpec,
    VerifySpec,
    WorkflowParseError,
)

__all__ = ["MAX_DEADLINE_MS", "canonical_text", "message_class", "parse_input", "parse_workflow"]

log = logging.getLogger("protomolt_jobs.workflow")

#: The largest ``deadlineMs`` accepted, in milliseconds (24 h): a segment is held under a
#: heartbeat lease; a longer budget is a mistake, and much larger ones overflow timeouts.
MAX_DEADLINE_MS = 86_400_000

_SCHEMA_KEYS = ("type", "sources", "descriptorSetBase64")
#: Compiled workflows kept per Runtime.
WORKFLOW_CACHE_SIZE = 512
#: Descriptor pools kept per process.
POOL_CACHE_SIZE = 64
#: Seconds protoc may take to compile a ``sources`` schema.
PROTOC_TIMEOUT_S = 60.0
#: Most steps a graph workflow may have (and a workflow ``simulate`` plays). Verifying a graph
#: (every step's ancestors) and simulating it (a play per step) grow with the square of its
#: size: without a bound one request of a long chain held a CPU for minutes or the memory for
#: gigabytes. Upstream bounds a fan-out at the same 1024.
MAX_GRAPH_STEPS = 1024
#: Most dependencies (resolved edges: ``after`` entries, edge sources, the implied "step before")
#: a graph workflow may have, summed over its steps. The step cap alone let 1024 steps carry 64
#: edges each (a 0.7 MB body) and ``simulate`` hold a CPU for 200 s; verifying grows with the
#: edges too (each step's ancestors are unions over its dependencies).
MAX_GRAPH_DEPENDENCIES = 4096

_WKT_MODULES = (
    "google.protobuf.any_pb2",
    "google.protobuf.api_pb2",
    "google.protobuf.descriptor_pb2",
    "google.protobuf.duration_pb2",
    "google.protobuf.empty_pb2",
    "google.protobuf.field_mask_pb2",
    "google.protobuf.source_context_pb2",
    "google.protobuf.struct_pb2",
    "google.protobuf.timestamp_pb2",
    "google.protobuf.type_pb2",
    "google.protobuf.wrappers_pb2",
)
_HOUSE_MODULES = (
    "protomolt_jobs.pb.ai.pipestream.proto.validate.v1.validate_pb2",
    "protomolt_jobs.pb.ai.pipestream.proto.meta.v1.metadata_pb2",
)
_HOUSE_PREFIXES = ("google/protobuf/", "ai/pipestream/proto/validate/", "ai/pipestream/proto/meta/")

_pools: OrderedDict[str, tuple[descriptor_pool.DescriptorPool, tuple[str, ...]]] = OrderedDict()
_pools_lock = threading.Lock()
_compile_locks: dict[str, threading.Lock] = {}


# -- lenient JSON readers --------------------------------------------------------------------


def _text(obj: Mapping[str, Any], key: str) -> str | None:
    value = obj.get(key)
    if isinstance(value, str) and value.strip():
        return value
    return None


def _bool(obj: Mapping[str, Any], key: str) -> bool:
    value = obj.get(key)
    if isinstance(value, bool):
        return value
    if isinstance(value, str):
        return value.strip().lower() == "true"
    if isinstance(value, int | float):
        return value != 0
    return False


def _deadline_ms(obj: Mapping[str, Any], step: str) -> int:
    """``deadlineMs`` of the workflow (``step == ""``) or of a step, in milliseconds.

    Absent or null is 0 (the default). Otherwise it must be a JSON number holding a whole
    number from 0 to :data:`MAX_DEADLINE_MS`; booleans, strings, fractions, negatives and
    larger values are refused (unlike upstream's lenient ``asLong``: a huge value would only
    overflow the call timeout at run time, and a string or negative one is a typo).

    :raises WorkflowParseError: naming ``deadlineMs`` and the value.
    """
    value = obj.get("deadlineMs")
    if value is None:
        return 0
    where = f"step '{step}'" if step else "the workflow"
    problem = (
        f"'deadlineMs' of {where} must be a whole number of milliseconds from 0 (the default) "
        f"to {MAX_DEADLINE_MS} (24 h)"
    )
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise WorkflowParseError(step, f"{problem}; got {type(value).__name__} {_brief(value)}")
    if isinstance(value, float):
        if not (math.isfinite(value) and value.is_integer()):
            raise WorkflowParseError(step, f"{problem}; got {_brief(value)}")
        value = int(value)
    if value < 0 or value > MAX_DEADLINE_MS:
        raise WorkflowParseError(step, f"{problem}; got {_brief(value)}")
    return value


def _brief(value: Any) -> str:
    """A value for an error message, cut short (a 401-digit number stays readable)."""
    try:
        text = json.dumps(value)
    except (TypeError, ValueError, OverflowError):
        text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _as_rule_text(value: Any) -> str:
    """Non-string rule elements are coerced as Jackson's ``asText`` does (objects -> "")."""
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return json.dumps(value)
    return ""


def canonical_text(obj: Any) -> str | None:
    """Canonical JSON of a definition (sorted keys), or None when it is not JSON-serialisable."""
    try:
        return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    except (TypeError, ValueError):
        return None


# -- descriptor pools ------------------------------------------------------------------------


def _fallback_files() -> dict[str, descriptor_pb2.FileDescriptorProto]:
    """File name -> FileDescriptorProto for every import a schema may omit."""
    out: dict[str, descriptor_pb2.FileDescriptorProto] = {}
    for name in (*_WKT_MODULES, *_HOUSE_MODULES):
        try:
            module = importlib.import_module(name)
        except ImportError:  # the house protos are generated code; absent only in a broken tree
            continue
        fdp = descriptor_pb2.FileDescriptorProto.FromString(module.DESCRIPTOR.serialized_pb)
        out[fdp.name] = fdp
    return out


_FALLBACKS: dict[str, descriptor_pb2.FileDescriptorProto] | None = None


def _fallbacks() -> dict[str, descriptor_pb2.FileDescriptorProto]:
    global _FALLBACKS
    if _FALLBACKS is None:
        _FALLBACKS = _fallback_files()
    return _FALLBACKS


def _link(
    fds: descriptor_pb2.FileDescriptorSet, where: str
) -> tuple[descriptor_pool.DescriptorPool, tuple[str, ...]]:
    """A fresh pool holding the set's files (dependencies first) plus needed fallbacks."""
    given = {f.name: f for f in fds.file}
    fallbacks = _fallbacks()
    pool = descriptor_pool.DescriptorPool()
    added: set[str] = set()
    visiting: set[str] = set()

    def add(name: str, required_by: str | None) -> None:
        if name in added:
            return
        if name in visiting:
            raise WorkflowParseError("", f"Cyclic proto import involving '{name}' (at '{where}')")
        fdp = given.get(name) or fallbacks.get(name)
        if fdp is None:
            raise WorkflowParseError(
                "", f"Unresolved import '{name}' required by '{required_by}' (at '{where}')"
            )
        visiting.add(name)
        for dep in fdp.dependency:
            add(dep, name)
        visiting.discard(name)
        try:
            pool.Add(fdp)
        except Exception as exc:  # upb raises TypeError/ValueError with the linker's text
            raise WorkflowParseError(
                "", f"Descriptor set does not link: {exc} (at '{where}')"
            ) from exc
        added.add(name)

    for f in fds.file:
        add(f.name, None)
    return pool, tuple(given)


def _cached_pool(key: str, build: Any) -> tuple[descriptor_pool.DescriptorPool, tuple[str, ...]]:
    with _pools_lock:
        hit = _pools.get(key)
        if hit is not None:
            _pools.move_to_end(key)
            return hit
        lock = _compile_locks.setdefault(key, threading.Lock())
    with lock:  # one compile per key at a time; the others wait and take the result
        with _pools_lock:
            hit = _pools.get(key)
            if hit is not None:
                return hit
        built = build()
        with _pools_lock:
            _pools[key] = built
            while len(_pools) > POOL_CACHE_SIZE:
                _pools.popitem(last=False)
            _compile_locks.pop(key, None)
        return built


def _from_descriptor_set(value: Any) -> tuple[descriptor_pool.DescriptorPool, tuple[str, ...]]:
    where = "/schema/descriptorSetBase64"
    if not isinstance(value, str):
        raise WorkflowParseError("", f"'descriptorSetBase64' must be a string (at '{where}')")
    text = value.strip()
    try:
        # Java's basic decoder accepts missing padding and rejects whitespace and other alphabets.
        raw = base64.b64decode(text + "=" * (-len(text) % 4), validate=True)
    except (binascii.Error, ValueError) as exc:
        raise WorkflowParseError(
            "", f"'descriptorSetBase64' is not valid base64: {exc} (at '{where}')"
        ) from exc

    def build() -> tuple[descriptor_pool.DescriptorPool, tuple[str, ...]]:
        try:
            fds = descriptor_pb2.FileDescriptorSet.FromString(raw)
        except (DecodeError, ValueError) as exc:
            raise WorkflowParseError(
                "", f"Not a serialized google.protobuf.FileDescriptorSet: {exc} (at '{where}')"
            ) from exc
        if not fds.file:
            raise WorkflowParseError(
                "",
                f"Not a serialized google.protobuf.FileDescriptorSet: it holds no files (at '{where}')",
            )
        return _link(fds, where)

    return _cached_pool("set:" + hashlib.sha256(raw).hexdigest(), build)


def _house_set_file(tmp: str) -> str:
    """Write the house protos as a FileDescriptorSet protoc can take as ``--descriptor_set_in``."""
    fds = descriptor_pb2.FileDescriptorSet()
    for name, fdp in _fallbacks().items():
        if not name.startswith("google/protobuf/"):
            fds.file.add().CopyFrom(fdp)
    path = f"{tmp}/house.pb"
    with open(path, "wb") as fh:
        fh.write(fds.SerializeToString())
    return path


#: A ``sources`` path: relative, ``/``-separated segments of letters, digits, ``_``, ``-``, ``.``,
#: none starting with ``-``, ``.`` or ``@``, ending in ``.proto``. The paths are protoc's
#: command-line arguments: ``@args.proto`` made protoc read its options from another source
#: file (``--plugin=...=/bin/sh`` ran a command), ``--descriptor_set_out=...`` and ``-I...``
#: are options, so nothing that protoc could read as one may pass.
_SOURCE_PATH = re.compile(r"(?:[A-Za-z0-9_][A-Za-z0-9_.-]*/)*[A-Za-z0-9_][A-Za-z0-9_.-]*\.proto")


def _compile_sources(sources: dict[str, str], root: str | None) -> descriptor_pb2.FileDescriptorSet:
    where = "/schema/sources"
    # Bare rpc types resolved in the package first, as upstream's compiler does (proto_sources).
    sources = qualify_rpc_types(sources)
    with tempfile.TemporaryDirectory(prefix="protomolt-sources-") as tmp:
        for name, text in sources.items():
            path = PurePosixPath(name)
            if not _SOURCE_PATH.fullmatch(name):
                raise WorkflowParseError(
                    "",
                    f"Failed to compile proto sources: '{name}' is not a relative .proto path "
                    f"(at '{where}')",
                )
            target = PurePosixPath(tmp) / path
            os.makedirs(str(target.parent), exist_ok=True)
            with open(str(target), "w", encoding="utf-8") as fh:
                fh.write(text)
        out = f"{tmp}/out.pb"
        wkt = importlib.resources.files("grpc_tools") / "_proto"
        files = [root] if root else sorted(sources)
        args = [
            sys.executable,
            "-m",
            "grpc_tools.protoc",
            f"-I{tmp}",
            f"-I{wkt}",
            f"--descriptor_set_in={_house_set_file(tmp)}",
            "--include_imports",
            f"--descriptor_set_out={out}",
            *files,
        ]
        # A subprocess: protoc reports errors only on its stderr, which we want in the message.
        try:
            proc = subprocess.run(
                args,
                capture_output=True,
                text=True,
                errors="replace",  # protoc's stderr is text, but never fail on its bytes
                check=False,
                timeout=PROTOC_TIMEOUT_S,
                cwd=tmp,
            )
        except subprocess.TimeoutExpired as exc:
            raise WorkflowParseError(
                "", f"Failed to compile proto sources: protoc took over {PROTOC_TIMEOUT_S}s"
            ) from exc
        if proc.returncode != 0:
            detail = (
                proc.stderr.strip().replace(tmp + "/", "") or f"protoc exited {proc.returncode}"
            )
            raise WorkflowParseError(
                "", f"Failed to compile proto sources: {detail} (at '{where}')"
            )
        with open(out, "rb") as fh:
            return descriptor_pb2.FileDescriptorSet.FromString(fh.read())


def _from_sources(
    schema: Mapping[str, Any],
) -> tuple[descriptor_pool.DescriptorPool, tuple[str, ...]]:
    sources = schema.get("sources")
    if not isinstance(sources, dict) or not sources:
        raise WorkflowParseError(
            "",
            "'sources' must be a non-empty object of file path to proto text (at '/schema/sources')",
        )
    for name, text in sources.items():
        if not isinstance(text, str):
            raise WorkflowParseError(
                "", f"'sources' entry '{name}' must be proto text (at '/schema/sources')"
            )
    root = _text(schema, "root")
    if root is not None and root not in sources:
        raise WorkflowParseError(
            "", "'root' must name a file present in 'sources' (at '/schema/root')"
        )
    key_text = canonical_text({"sources": sources, "root": root}) or ""
    key = "src:" + hashlib.sha256(key_text.encode("utf-8")).hexdigest()

    def build() -> tuple[descriptor_pool.DescriptorPool, tuple[str, ...]]:
        fds = _compile_sources(sources, root)
        pool, files = _link(fds, "/schema/sources")
        return pool, files

    return _cached_pool(key, build)


def _from_type(
    name: Any, runtime: Runtime
) -> tuple[descriptor_pool.DescriptorPool, tuple[str, ...], str]:
    if not isinstance(name, str) or not name.strip():
        raise WorkflowParseError("", "'type' must be a message name (at '/schema/type')")
    if runtime.pool is None:
        raise WorkflowParseError(
            "", f"Unknown type '{name}': this node has no shared type pool (at '/schema/type')"
        )
    try:
        desc = runtime.pool.FindMessageTypeByName(name)
    except KeyError:
        raise WorkflowParseError("", f"Unknown type '{name}' (at '/schema/type')") from None
    files: list[str] = []

    def walk(f: _d.FileDescriptor) -> None:
        if f.name in files:
            return
        files.append(f.name)
        for dep in f.dependencies:
            walk(dep)

    walk(desc.file)
    return runtime.pool, tuple(files), name


def _default_message(
    pool: descriptor_pool.DescriptorPool, files: tuple[str, ...], root: str | None
) -> str | None:
    names: list[str] = []
    candidates = [root] if root else [f for f in files if not f.startswith(_HOUSE_PREFIXES)]
    for fname in candidates:
        try:
            fd = pool.FindFileByName(fname)
        except KeyError:
            continue
        names.extend(m.full_name for m in fd.message_types_by_name.values())
    return names[0] if len(names) == 1 else None


def _find_type(pool: descriptor_pool.DescriptorPool, name: str, step: str = "") -> _d.Descriptor:
    try:
        desc = pool.FindMessageTypeByName(name)
    except KeyError:
        raise WorkflowParseError(step, f"Unknown type '{name}'") from None
    if desc.GetOptions().map_entry:
        raise WorkflowParseError(step, f"Unknown type '{name}'")
    return desc


def message_class(desc: _d.Descriptor) -> type[Message]:
    """The message class for ``desc`` (cached by protobuf per descriptor)."""
    return message_factory.GetMessageClass(desc)


# -- steps -----------------------------------------------------------------------------------


def _parse_cel_rules(value: Any, step: str) -> tuple[mapping.CelRule, ...]:
    if not isinstance(value, list):
        return ()
    out = []
    for item in value:
        if not isinstance(item, dict):
            raise WorkflowParseError(step, "each CEL rule must be an object")
        target = _text(item, "target")
        if target is None:
            raise WorkflowParseError(step, "a CEL rule needs a 'target' path")
        fallback = item.get("fallback")
        out.append(
            mapping.CelRule(
                target=target.strip(),
                filter=_text(item, "filter") or "",
                selector=_text(item, "selector") or "",
                fallback=tuple(_as_rule_text(f) for f in fallback)
                if isinstance(fallback, list)
                else (),
            )
        )
    return tuple(out)


def _parse_text_rules(value: Any) -> tuple[mapping.TextRule, ...]:
    if not isinstance(value, list):
        return ()
    rules = (mapping.parse_text_rule(_as_rule_text(v)) for v in value)
    return tuple(r for r in rules if r is not None)


def _resolve_method(
    pool: descriptor_pool.DescriptorPool, files: tuple[str, ...], method: str, step: str
) -> _d.MethodDescriptor:
    slash = method.find("/")
    if slash <= 0 or slash >= len(method) - 1:
        raise WorkflowParseError(step, f"method must be 'package.Service/Method'; got '{method}'")
    service_name, method_name = method[:slash], method[slash + 1 :]
    try:
        service = pool.FindServiceByName(service_name)
    except KeyError:
        service = None
    if (
        service is None
        or service.file.name not in files
        or method_name not in service.methods_by_name
    ):
        raise WorkflowParseError(step, f"method '{method}' not found in the workflow's schema")
    return service.methods_by_name[method_name]


def _parse_effect(
    obj: Mapping[str, Any], name: str, pool: descriptor_pool.DescriptorPool, files: tuple[str, ...]
) -> tuple[str, VerifySpec | None, str]:
    """``effect``, ``verify`` and ``adapterVersion`` of one step (docs/workflows.md *Effects*)."""
    effect = obj.get("effect", EFFECT_IDEMPOTENT)
    if effect is None:
        effect = EFFECT_IDEMPOTENT
    if effect not in EFFECTS:
        raise WorkflowParseError(
            name, f"'effect' must be one of none, idempotent, external; got {_brief(effect)}"
        )
    adapter = obj.get("adapterVersion")
    if adapter is not None and not (isinstance(adapter, str) and adapter.strip()):
        raise WorkflowParseError(name, "'adapterVersion' must be a non-blank string")
    verify = None
    if obj.get("verify") is not None:
        if effect != EFFECT_EXTERNAL:
            raise WorkflowParseError(name, "'verify' is only for a step with effect 'external'")
        value = obj["verify"]
        if not isinstance(value, dict):
            raise WorkflowParseError(name, "'verify' must be an object")
        method_text = _text(value, "method")
        found = _text(value, "found")
        if method_text is None or found is None:
            raise WorkflowParseError(name, "'verify' needs 'method' and 'found'")
        method = _resolve_method(pool, files, method_text.strip(), name)
        verify = VerifySpec(
            target=(_text(value, "target") or _text(obj, "target") or "").strip(),
            tls=_bool(value, "tls") if "tls" in value else _bool(obj, "tls"),
            method=method,
            method_name=method_text.strip(),
            rules=_parse_text_rules(value.get("rules")),
            cel_rules=_parse_cel_rules(value.get("celRules"), name),
            found=found,
            receipt=_text(value, "receipt") or "",
        )
    return effect, verify, (adapter or "").strip()


#: Step keys that make a workflow a graph workflow (besides the workflow's own
#: ``maxParallel`` and ``completion``).
GRAPH_STEP_KEYS = ("after", "join", "compensate", "edge", "fanOut", "structured", "loop")
_ON = (ON_SUCCESS, ON_FAILURE, ON_DONE)
_INT32 = (-(2**31), 2**31 - 1)


def _int32(obj: Mapping[str, Any], key: str, step: str, message: str) -> int:
    """An optional 32-bit integer read leniently as upstream (``"5"`` is 5); absent -> 0."""
    value = obj.get(key)
    if value is None:
        return 0
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        value = int(value.strip())
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise WorkflowParseError(step, message)
    if not _INT32[0] <= value <= _INT32[1]:
        raise WorkflowParseError(step, message)
    return value


def _parse_after(value: Any, step: str) -> tuple[Dependency, ...]:
    shape = '\'after\' must be an array of step names or {"step": name, "on": outcome} objects'
    if not isinstance(value, list):
        raise WorkflowParseError(step, shape)
    out: list[Dependency] = []
    for item in value:
        if isinstance(item, str) and item.strip():
            out.append(Dependency(item.strip()))
        elif isinstance(item, dict) and _text(item, "step") is not None:
            on = item.get("on", ON_SUCCESS)
            decision = isinstance(on, str) and on.startswith(ON_DECISION) and on[len(ON_DECISION) :]
            if on not in _ON and not (decision and decision.strip() == decision):
                raise WorkflowParseError(
                    step,
                    f"'after' entry for '{item['step']}': 'on' must be 'success', 'failure', "
                    f"'done' or 'decision:<name>'; got {_brief(on)}",
                )
            out.append(Dependency(str(item["step"]).strip(), on))
        else:
            raise WorkflowParseError(step, f"{shape}; got {_brief(item)}")
    return tuple(out)


_LOOP_SHAPE = '\'loop\' must be an object {"to": step, "max": 1..20, "onExhausted": "fail"|"park"}'


def _parse_loop(value: Any, step: str) -> LoopSpec:
    """A step's ``loop`` object (docs/workflows.md *Bounded loops*); the verifier checks the
    bounds and the body (``loops.findings``).

    :raises WorkflowParseError: not an object, ``to`` not a name, ``max`` not a whole number,
        ``onExhausted`` not ``fail``/``park``, ``allowEffects`` not a boolean.
    """
    if not isinstance(value, dict):
        raise WorkflowParseError(step, f"{_LOOP_SHAPE}; got {_brief(value)}")
    to = _text(value, "to")
    if to is None or not to.strip():
        raise WorkflowParseError(step, "'loop.to' must name a step")
    bound = value.get("max")
    if isinstance(bound, float) and bound.is_integer():
        bound = int(bound)
    if isinstance(bound, bool) or not isinstance(bound, int) or not _INT32[0] <= bound <= _INT32[1]:
        raise WorkflowParseError(step, f"'loop.max' must be a whole number; got {_brief(bound)}")
    on_exhausted = value.get("onExhausted", "fail")
    if on_exhausted not in ON_EXHAUSTED:
        raise WorkflowParseError(
            step, f"'loop.onExhausted' must be 'fail' or 'park'; got {_brief(on_exhausted)}"
        )
    allow = value.get("allowEffects", False)
    if not isinstance(allow, bool):
        raise WorkflowParseError(step, "'loop.allowEffects' must be a boolean")
    return LoopSpec(to=to.strip(), max=bound, on_exhausted=on_exhausted, allow_effects=allow)


def _parse_structured(
    obj: dict[str, Any], name: str, pool: descriptor_pool.DescriptorPool
) -> StructuredSpec:
    spec = obj["structured"]
    if not isinstance(spec, dict):
        raise WorkflowParseError(name, "'structured' must be an object")
    if any(k in obj for k in ("target", "method", "tls")):
        raise WorkflowParseError(name, "a structured step must not declare target, method, or tls")
    target_type = _text(spec, "targetType")
    model = _text(spec, "model")
    if target_type is None or model is None:
        raise WorkflowParseError(name, "a structured step needs 'targetType' and 'model'")
    attempts = _int32(spec, "maxAttempts", name, "structured.maxAttempts must be a 32-bit integer")
    return StructuredSpec(
        target_type=_find_type(pool, target_type.strip(), name), model=model, max_attempts=attempts
    )


def _parse_edge(value: Any, name: str, pool: descriptor_pool.DescriptorPool) -> EdgeSpec:
    if not isinstance(value, dict):
        raise WorkflowParseError(name, "'edge' must be an object")
    sources = value.get("sources")
    produce = _text(value, "produceType")
    if (
        not isinstance(sources, list)
        or not sources
        or not all(isinstance(x, str) for x in sources)
        or produce is None
    ):
        raise WorkflowParseError(name, "an edge needs 'sources' and 'produceType'")
    project_to = _text(value, "projectTo")
    return EdgeSpec(
        sources=tuple(x.strip() for x in sources),
        produce_type=_find_type(pool, produce.strip(), name),
        rules=_parse_text_rules(value.get("rules")),
        cel_rules=_parse_cel_rules(value.get("celRules"), name),
        project_to=_find_type(pool, project_to.strip(), name) if project_to else None,
        validate=_bool(value, "validate"),
    )


def _parse_fan_out(value: Any, name: str, pool: descriptor_pool.DescriptorPool) -> FanOutSpec:
    if not isinstance(value, dict):
        raise WorkflowParseError(name, "'fanOut' must be an object")
    items = _text(value, "items")
    collect_type = _text(value, "collectType")
    collect_into = _text(value, "collectInto")
    policy = _text(value, "failurePolicy")
    if items is None or collect_type is None or collect_into is None or policy is None:
        raise WorkflowParseError(
            name, "a fanOut needs 'items', 'collectType', 'collectInto', and 'failurePolicy'"
        )
    if policy not in ("FAIL_FAST", "CONTINUE"):
        raise WorkflowParseError(
            name, f"fanOut.failurePolicy must be FAIL_FAST or CONTINUE; got '{policy}'"
        )
    max_items = _int32(value, "maxItems", name, "fanOut.maxItems must be a 32-bit integer")
    max_conc = _int32(
        value, "maxConcurrency", name, "fanOut.maxConcurrency must be a 32-bit integer"
    )
    return FanOutSpec(
        items=items.strip(),
        max_items=max_items,
        max_concurrency=max_conc,
        failure_policy=policy,
        collect_type=_find_type(pool, collect_type.strip(), name),
        collect_into=collect_into.strip(),
    )


def _parse_step(
    index: int,
    obj: Any,
    pool: descriptor_pool.DescriptorPool,
    files: tuple[str, ...],
    workflow: str = "",
) -> Step:
    if not isinstance(obj, dict):
        raise WorkflowParseError("", "each step must be an object")
    name = _text(obj, "name")
    if name is None:
        raise WorkflowParseError("", "each step needs a 'name'")
    target = _text(obj, "target") or ""
    method_text = _text(obj, "method") or ""
    method = None
    structured = None
    approval = None
    if obj.get("completion") == APPROVAL:
        if any(k in obj for k in ("target", "method", "edge", "fanOut", "structured")):
            raise WorkflowParseError(
                name,
                'an approval step (completion: "approval") makes no call: it must not '
                "declare target, method, edge, fanOut or structured",
            )
        approval = _parse_approval(obj.get("approval"), name)
    elif "approval" in obj:
        raise WorkflowParseError(name, "'approval' is only for a step with completion \"approval\"")
    if approval is not None:
        target = ""
    elif "structured" in obj:
        structured = _parse_structured(obj, name, pool)
        target = "structured-generation"
    else:
        if not target or not method_text:
            raise WorkflowParseError(name, "a step needs 'target' and 'method'")
        method = _resolve_method(pool, files, method_text, name)
    cel_rules = _parse_cel_rules(obj.get("celRules"), name)
    edge = _parse_edge(obj["edge"], name, pool) if "edge" in obj else None
    fan_out = None
    if "fanOut" in obj:
        if edge is None:
            raise WorkflowParseError(
                name,
                "fan-out requires an edge; the items resolve against the edge's produced message",
            )
        fan_out = _parse_fan_out(obj["fanOut"], name, pool)
    if obj.get("when") is not None and not isinstance(obj["when"], str):
        # Dropping it (as other absent text does) would run a step its author gated off.
        raise WorkflowParseError(
            name, f"'when' must be a CEL expression (a string); got {_brief(obj['when'])}"
        )
    after = _parse_after(obj["after"], name) if "after" in obj else None
    join = obj.get("join", "all")
    if join not in ("all", "any"):
        raise WorkflowParseError(name, f"'join' must be 'all' or 'any'; got {_brief(join)}")
    compensate = ""
    if "compensate" in obj:
        text = _text(obj, "compensate")
        if text is None:
            raise WorkflowParseError(name, "'compensate' must name a step")
        compensate = text.strip()
    effect, verify, adapter_version = _parse_effect(obj, name, pool, files)
    if fan_out is not None:
        output_type = fan_out.collect_type
    elif structured is not None:
        output_type = structured.target_type
    elif approval is not None:
        output_type = _approval_output_type(pool)
    else:
        output_type = method.output_type if method is not None else None
    return Step(
        index=index,
        name=name,
        target=target,
        tls=_bool(obj, "tls"),
        method=method,
        method_name=method_text,
        input_type=method.input_type if method is not None else None,
        output_type=output_type,
        when=_text(obj, "when") or "",
        rules=_parse_text_rules(obj.get("rules")),
        cel_rules=cel_rules,
        validate=_bool(obj, "validate"),
        deadline_ms=_deadline_ms(obj, name),
        completion=obj["completion"] if isinstance(obj.get("completion"), str) else "",
        after=after,
        join=join,
        compensate=compensate,
        edge=edge,
        fan_out=fan_out,
        structured=structured,
        effect=effect,
        verify=verify,
        adapter_version=adapter_version,
        approval=approval,
        capabilities=_parse_capabilities(obj, name),
        loop=_parse_loop(obj["loop"], name) if "loop" in obj else None,
        resumable=_parse_resumable(obj["resumable"], name) if "resumable" in obj else None,
        reports_progress=_parse_reports_progress(obj, name),
        workflow=workflow,
    )


_RESUMABLE_SHAPE = (
    '\'resumable\' must be an object {"state": field, "done": expression, "progress"?: expression}'
)


def _parse_reports_progress(obj: Mapping[str, Any], step: str) -> bool:
    """A step's ``reportsProgress`` (docs/long-steps.md): absent or null is false.

    :raises WorkflowParseError: not a boolean.
    """
    value = obj.get("reportsProgress")
    if value is None:
        return False
    if not isinstance(value, bool):
        raise WorkflowParseError(
            step, f"'reportsProgress' must be true or false; got {_brief(value)}"
        )
    return value


def _parse_resumable(value: Any, step: str) -> ResumableSpec:
    """A step's ``resumable`` object (docs/long-steps.md); the verifier checks the fields
    against the method's messages (``resumable.findings``).

    :raises WorkflowParseError: not an object, ``state`` not a field name, ``done`` blank or
        not text, ``progress`` not text.
    """
    if not isinstance(value, dict):
        raise WorkflowParseError(step, f"{_RESUMABLE_SHAPE}; got {_brief(value)}")
    state = value.get("state")
    if not isinstance(state, str) or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", state.strip()):
        raise WorkflowParseError(
            step, f"'resumable.state' must name a field of the response; got {_brief(state)}"
        )
    done = value.get("done")
    if not isinstance(done, str) or not done.strip():
        raise WorkflowParseError(
            step, f"'resumable.done' must be a CEL expression (a string); got {_brief(done)}"
        )
    progress = value.get("progress", "")
    if progress is None:
        progress = ""
    if not isinstance(progress, str):
        raise WorkflowParseError(
            step,
            f"'resumable.progress' must be a CEL expression (a string); got {_brief(progress)}",
        )
    return ResumableSpec(state=state.strip(), done=done.strip(), progress=progress.strip())


#: A capability name: letters, digits and ``_ . : / -``, starting with a letter (``publish:site``).
_CAPABILITY = re.compile(r"[A-Za-z][A-Za-z0-9_.:/-]{0,127}")


def _parse_capabilities(obj: dict[str, Any], name: str) -> tuple[str, ...]:
    """``capabilities`` of one step: sorted, unique names (``()`` when absent).

    :raises WorkflowParseError: not a list of capability names.
    """
    raw = obj.get("capabilities")
    if raw is None:
        return ()
    if not isinstance(raw, list) or not all(
        isinstance(c, str) and _CAPABILITY.fullmatch(c) for c in raw
    ):
        raise WorkflowParseError(
            name,
            "'capabilities' must be a list of capability names (a letter, then letters, digits "
            f"or _ . : / -, at most 128); got {_brief(raw)}",
        )
    return tuple(sorted(set(raw)))


#: The keys of an approval step's ``approval`` object (docs/approvals.md lists each).
APPROVAL_KEYS = (
    "approvers",
    "quorum",
    "decisions",
    "veto",
    "distinctFrom",
    "end",
    "expires",
    "onExpire",
    "escalate",
)
#: What an expired approval step does (``approval.onExpire``): never accept.
ON_EXPIRE = ("reject", "fail", "pause")


def _parse_timers(
    value: dict[str, Any], step: str, decisions: tuple[str, ...]
) -> tuple[float | None, str, tuple[tuple[float, tuple[str, ...], tuple[str, ...]], ...]]:
    """``expires``, ``onExpire`` and ``escalate`` of an ``approval`` object."""
    expires_s = None
    if "expires" in value:
        expires_s = duration_s(value["expires"])
        if expires_s is None:
            raise WorkflowParseError(
                step,
                "'approval.expires' must be a positive ISO-8601 duration (P3D, PT24H, PT30S); "
                f"got {_brief(value['expires'])}",
            )
    on_expire = value.get("onExpire", "reject")
    if "onExpire" in value and expires_s is None:
        raise WorkflowParseError(step, "'approval.onExpire' needs 'approval.expires'")
    if on_expire not in ON_EXPIRE:
        raise WorkflowParseError(
            step,
            f"'approval.onExpire' must be reject, fail or pause (an expiry never accepts); "
            f"got {_brief(on_expire)}",
        )
    if expires_s is not None and on_expire == "reject" and "reject" not in decisions:
        raise WorkflowParseError(
            step, "'approval.onExpire' is reject, which is not a declared decision"
        )
    escalate = value.get("escalate", [])
    if not isinstance(escalate, list):
        raise WorkflowParseError(
            step,
            f"'approval.escalate' must be an array of {{after, addRoles, addPrincipals}}; got {_brief(escalate)}",
        )
    out = []
    for i, item in enumerate(escalate):
        where = f"'approval.escalate[{i}]'"
        if not isinstance(item, dict) or any(
            k not in ("after", "addRoles", "addPrincipals") for k in item
        ):
            raise WorkflowParseError(
                step,
                f"{where} must be an object {{after, addRoles, addPrincipals}}; got {_brief(item)}",
            )
        after_s = duration_s(item.get("after"))
        if after_s is None:
            raise WorkflowParseError(
                step,
                f"{where}.after must be a positive ISO-8601 duration; got {_brief(item.get('after'))}",
            )
        if expires_s is not None and after_s >= expires_s:
            raise WorkflowParseError(step, f"{where}.after is not before 'approval.expires'")
        roles = _names(item.get("addRoles"), step, f"escalate[{i}].addRoles")
        principals = _names(item.get("addPrincipals"), step, f"escalate[{i}].addPrincipals")
        if not roles and not principals:
            raise WorkflowParseError(step, f"{where} adds no role and no principal")
        out.append((after_s, roles, principals))
    out.sort(key=lambda e: e[0])
    return expires_s, on_expire, tuple(out)


#: What a decision may end the run with (``approval.end``).
APPROVAL_ENDS = ("fail", "complete")


def _names(value: Any, step: str, field: str) -> tuple[str, ...]:
    """An array of non-blank, distinct strings (``approval.<field>``)."""
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(x, str) and x.strip() for x in value):
        raise WorkflowParseError(
            step, f"'approval.{field}' must be an array of non-blank names; got {_brief(value)}"
        )
    out = tuple(x.strip() for x in value)
    if len(set(out)) != len(out):
        raise WorkflowParseError(step, f"'approval.{field}' names one entry twice")
    return out


def _parse_approval(value: Any, step: str) -> ApprovalSpec:
    """An approval step's ``approval`` object; each malformed key is refused naming it."""
    if not isinstance(value, dict):
        raise WorkflowParseError(
            step, "an approval step needs an 'approval' object naming its 'approvers'"
        )
    unknown = sorted(k for k in value if k not in APPROVAL_KEYS)
    if unknown:
        raise WorkflowParseError(
            step,
            f"'approval' has unknown key(s) {', '.join(unknown)}; known: {', '.join(APPROVAL_KEYS)}",
        )
    approvers = value.get("approvers")
    if not isinstance(approvers, dict) or any(k not in ("roles", "principals") for k in approvers):
        raise WorkflowParseError(
            step,
            "'approval.approvers' must be an object {\"roles\": [group names], "
            f'"principals": [principals]}}; got {_brief(approvers)}',
        )
    roles = _names(approvers.get("roles"), step, "approvers.roles")
    principals = _names(approvers.get("principals"), step, "approvers.principals")
    if not roles and not principals:
        raise WorkflowParseError(step, "'approval.approvers' names no role and no principal")
    quorum = value.get("quorum", 1)
    if isinstance(quorum, bool) or not isinstance(quorum, int) or quorum < 1:
        raise WorkflowParseError(
            step, f"'approval.quorum' must be a whole number >= 1; got {_brief(quorum)}"
        )
    if not roles and quorum > len(principals):
        raise WorkflowParseError(
            step,
            f"'approval.quorum' {quorum} exceeds the {len(principals)} principal(s) who may vote",
        )
    decisions = _names(value.get("decisions"), step, "decisions") or DEFAULT_DECISIONS
    for d in decisions:
        if not d.replace("_", "").replace("-", "").isalnum():
            raise WorkflowParseError(
                step, f"'approval.decisions': '{d}' must be letters, digits, '-' or '_'"
            )
    veto = _names(value.get("veto"), step, "veto")
    for d in veto:
        if d not in decisions:
            raise WorkflowParseError(step, f"'approval.veto' names '{d}', not a declared decision")
    distinct = _names(value.get("distinctFrom"), step, "distinctFrom")
    if step in distinct:
        raise WorkflowParseError(step, "'approval.distinctFrom' names the step itself")
    end = value.get("end", {})
    if not isinstance(end, dict):
        raise WorkflowParseError(
            step,
            f'\'approval.end\' must be an object {{decision: "fail"|"complete"}}; got {_brief(end)}',
        )
    for d, how in end.items():
        if d not in decisions:
            raise WorkflowParseError(step, f"'approval.end' names '{d}', not a declared decision")
        if how not in APPROVAL_ENDS:
            raise WorkflowParseError(
                step, f"'approval.end.{d}' must be 'fail' or 'complete'; got {_brief(how)}"
            )
    expires_s, on_expire, escalate = _parse_timers(value, step, decisions)
    return ApprovalSpec(
        expires_s=expires_s,
        on_expire=on_expire,
        escalate=escalate,
        roles=roles,
        principals=principals,
        quorum=quorum,
        decisions=decisions,
        veto=veto,
        distinct_from=distinct,
        end=tuple(sorted(end.items())),
    )


def _approval_output_type(pool: descriptor_pool.DescriptorPool) -> Any:
    """What an approval step binds: a ``google.protobuf.Struct`` ``{decision, tally, voters}``."""
    try:
        return pool.FindMessageTypeByName("google.protobuf.Struct")
    except KeyError:
        from google.protobuf import struct_pb2

        return struct_pb2.Struct.DESCRIPTOR


def resolve_depends(steps: tuple[Step, ...]) -> tuple[Step, ...]:
    """Fill ``Step.depends`` (graph workflows): ``after``, else the edge's sources other than
    ``input``, else the step before it that is not a compensation step."""
    compensations = {s.compensate for s in steps if s.compensate}
    out: list[Step] = []
    previous: str | None = None
    for step in steps:
        if step.name in compensations:
            depends: tuple[Dependency, ...] = ()
        elif step.after is not None:
            depends = step.after
        elif step.edge is not None:
            depends = tuple(Dependency(x) for x in step.edge.sources if x != "input")
        else:
            depends = (Dependency(previous),) if previous is not None else ()
        if step.name not in compensations:
            previous = step.name
        out.append(dataclasses.replace(step, depends=depends))
    return tuple(out)


def _max_parallel(obj: Mapping[str, Any]) -> int:
    value = obj.get("maxParallel")
    if value is None:
        return DEFAULT_MAX_PARALLEL
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise WorkflowParseError(
            "", f"'maxParallel' must be a whole number from 1 to 64; got {_brief(value)}"
        )
    return value  # the verifier reports a value outside 1..64


def _require(obj: Mapping[str, Any]) -> tuple[str, ...] | None:
    value = obj.get("completion")
    if value is None:
        return None
    shape = "'completion' must be an object {\"require\": [step names]}"
    if not isinstance(value, dict):
        raise WorkflowParseError("", f"{shape}; got {_brief(value)}")
    require = value.get("require")
    if require is None:
        return None
    if not isinstance(require, list) or not all(isinstance(x, str) and x.strip() for x in require):
        raise WorkflowParseError("", "'completion.require' must be an array of step names")
    return tuple(x.strip() for x in require)


def _parse_output(obj: Any, pool: descriptor_pool.DescriptorPool) -> Output | None:
    if not isinstance(obj, dict):
        return None  # a non-object output is ignored, as upstream
    type_name = _text(obj, "type")
    if type_name is None:
        raise WorkflowParseError("", "'output' needs a 'type'")
    return Output(
        type=_find_type(pool, type_name.strip()),
        rules=_parse_text_rules(obj.get("rules")),
        cel_rules=_parse_cel_rules(obj.get("celRules"), "output"),
    )


def _parse(obj: Any, runtime: Runtime) -> CompiledWorkflow:
    if not isinstance(obj, dict):
        raise WorkflowParseError("", "'workflow' must be a JSON object")
    schema = obj.get("schema")
    if not isinstance(schema, dict):
        raise WorkflowParseError(
            "",
            "Schema must be an object with exactly one of 'type', 'sources', "
            "'descriptorSetBase64' (at '/schema')",
        )
    present = [k for k in _SCHEMA_KEYS if k in schema]
    if len(present) != 1:
        raise WorkflowParseError(
            "",
            "Schema must contain exactly one of 'type', 'sources', 'descriptorSetBase64' but had "
            f"{len(present)} (at '/schema')",
        )
    default: str | None
    if present[0] == "type":
        pool, files, default = _from_type(schema["type"], runtime)
    elif present[0] == "sources":
        pool, files = _from_sources(schema)
        default = _default_message(pool, files, _text(schema, "root"))
    else:
        pool, files = _from_descriptor_set(schema["descriptorSetBase64"])
        default = _default_message(pool, files, None)

    input_name = _text(obj, "inputType")
    if input_name is None:
        if default is None:
            raise WorkflowParseError(
                "",
                "A message 'type' is required because the schema does not identify a single "
                "message (at '/workflow/inputType')",
            )
        input_name = default
    input_type = _find_type(pool, input_name.strip())

    raw_steps = obj.get("steps")
    if not isinstance(raw_steps, list) or not raw_steps:
        raise WorkflowParseError("", "'steps' must be a non-empty array")
    workflow = _text(obj, "name") or ""
    steps = tuple(_parse_step(i, s, pool, files, workflow) for i, s in enumerate(raw_steps))
    output = _parse_output(obj.get("output"), pool) if "output" in obj else None
    deadline_ms = _deadline_ms(obj, "")
    graph = (
        "maxParallel" in obj
        or "completion" in obj
        or any(k in s for s in raw_steps if isinstance(s, dict) for k in GRAPH_STEP_KEYS)
    )
    if graph and len(raw_steps) > MAX_GRAPH_STEPS:
        raise WorkflowParseError(
            "", f"a graph workflow has at most {MAX_GRAPH_STEPS} steps; got {len(raw_steps)}"
        )
    if not graph:
        return CompiledWorkflow(
            name=_text(obj, "name") or "",
            input_type=input_type,
            steps=steps,
            output=output,
            deadline_ms=deadline_ms if deadline_ms > 0 else DEFAULT_DEADLINE_MS,
            definition=obj,
            pool=pool,
            files=files,
        )
    resolved = resolve_depends(steps)
    n_deps = sum(len(s.depends) for s in resolved)
    if n_deps > MAX_GRAPH_DEPENDENCIES:
        raise WorkflowParseError(
            "", f"a graph workflow has at most {MAX_GRAPH_DEPENDENCIES} dependencies; got {n_deps}"
        )
    return CompiledWorkflow(
        name=_text(obj, "name") or "",
        input_type=input_type,
        steps=resolved,
        output=output,
        deadline_ms=deadline_ms if deadline_ms > 0 else DEFAULT_DEADLINE_MS,
        definition=obj,
        pool=pool,
        files=files,
        graph=True,
        max_parallel=_max_parallel(obj),
        require=_require(obj),
    )


def parse_workflow(obj: Any, runtime: Runtime) -> CompiledWorkflow:
    """Parse and resolve a workflow envelope.

    Successful parses are cached on ``runtime`` by canonical JSON text (:func:`_cache_key`), so
    a definition shared by many jobs is compiled once.

    :param obj: the envelope (a JSON object as a dict).
    :param runtime: the host's :class:`Runtime` (type pool for the ``type`` schema form).
    :returns: the :class:`CompiledWorkflow` (shared; treat as read-only).
    :raises WorkflowParseError: with the step (``""`` for the workflow) and the reference's text.
    """
    key = _cache_key(obj)
    cache = runtime.cache
    if key is not None:
        hit = cache.get(key)
        if hit is not None:
            return hit
    try:
        workflow = _parse(obj, runtime)
    except WorkflowParseError:
        raise
    except RecursionError as exc:
        raise WorkflowParseError("", "the workflow is nested too deeply") from exc
    if key is not None:
        if len(cache) >= WORKFLOW_CACHE_SIZE:
            # Drop the oldest entry (dicts keep insertion order).
            try:
                cache.pop(next(iter(cache)))
            except (StopIteration, KeyError, RuntimeError):
                pass
        cache[key] = workflow
    return workflow


def _cache_key(obj: Any) -> Any:
    """A key equal for two definitions exactly when their :func:`canonical_text` is equal
    (None when that is None), without serialising a ``descriptorSetBase64`` schema: a
    descriptor set is tens of KB of base64, and JSON-escaping it cost more per job than
    parsing the cached workflow saves. Such a definition keys as (canonical text of the rest,
    the base64 string): JSON text of a string is injective, so nothing new compares equal.
    """
    schema = obj.get("schema") if isinstance(obj, dict) else None
    if isinstance(schema, dict) and len(schema) == 1 and all(type(k) is str for k in obj):
        b64 = schema.get("descriptorSetBase64")
        if type(b64) is str:
            rest = canonical_text({k: v for k, v in obj.items() if k != "schema"})
            return None if rest is None else ("descriptorSetBase64", rest, b64)
    return canonical_text(obj)


# -- inputs of plain scalar fields, without json_format ----------------------------------------
#
# json_format.ParseDict walks every field through a dozen Python calls (~50 us for a 1 KB
# message of six fields, at submit and again when the job runs). An object whose every key
# names a string, bool or integer field (or a repeated one) with a value of exactly that JSON
# type is set field by field here, with what ParseDict would set; anything else (an unknown
# key, null, a number as a string, a non-ASCII string, an enum, a message, a oneof member, a
# value out of range) goes to ParseDict, on a fresh message, for its verdict and its words.

_K_STR, _K_BOOL, _K_INT = range(3)
_PLAIN_INPUT_KINDS = {
    _d.FieldDescriptor.TYPE_STRING: _K_STR,
    _d.FieldDescriptor.TYPE_BOOL: _K_BOOL,
    **dict.fromkeys(
        (
            _d.FieldDescriptor.TYPE_INT32,
            _d.FieldDescriptor.TYPE_SINT32,
            _d.FieldDescriptor.TYPE_SFIXED32,
            _d.FieldDescriptor.TYPE_INT64,
            _d.FieldDescriptor.TYPE_SINT64,
            _d.FieldDescriptor.TYPE_SFIXED64,
            _d.FieldDescriptor.TYPE_UINT32,
            _d.FieldDescriptor.TYPE_FIXED32,
            _d.FieldDescriptor.TYPE_UINT64,
            _d.FieldDescriptor.TYPE_FIXED64,
        ),
        _K_INT,
    ),
}
_input_plans: dict[int, tuple[_d.Descriptor, dict[str, tuple[str, int, bool]] | None]] = {}


def _input_plan(desc: _d.Descriptor) -> dict[str, tuple[str, int, bool]] | None:
    """JSON key -> (field name, kind, repeated) for the plain fields of ``desc``, keyed as
    ParseDict looks keys up (JSON name first, then the proto name); None for a well-known type
    (its JSON form is special)."""
    entry = _input_plans.get(id(desc))
    if entry is not None and entry[0] is desc:  # the entry holds desc: its id stays its own
        return entry[1]
    plan: dict[str, tuple[str, int, bool]] | None = None
    if not desc.full_name.startswith("google.protobuf."):
        plan = {}
        by_json = {fd.json_name: fd for fd in desc.fields}  # as ParseDict builds it
        for key in (*by_json, *desc.fields_by_name):
            fd = by_json.get(key) or desc.fields_by_name[key]
            kind = _PLAIN_INPUT_KINDS.get(fd.type)
            if kind is not None and fd.containing_oneof is None:
                plan[key] = (fd.name, kind, fd.is_repeated)
    if len(_input_plans) >= 1024:
        _input_plans.clear()
    _input_plans[id(desc)] = (desc, plan)
    return plan


def _plain_value(kind: int, value: Any) -> bool:
    kind_of = type(value)
    if kind == _K_STR:
        return kind_of is str and value.isascii()
    if kind == _K_BOOL:
        return kind_of is bool
    return kind_of is int


def _parse_plain(input_json: dict[str, Any], msg: Message) -> bool:
    """Set ``msg`` from ``input_json`` when every key is a plain field (see above).

    :returns: False when ParseDict must parse it instead (``msg`` may be partly set then).
    """
    plan = _input_plan(msg.DESCRIPTOR)
    if plan is None:
        return False
    try:
        for key, value in input_json.items():
            field = plan.get(key)
            if field is None:
                return False
            name, kind, repeated = field
            if repeated:
                if type(value) is not list or not all(_plain_value(kind, v) for v in value):
                    return False
                container = getattr(msg, name)
                del container[:]
                container.extend(value)
            elif _plain_value(kind, value):
                setattr(msg, name, value)
            else:
                return False
    except (ValueError, TypeError):  # an integer out of the field's range: ParseDict says so
        return False
    return True


def parse_input(
    workflow: CompiledWorkflow, input_json: Any, *, ignore_unknown_fields: bool = True
) -> Message:
    """Parse a run's input as proto3 JSON of the workflow's input type.

    :param ignore_unknown_fields: False at submit (a misspelt field is refused, naming it);
        True (the default) when a stored input is run, so rows accepted before the check
        still run.
    :raises WorkflowParseError: ``("", "'input' is not valid proto3 JSON for <type>: <detail>")``.
    """
    full = workflow.input_type.full_name
    if not isinstance(input_json, dict):
        raise WorkflowParseError(
            "", f"'input' is not valid proto3 JSON for {full}: expected a JSON object"
        )
    msg = message_class(workflow.input_type)()
    if _parse_plain(input_json, msg):
        return msg
    msg = message_class(workflow.input_type)()
    try:
        json_format.ParseDict(
            input_json,
            msg,
            ignore_unknown_fields=ignore_unknown_fields,
            descriptor_pool=workflow.pool,
        )
    except (
        json_format.ParseError,
        ValueError,
        TypeError,
        AttributeError,
        RecursionError,
        OverflowError,  # an integer too large for a double field (float(10**400))
        # upb raises SystemError for an enum value given as a lone surrogate ("\ud800"),
        # which JSON can carry: still the input's fault, never an internal error.
        SystemError,
    ) as exc:
        raise WorkflowParseError("", f"'input' is not valid proto3 JSON for {full}: {exc}") from exc
    return msg
