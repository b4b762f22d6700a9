"""Node configuration: ``protomolt.toml`` plus ``PROTOMOLT_*`` environment overrides.

The file has a ``[node]`` table and one table per role (``[jobs]``, ``[registry]`` ...). Any
key can be overridden by ``PROTOMOLT_<SECTION>_<KEY>`` (``PROTOMOLT_JOBS_DSN``,
``PROTOMOLT_NODE_HTTP_PORT``); the role list also by ``PROTOMOLT_ROLES`` (a comma list).
Aliases: ``PROTOMOLT_API_TOKEN`` for ``node.api_token``, and those a role module declares in
its ``env_aliases`` (variable -> key of its own table; the canonical name wins when both are
set).

Configuration is demanded only for the roles the node mounts: a role's table is checked (by
its module's ``check_settings``) only when the role is in ``roles``. The host knows no role's
keys. Every error is a :class:`~protomolt_jobs.config.ConfigError` naming the key, where it
came from and the expected form. ``docs/configuration.md`` lists every key.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re
import tomllib
from collections.abc import Mapping
from importlib import metadata
from pathlib import Path
from typing import Any

from protomolt_jobs.config import ConfigError
from protomolt_jobs.hooks.contract import SCOPES

__all__ = [
    "DEFAULT_DATA_DIR",
    "DEFAULT_ROLES",
    "ENV_PREFIX",
    "HTTP_HEADER_TIMEOUT_S",
    "ConfigError",
    "NodeConfig",
]

#: Prefix of every override variable.
log = logging.getLogger("protomolt_jobs.nodeconfig")

ENV_PREFIX = "PROTOMOLT_"
#: Roles a node mounts when neither the file nor ``PROTOMOLT_ROLES`` names any.
DEFAULT_ROLES: tuple[str, ...] = ("registry", "parse", "jobs")
#: Data directory when none is configured (relative to the working directory).
DEFAULT_DATA_DIR = ".protomolt-data"
#: Seconds a connection to the actions route has to deliver a request's headers (the first
#: request's from the connection, a later one's from its first byte) before it is closed.
HTTP_HEADER_TIMEOUT_S = 10.0

#: ``[node]`` keys and their defaults.
_NODE_DEFAULTS: dict[str, Any] = {
    "roles": None,
    "data_dir": DEFAULT_DATA_DIR,
    "http_host": "127.0.0.1",
    "http_port": 8081,
    "grpc_host": "127.0.0.1",
    "grpc_port": 9090,
    "api_token": None,
    "metrics_public": False,
    "otlp_endpoint": None,
    "tokens": None,
    "groups": None,
    "scopes": None,
    "http_header_timeout_s": HTTP_HEADER_TIMEOUT_S,
}

#: Environment aliases: variable -> (section, key). The canonical variable wins.
_ALIASES: dict[str, tuple[str, str]] = {
    "PROTOMOLT_API_TOKEN": ("node", "api_token"),
    "PROTOMOLT_ROLES": ("node", "roles"),
}


def env_name(section: str, key: str) -> str:
    """The override variable of ``[section] key`` (``PROTOMOLT_JOBS_DSN``)."""
    return _env_name(section, key)


def _env_name(section: str, key: str) -> str:
    return f"{ENV_PREFIX}{section.upper().replace('-', '_')}_{key.upper()}"


@dataclasses.dataclass(frozen=True)
class NodeConfig:
    """One node's configuration.

    :ivar roles: roles to mount, lowercase, in the configured order, no duplicates.
    :ivar data_dir: absolute data directory (not created here).
    :ivar http_host: actions route bind address (default loopback).
    :ivar http_port: actions route port, 0 picks a free port (default 8081).
    :ivar grpc_host: ``ProtoMoltService`` bind address (default loopback).
    :ivar grpc_port: ``ProtoMoltService`` port, 0 picks a free port (default 9090).
    :ivar api_token: operator token the surfaces require, or None for an open node.
    :ivar metrics_public: serve ``/metrics`` without the token (default False).
    :ivar otlp_endpoint: OTLP/gRPC collector (``http://host:4317``) traces are exported to, or
        None: tracing off.
    :ivar tokens: named tokens (``[node.tokens] alice = "..."``): each is accepted by the
        surfaces and its name is the principal of the verbs it calls (the history's actor).
    :ivar groups: ``[node.groups]``: group name -> its principals (``editor = ["alice"]``).
    :ivar scopes: ``[node.scopes]``: group or principal -> the scopes granted to it, or None
        when the table is absent (every token then holds every scope, as before scopes).
    :ivar http_header_timeout_s: seconds a connection to the actions route has to deliver a
        request's headers before it is closed (default 10).
    :ivar source: the file the configuration was read from, or None.
    """

    roles: list[str]
    data_dir: Path
    http_host: str = "127.0.0.1"
    http_port: int = 8081
    grpc_host: str = "127.0.0.1"
    grpc_port: int = 9090
    api_token: str | None = None
    metrics_public: bool = False
    otlp_endpoint: str | None = None
    #: Named API tokens (``[node.tokens]``): principal name -> token.
    tokens: Mapping[str, str] = dataclasses.field(default_factory=dict)
    #: Groups (``[node.groups]``): group name -> its principals.
    groups: Mapping[str, frozenset[str]] = dataclasses.field(default_factory=dict)
    #: Grants (``[node.scopes]``): group or principal -> scopes; None: the table is absent.
    scopes: Mapping[str, frozenset[str]] | None = None
    http_header_timeout_s: float = HTTP_HEADER_TIMEOUT_S
    source: Path | None = None
    #: role sections with overrides applied: section -> key -> (value, origin).
    _sections: Mapping[str, Mapping[str, tuple[Any, str]]] = dataclasses.field(
        default_factory=dict, repr=False
    )

    # ------------------------------------------------------------------ loading

    @classmethod
    def load(
        cls, path: Path | str | None = None, environ: Mapping[str, str] | None = None
    ) -> NodeConfig:
        """Read ``path`` (TOML; None: no file) and apply ``environ`` overrides.

        :param path: a ``protomolt.toml``; a missing file is an error.
        :param environ: the environment (None: ``os.environ``).
        :raises ConfigError: unreadable file, wrong types, unknown ``[node]`` keys, duplicate
            roles, a bad ``[node.groups]`` or ``[node.scopes]`` entry (an unknown scope, a
            name that is both a group and a principal, a grant to nobody), a bad ``[jobs]``
            section on a node that mounts jobs.
        """
        environ = os.environ if environ is None else environ
        source = Path(path).expanduser().resolve() if path is not None else None
        document: dict[str, Any] = {}
        if source is not None:
            try:
                with source.open("rb") as fh:
                    document = tomllib.load(fh)
            except FileNotFoundError:
                raise ConfigError(f"config file {source} does not exist") from None
            except tomllib.TOMLDecodeError as exc:
                raise ConfigError(f"config file {source} is not valid TOML: {exc}") from None
            except OSError as exc:
                raise ConfigError(f"config file {source} cannot be read: {exc}") from None

        sections: dict[str, dict[str, tuple[Any, str]]] = {}
        for name, table in document.items():
            if not isinstance(table, dict):
                raise ConfigError(
                    f"top-level key {name!r} in {source}: expected a table like [node] or "
                    f"[jobs]; got {type(table).__name__}"
                )
            if name.lower() in sections:
                first = next(n for n in document if n.lower() == name.lower())
                raise ConfigError(
                    f"config file {source} has both [{first}] and [{name}]: section names "
                    "are case-insensitive, so one would silently replace the other; merge them"
                )
            sections[name.lower()] = {
                str(k): (v, f"{source} [{name}] {k}") for k, v in table.items()
            }
        _apply_environment(sections, environ)

        node = sections.get("node", {})
        for key in node:
            if key not in _NODE_DEFAULTS:
                raise ConfigError(
                    f"unknown key node.{key} ({node[key][1]}); known keys: "
                    + ", ".join(sorted(_NODE_DEFAULTS))
                )

        roles = _parse_roles(node.get("roles"))
        _apply_role_environment(sections, environ, roles)
        base = source.parent if source is not None else Path.cwd()
        data_dir = _parse_path("data_dir", node.get("data_dir"), base)
        tokens = _parse_tokens(node.get("tokens"))
        groups = _parse_groups(node.get("groups"), tokens)
        config = cls(
            roles=roles,
            data_dir=data_dir,
            http_host=_parse_host("http_host", node.get("http_host")),
            http_port=_parse_port("http_port", node.get("http_port")),
            grpc_host=_parse_host("grpc_host", node.get("grpc_host")),
            grpc_port=_parse_port("grpc_port", node.get("grpc_port")),
            api_token=_parse_token(node.get("api_token")),
            metrics_public=_parse_bool("metrics_public", node.get("metrics_public")),
            otlp_endpoint=_parse_endpoint("otlp_endpoint", node.get("otlp_endpoint")),
            tokens=tokens,
            groups=groups,
            scopes=_parse_scopes(node.get("scopes"), tokens, groups),
            http_header_timeout_s=_parse_seconds(
                "http_header_timeout_s", node.get("http_header_timeout_s")
            ),
            source=source,
            _sections={k: v for k, v in sections.items() if k != "node"},
        )
        config._check_roles()  # demanded only for mounted roles; raises ConfigError
        return config

    def _check_roles(self) -> None:
        """Let each mounted role check its own table now (``check_settings(settings)`` on its
        role module, when it has one), so a bad section fails before anything starts. The
        host knows no role's keys; the role names the key in its ``ConfigError``."""
        checks = _role_checks()
        for role in self.roles:
            check = checks.get(role)
            if check is None:
                continue
            try:
                check(self.section(role))
            except ConfigError as exc:
                origins = [
                    origin
                    for key, (_v, origin) in self._sections.get(role, {}).items()
                    if f"{role}.{key}" in str(exc)
                ]
                suffix = f" (from {', '.join(origins)})" if origins else ""
                raise ConfigError(f"{exc}{suffix}") from None

    # ------------------------------------------------------------------ reading

    def section(self, role: str) -> dict[str, Any]:
        """The ``[<role>]`` table with ``PROTOMOLT_<ROLE>_<KEY>`` overrides applied
        (override values are strings). Empty when neither sets anything."""
        return {k: v for k, (v, _origin) in self._sections.get(role.lower(), {}).items()}

    def origin(self, role: str, key: str) -> str | None:
        """Where ``[<role>] key`` came from (a file position or a variable name), or None."""
        entry = self._sections.get(role.lower(), {}).get(key)
        return entry[1] if entry else None


def _role_checks() -> dict[str, Any]:
    """``role -> check_settings`` of every installed role module that has one."""
    checks: dict[str, Any] = {}
    for role, module in role_modules().items():
        check = getattr(module, "check_settings", None)
        if callable(check):
            checks[role] = check
    return checks


def _role_aliases() -> dict[str, tuple[str, str]]:
    """``variable -> (role, key)`` from every installed role module's ``env_aliases``."""
    aliases: dict[str, tuple[str, str]] = {}
    for role, module in role_modules().items():
        for var, key in dict(getattr(module, "env_aliases", None) or {}).items():
            aliases[str(var)] = (role, str(key))
    return aliases


def role_modules() -> dict[str, Any]:
    """``role -> role module`` of every installed role (entry points ``protomolt.roles``).
    A plugin that fails to load is skipped here: the composer reports it when the node mounts
    that role. The host asks these modules, generically, for what only a role knows (its
    checks, aliases, database key, start-up notes, extra processes)."""
    modules: dict[str, Any] = {}
    for ep in metadata.entry_points(group="protomolt.roles"):
        try:
            factory = getattr(ep.load(), "protomolt_role_module", None)
            module = factory() if callable(factory) else None
        except Exception as exc:  # noqa: BLE001 - a broken plugin: the composer names it when mounted
            log.debug("role plugin %s not checked early: %s", ep.name, exc)
            continue
        role = getattr(module, "role", None)
        if isinstance(role, str):
            modules.setdefault(role, module)
    return modules


def _apply_environment(
    sections: dict[str, dict[str, tuple[Any, str]]], environ: Mapping[str, str]
) -> None:
    """Apply aliases and ``PROTOMOLT_NODE_*`` variables (the roles' own variables follow in
    :func:`_apply_role_environment`, once the node's roles are known)."""
    # Aliases first, so the canonical variable (applied after) wins when both are set.
    for var, (section, key) in _ALIASES.items():
        if var in environ:
            sections.setdefault(section, {})[key] = (environ[var], var)
    for var, value in environ.items():
        if var in _ALIASES:
            continue
        prefix = f"{ENV_PREFIX}NODE_"
        if var.startswith(prefix) and len(var) > len(prefix):
            sections.setdefault("node", {})[var[len(prefix) :].lower()] = (value, var)


def _apply_role_environment(
    sections: dict[str, dict[str, tuple[Any, str]]],
    environ: Mapping[str, str],
    roles: list[str],
) -> None:
    """Apply ``PROTOMOLT_<ROLE>_<KEY>`` for every role, the same way for each (the host knows
    no role's keys): those the node mounts and those with a table in the file. The longest matching role name wins (``parse-text`` over
    ``parse``); variables naming no such role are left alone (test fixtures and other tools
    share the prefix)."""
    names = sorted(
        ({*sections, *roles} - {"node"}),
        key=len,
        reverse=True,
    )
    # A role's aliases first, so its canonical variables (applied after) win when both are set.
    aliases = _role_aliases()
    for var, (role, key) in aliases.items():
        if var in environ and role in names:
            sections.setdefault(role, {})[key] = (environ[var], var)
    for var, value in environ.items():
        if not var.startswith(ENV_PREFIX) or var in _ALIASES or var in aliases:
            continue
        rest = var[len(ENV_PREFIX) :]
        for name in names:
            prefix = name.upper().replace("-", "_") + "_"
            if rest.startswith(prefix) and len(rest) > len(prefix):
                sections.setdefault(name, {})[rest[len(prefix) :].lower()] = (value, var)
                break


def _parse_roles(entry: tuple[Any, str] | None) -> list[str]:
    if entry is None:
        return list(DEFAULT_ROLES)
    raw, origin = entry
    if isinstance(raw, str):
        items: list[Any] = raw.split(",")
    elif isinstance(raw, list):
        items = raw
    else:
        raise ConfigError(
            f'node.roles ({origin}) must be a list of role names like ["registry", "jobs"] '
            f"or a comma list; got {raw!r}"
        )
    roles: list[str] = []
    for item in items:
        if not isinstance(item, str):
            raise ConfigError(f"node.roles ({origin}) must hold role names; got {item!r}")
        role = item.strip().lower()
        if not role:
            continue
        if role in roles:
            raise ConfigError(f"node.roles ({origin}) names the {role} role twice")
        roles.append(role)
    if not roles:
        raise ConfigError(
            f"node.roles ({origin}) is empty: name at least one role, e.g. registry,jobs"
        )
    return roles


def _parse_path(key: str, entry: tuple[Any, str] | None, base: Path) -> Path:
    raw, origin = entry if entry is not None else (DEFAULT_DATA_DIR, "default")
    if not isinstance(raw, str) or not raw.strip():
        raise ConfigError(f"node.{key} ({origin}) must be a directory path; got {raw!r}")
    path = Path(raw.strip()).expanduser()
    if not path.is_absolute():
        # File values are relative to the file; variables and the default to the cwd.
        path = (base if origin.endswith(f" {key}") else Path.cwd()) / path
    return path.resolve()


def _parse_host(key: str, entry: tuple[Any, str] | None) -> str:
    if entry is None:
        return str(_NODE_DEFAULTS[key])
    raw, origin = entry
    if not isinstance(raw, str) or not raw.strip():
        raise ConfigError(
            f"node.{key} ({origin}) must be a host name or address like 127.0.0.1; got {raw!r}"
        )
    return raw.strip()


def _parse_port(key: str, entry: tuple[Any, str] | None) -> int:
    if entry is None:
        return int(_NODE_DEFAULTS[key])
    raw, origin = entry
    value: int | None = None
    if isinstance(raw, int) and not isinstance(raw, bool):
        value = raw
    elif isinstance(raw, str) and raw.strip().isascii() and raw.strip().isdecimal():
        # isascii: str.isdigit() also holds for "²", which int() refuses; the length bound
        # keeps int() clear of its digit limit.
        text = raw.strip()
        value = int(text) if len(text) <= 10 else None
    if value is None or not 0 <= value <= 65535:
        raise ConfigError(
            f"node.{key} ({origin}) must be a port number 0-65535 (0 picks a free port); "
            f"got {_shown(raw)}"
        )
    return value


def _shown(value: Any) -> str:
    """``repr`` of a configured value, cut short."""
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:37]}..."


def _parse_token(entry: tuple[Any, str] | None) -> str | None:
    if entry is None:
        return None
    raw, origin = entry
    if raw is None:
        return None
    if not isinstance(raw, str):
        raise ConfigError(f"node.api_token ({origin}) must be a string; got {type(raw).__name__}")
    return raw.strip() or None


def _parse_bool(key: str, entry: tuple[Any, str] | None) -> bool:
    if entry is None:
        return bool(_NODE_DEFAULTS[key])
    raw, origin = entry
    if isinstance(raw, bool):
        return raw
    if isinstance(raw, str) and raw.strip().lower() in ("true", "false", "1", "0"):
        return raw.strip().lower() in ("true", "1")
    raise ConfigError(f"node.{key} ({origin}) must be true or false; got {_shown(raw)}")


def _parse_endpoint(key: str, entry: tuple[Any, str] | None) -> str | None:
    if entry is None or entry[0] is None:
        return None
    raw, origin = entry
    if not isinstance(raw, str):
        raise ConfigError(f"node.{key} ({origin}) must be a URL string; got {_shown(raw)}")
    text = raw.strip()
    if not text:
        return None
    if not text.startswith(("http://", "https://")):
        raise ConfigError(
            f"node.{key} ({origin}) must be an http:// or https:// URL of an OTLP/gRPC "
            f"collector, like http://127.0.0.1:4317; got {_shown(raw)}"
        )
    return text


#: Principal names a named token may carry (never one of the built-in actors).
_PRINCIPAL_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{0,63}$")
_RESERVED_PRINCIPALS = frozenset({"api", "anonymous", "operator", "sweeper"})


def _parse_tokens(entry: tuple[Any, str] | None) -> dict[str, str]:
    if entry is None:
        return {}
    raw, origin = entry
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ConfigError(
            f'node.tokens ({origin}) must be a table like [node.tokens] alice = "..."; '
            f"got {type(raw).__name__}"
        )
    tokens: dict[str, str] = {}
    seen: dict[str, str] = {}
    for name, value in raw.items():
        if not _PRINCIPAL_NAME.match(str(name)) or name in _RESERVED_PRINCIPALS:
            raise ConfigError(
                f"node.tokens.{name} ({origin}): a principal name is lower-case letters, digits, "
                "'.', '_' or '-' (at most 64), and not api, anonymous, operator or sweeper"
            )
        if not isinstance(value, str) or not value.strip():
            raise ConfigError(f"node.tokens.{name} ({origin}) must be a non-empty string")
        if value.strip() in seen:
            raise ConfigError(
                f"node.tokens.{name} ({origin}) is the same token as node.tokens."
                f"{seen[value.strip()]}: each principal needs its own"
            )
        seen[value.strip()] = name
        tokens[name] = value.strip()
    return tokens


def _parse_seconds(key: str, entry: tuple[Any, str] | None) -> float:
    if entry is None:
        return float(_NODE_DEFAULTS[key])
    raw, origin = entry
    value: float | None = None
    if isinstance(raw, (int, float)) and not isinstance(raw, bool):
        value = float(raw)
    elif isinstance(raw, str):
        try:
            value = float(raw.strip())
        except ValueError:
            value = None
    if value is None or not 0 < value <= 3600:  # also refuses NaN
        raise ConfigError(
            f"node.{key} ({origin}) must be a number of seconds above 0 and at most 3600; "
            f"got {_shown(raw)}"
        )
    return value


def _name_list(key: str, raw: Any, origin: str, what: str) -> list[str]:
    """A TOML list of non-blank strings (``[node.groups]`` members, ``[node.scopes]`` grants)."""
    if not isinstance(raw, list) or not all(isinstance(item, str) for item in raw):
        raise ConfigError(
            f'node.{key} ({origin}) must be a list of {what} like ["a", "b"]; got {_shown(raw)}'
        )
    return [item.strip() for item in raw]


def _parse_groups(
    entry: tuple[Any, str] | None, tokens: Mapping[str, str]
) -> dict[str, frozenset[str]]:
    """``[node.groups]``: group -> principals. A group name is principal-shaped, not a
    principal of ``[node.tokens]`` and not reserved; members are principal names (a member
    that holds no ``[node.tokens]`` token may come from an identity hook)."""
    if entry is None or entry[0] is None:
        return {}
    raw, origin = entry
    if not isinstance(raw, dict):
        raise ConfigError(
            f'node.groups ({origin}) must be a table like [node.groups] editor = ["alice"]; '
            f"got {type(raw).__name__}"
        )
    groups: dict[str, frozenset[str]] = {}
    for name, members in raw.items():
        if not _PRINCIPAL_NAME.match(str(name)) or name in _RESERVED_PRINCIPALS:
            raise ConfigError(
                f"node.groups.{name} ({origin}): a group name is lower-case letters, digits, "
                "'.', '_' or '-' (at most 64), and not api, anonymous, operator or sweeper"
            )
        if name in tokens:
            raise ConfigError(
                f"node.groups.{name} ({origin}): {name} is both a group and a principal of "
                "[node.tokens]; a grant in [node.scopes] would not say which it means: rename one"
            )
        names = _name_list(f"groups.{name}", members, origin, "principal names")
        for member in names:
            if not _PRINCIPAL_NAME.match(member) or member in _RESERVED_PRINCIPALS - {"anonymous"}:
                raise ConfigError(
                    f"node.groups.{name} ({origin}) names {member!r}: a member is a principal "
                    "name (lower-case letters, digits, '.', '_' or '-'; not api, operator or "
                    "sweeper)"
                )
        groups[name] = frozenset(names)
    return groups


def _parse_scopes(
    entry: tuple[Any, str] | None,
    tokens: Mapping[str, str],
    groups: Mapping[str, frozenset[str]],
) -> dict[str, frozenset[str]] | None:
    """``[node.scopes]``: group or principal -> scope names; None when the table is absent.
    A key is a group of ``[node.groups]``, a principal of ``[node.tokens]`` or ``anonymous``
    (the caller of a node without tokens); the single ``api_token`` holds every scope and is
    never granted any; every scope is one of :data:`~protomolt_jobs.hooks.contract.SCOPES`."""
    if entry is None or entry[0] is None:
        return None
    raw, origin = entry
    if not isinstance(raw, dict):
        raise ConfigError(
            f'node.scopes ({origin}) must be a table like [node.scopes] editor = ["job-control"]; '
            f"got {type(raw).__name__}"
        )
    known = ", ".join(sorted(SCOPES))
    grants: dict[str, frozenset[str]] = {}
    for name, scopes in raw.items():
        if name == "api":
            raise ConfigError(
                f"node.scopes.api ({origin}): the api_token (principal api) holds every scope; "
                "give a named token ([node.tokens]) the scopes you mean to limit"
            )
        if name not in groups and name not in tokens and name != "anonymous":
            raise ConfigError(
                f"node.scopes.{name} ({origin}): {name} is neither a group of [node.groups] nor "
                "a principal of [node.tokens] (nor anonymous); a group an identity hook supplies "
                f"is declared in [node.groups] too (even empty: {name} = [])"
            )
        names = _name_list(f"scopes.{name}", scopes, origin, "scope names")
        for scope in names:
            if scope not in SCOPES:
                raise ConfigError(
                    f"node.scopes.{name} ({origin}) grants unknown scope {scope!r}; known "
                    f"scopes: {known}"
                )
        grants[name] = frozenset(names)
    return grants


def is_principal_name(name: Any) -> bool:
    """True for a name a principal may carry: lower-case letters, digits, ``.``, ``_``, ``-``
    (at most 64), and none of the built-in actors (``api``, ``anonymous``, ``operator``,
    ``sweeper``). Names an identity hook returns are checked with it."""
    return (
        isinstance(name, str)
        and _PRINCIPAL_NAME.match(name) is not None
        and name not in _RESERVED_PRINCIPALS
    )
