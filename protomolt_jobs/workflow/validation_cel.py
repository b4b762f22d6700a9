"""The CEL environment of declared validation rules, as upstream's validator declares it.

A validation rule's expression sees ``this`` (the value or the message) and ``now`` (the time
of the validation, one value for the whole call, so ``now == now``), and may call:

- upstream's format functions, receiver style: ``isEmail()``, ``isHostname()``, ``isIp()``,
  ``isIp(4|6)``, ``isIpPrefix()``, ``isIpPrefix(ver)``, ``isIpPrefix(ver, strict)``,
  ``isUri()``, ``isUriRef()``, ``isHostAndPort(port_required)``, ``isNan()``, ``isInf()``,
  ``isInf(sign)`` (the protovalidate function library, which upstream registers);
- ``format``: ``"%s is %d".format([a, b])`` (``%s %d %f %.Nf %e %x %X %o %b %%``);
- the CEL strings extension (``lowerAscii``, ``charAt``, ``indexOf``, ...; see
  :data:`protomolt_jobs.workflow.cel.STRINGS_EXTENSION`).

Programs compile through :mod:`protomolt_jobs.workflow.celenv` (one per expression text, with
these functions bound); the functions are module-level because compiled CEL calls them by
module path.
"""

from __future__ import annotations

import ipaddress
import math
import re
import threading
import urllib.parse
from typing import Any

from celpy import celtypes
from celpy.evaluation import CELEvalError

from protomolt_jobs.workflow import celenv
from protomolt_jobs.workflow.cel import STRINGS_EXTENSION

__all__ = ["FUNCTIONS", "program"]

_LABEL = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?$")
_EMAIL_LOCAL = re.compile(r"^[A-Za-z0-9.!#$%&'*+/=?^_`{|}~-]+$")
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.\-]*$")
_URI_CHARS = re.compile(r"^[A-Za-z0-9\-._~:/?#\[\]@!$&'()*+,;=%]*$")
_PCT = re.compile(r"%(?![0-9A-Fa-f]{2})")


def hostname_ok(s: str) -> bool:
    """RFC 1123 host name: dot-separated labels of letters, digits and inner hyphens, at most
    253 characters, the last label not all digits; a trailing dot is allowed."""
    s = s.removesuffix(".")
    if not s or len(s) > 253:
        return False
    labels = s.split(".")
    return all(_LABEL.match(lb) for lb in labels) and not labels[-1].isdigit()


def email_ok(s: str) -> bool:
    """``local@host``: an RFC 5322 dot-atom-ish local part and a host name."""
    local, at, domain = s.rpartition("@")
    return bool(at) and bool(_EMAIL_LOCAL.match(local)) and len(local) <= 64 and hostname_ok(domain)


def ip_ok(s: str, version: int = 0) -> bool:
    """An IPv4 or IPv6 address (``version`` 4 or 6 narrows it; 0 means either)."""
    if "/" in s:
        return False
    try:
        addr = ipaddress.ip_address(s)
    except ValueError:
        return False
    return version in (0, addr.version)


def ip_prefix_ok(s: str, version: int = 0, strict: bool = False) -> bool:
    """``address/length``; ``strict``: the host bits are zero (a network address)."""
    if "/" not in s:
        return False
    address, _, length = s.partition("/")
    if not length.isdigit() or not ip_ok(address, version):
        return False
    try:
        ipaddress.ip_network(s, strict=strict)
    except ValueError:
        return False
    return True


def uri_ok(s: str, *, absolute: bool) -> bool:
    """RFC 3986 URI (``absolute``: with a scheme) or URI reference."""
    if not s and absolute:
        return False
    if not _URI_CHARS.match(s) or _PCT.search(s):
        return False
    parts = urllib.parse.urlsplit(s)
    if absolute and not (parts.scheme and _SCHEME.match(parts.scheme)):
        return False
    if ":" in s.split("/", 1)[0] and not parts.scheme:
        return False
    try:
        parts.port  # noqa: B018 - raises ValueError on a malformed port
    except ValueError:
        return False
    return True


def host_and_port_ok(s: str, port_required: bool) -> bool:
    """``host[:port]`` with a host name, IPv4 address or ``[IPv6]``; port 0..65535."""
    if s.startswith("["):
        end = s.find("]")
        if end < 0 or not ip_ok(s[1:end], 6):
            return False
        rest = s[end + 1 :]
        if not rest:
            return not port_required
        return rest.startswith(":") and _port_ok(rest[1:])
    host, colon, port = s.rpartition(":")
    if not colon:
        return not port_required and (hostname_ok(s) or ip_ok(s, 4))
    return (hostname_ok(host) or ip_ok(host, 4)) and _port_ok(port)


def _port_ok(port: str) -> bool:
    return port.isdigit() and (port == "0" or not port.startswith("0")) and int(port) <= 65535


# -- the CEL functions (module level: compiled CEL calls them by module path) -----------------


def _str(value: Any, name: str) -> str:
    if not isinstance(value, str):
        raise CELEvalError(f"no such overload: {name} on {type(value).__name__}")
    return str(value)


def _int(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise CELEvalError(f"no such overload: {name} with {type(value).__name__}")
    return int(value)


def cel_is_email(value: Any) -> celtypes.BoolType:
    return celtypes.BoolType(email_ok(_str(value, "isEmail")))


def cel_is_hostname(value: Any) -> celtypes.BoolType:
    return celtypes.BoolType(hostname_ok(_str(value, "isHostname")))


def cel_is_ip(value: Any, version: Any = 0) -> celtypes.BoolType:
    return celtypes.BoolType(ip_ok(_str(value, "isIp"), _int(version, "isIp")))


def cel_is_ip_prefix(value: Any, version: Any = 0, strict: Any = False) -> celtypes.BoolType:
    if isinstance(version, bool):  # isIpPrefix(strict)
        version, strict = 0, version
    return celtypes.BoolType(
        ip_prefix_ok(_str(value, "isIpPrefix"), _int(version, "isIpPrefix"), bool(strict))
    )


def cel_is_uri(value: Any) -> celtypes.BoolType:
    return celtypes.BoolType(uri_ok(_str(value, "isUri"), absolute=True))


def cel_is_uri_ref(value: Any) -> celtypes.BoolType:
    return celtypes.BoolType(uri_ok(_str(value, "isUriRef"), absolute=False))


def cel_is_host_and_port(value: Any, port_required: Any = False) -> celtypes.BoolType:
    return celtypes.BoolType(host_and_port_ok(_str(value, "isHostAndPort"), bool(port_required)))


def cel_is_nan(value: Any) -> celtypes.BoolType:
    if not isinstance(value, float):
        raise CELEvalError(f"no such overload: isNan on {type(value).__name__}")
    return celtypes.BoolType(math.isnan(value))


def cel_is_inf(value: Any, sign: Any = 0) -> celtypes.BoolType:
    if not isinstance(value, float):
        raise CELEvalError(f"no such overload: isInf on {type(value).__name__}")
    s = _int(sign, "isInf")
    return celtypes.BoolType(
        math.isinf(value) and (s == 0 or (s > 0 and value > 0) or (s < 0 and value < 0))
    )


_SPEC = re.compile(r"%(?:%|(\.\d+)?([sdfeExXob]))")


def _format_one(spec: str, precision: str | None, arg: Any) -> str:
    if spec == "s":
        if arg is None:
            return "null"
        if isinstance(arg, celtypes.BoolType | bool):
            return "true" if arg else "false"
        if isinstance(arg, float):
            x = float(arg)  # a plain float: celtypes refuse mixed comparisons
            if math.isfinite(x) and x.is_integer():
                # Whole doubles print without a fraction, as upstream's %s does.
                return str(int(x)) if abs(x) < 2.0**63 else f"{x:.0e}".replace("e+0", "e+")
            return repr(x)
        if isinstance(arg, bytes):
            return arg.decode("utf-8", "replace")
        if isinstance(arg, list | tuple):
            return "[" + ", ".join(_format_one("s", None, a) for a in arg) + "]"
        return str(arg)
    if arg is None:
        raise CELEvalError(f"format: no argument for %{spec}")
    if spec == "d":
        return str(int(arg))
    if spec in "fFeE":
        digits = int(precision[1:]) if precision else 6
        return format(float(arg), f".{digits}{spec}")
    if spec in "xX":
        if isinstance(arg, str):
            text = arg.encode("utf-8").hex()
            return text.upper() if spec == "X" else text
        return format(int(arg), spec)
    if spec == "o":
        return format(int(arg), "o")
    if spec == "b":
        return format(int(arg), "b")
    raise CELEvalError(f"format: unsupported specifier %{spec}")


def cel_format(template: Any, args: Any) -> celtypes.StringType:
    text = _str(template, "format")
    values = list(args) if isinstance(args, list | tuple) else [args]
    position = 0

    def substitute(m: re.Match[str]) -> str:
        nonlocal position
        if m.group(0) == "%%":
            return "%"
        value = values[position] if position < len(values) else None
        position += 1
        return _format_one(m.group(2), m.group(1), value)

    return celtypes.StringType(_SPEC.sub(substitute, text))


#: Every function a validation rule may call, by CEL name.
FUNCTIONS: dict[str, Any] = {
    **STRINGS_EXTENSION,
    "isEmail": cel_is_email,
    "isHostname": cel_is_hostname,
    "isIp": cel_is_ip,
    "isIpPrefix": cel_is_ip_prefix,
    "isUri": cel_is_uri,
    "isUriRef": cel_is_uri_ref,
    "isHostAndPort": cel_is_host_and_port,
    "isNan": cel_is_nan,
    "isInf": cel_is_inf,
    "format": cel_format,
}

_programs: dict[str, celenv.Program] = {}
_lock = threading.Lock()


def program(text: str) -> celenv.Program:
    """The compiled program of a validation rule's expression, with :data:`FUNCTIONS` bound.

    :raises celenv.CelCompileError: when the text does not parse.
    """
    found = _programs.get(text)
    if found is not None:
        return found
    base = celenv.program(text)
    prog = celenv.Program(base.ast, functions=FUNCTIONS, text=text)
    with _lock:
        if len(_programs) > celenv.PROGRAM_CACHE_SIZE:
            _programs.clear()
        _programs[text] = prog
    return prog
