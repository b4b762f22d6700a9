"""The per-attempt progress token of a step that reports its own progress (``reportsProgress``).

A step declaring ``reportsProgress: true`` is called with gRPC metadata
``protomolt-progress-token: <token>`` (:data:`HEADER`); the service passes the token to
``ReportProgress`` on the node's gRPC service (docs/long-steps.md). The token names the run's
lease and the step it was issued for: ``pmp2.`` + unpadded base64url of the JSON array
``[job_id, step, iteration, attempt, lease_owner, mac, resumable]`` (+ the four fingerprints
``adapter_version, input_sha256, descriptor_sha256, definition_sha256`` when they fit).

``mac`` is the hex SHA-256 of the array's compact JSON with ``mac`` replaced by ``""``, then
``:`` and the attempt's lease token. The lease token is a random UUID the database stamps on
every claim (``gen_random_uuid()``, 122 random bits) and clears with the lease; the token never
carries it, so the holder cannot rewrite any field (the step, the iteration, the fingerprints)
and still match: a token is a bearer capability for exactly one step of one attempt, with no
node secret. A report is ONE fenced write (``job_progress``) whose fence is the token's
``(job_id, lease_owner, attempt)`` and its ``mac`` recomputed by the database from the row's
lease token: a token of an earlier attempt, one whose lease moved (sweep, release, pause,
cancel), or one rewritten by its holder matches no row and changes nothing. (``pmp1.``
tokens, which carried the lease token itself and so could be rewritten to another step's,
are refused.)
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import re
import uuid
from dataclasses import dataclass

from protomolt_jobs.store.records import Lease

__all__ = ["HEADER", "PREFIX", "UNKNOWN_LEASE_TOKEN", "ProgressToken", "mac_of"]

#: The gRPC metadata key the step call carries the token under.
HEADER = "protomolt-progress-token"
#: The token's version prefix.
PREFIX = "pmp2."
#: The lease token of a decoded token's ``lease`` (the token never carries the real one).
UNKNOWN_LEASE_TOKEN = uuid.UUID(int=0)
#: Longest token accepted (characters). A token whose fingerprints would make it longer (an
#: absurdly long ``adapterVersion``) is issued without them: its reports keep the stored ones.
MAX_LEN = 2048
_SHA256 = re.compile(r"(?:[0-9a-f]{64})?")
_MAC = re.compile(r"[0-9a-f]{64}")


def _bound(body: list[object]) -> str:
    """The text a token's mac covers: its array, compact, with the mac slot empty."""
    return json.dumps([*body[:5], "", *body[6:]], separators=(",", ":"))


def mac_of(bound: str, lease_token: uuid.UUID | str) -> str:
    """The hex SHA-256 of ``bound + ":" + lease_token`` (the database computes the same in
    ``job_progress``'s fence)."""
    return hashlib.sha256(f"{bound}:{lease_token}".encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class ProgressToken:
    """What a progress token names.

    :ivar lease: the fence of the attempt it was issued to.
    :ivar step: the step called.
    :ivar iteration: its loop iteration (0 outside a loop).
    :ivar resumable: the step is also ``resumable`` (a pause may end its call early).
    :ivar adapter_version: the step's ``adapterVersion`` when called ("" for none).
    :ivar input_sha256: hex SHA-256 of the call's request without its state ("" for unknown).
    :ivar descriptor_sha256: hex SHA-256 of the step's descriptors ("" for unknown).
    :ivar definition_sha256: hex SHA-256 of the run's definition ("" for unknown: the token
        carries no fingerprints and its reports keep the stored ones).
    :ivar mac: of a decoded token, its mac (module docstring); its ``lease.token`` is then
        :data:`UNKNOWN_LEASE_TOKEN`. "" for a token built to be issued.
    :ivar bound: of a decoded token, the text its mac covers.
    """

    lease: Lease
    step: str
    iteration: int
    resumable: bool
    adapter_version: str = ""
    input_sha256: str = ""
    descriptor_sha256: str = ""
    definition_sha256: str = ""
    mac: str = ""
    bound: str = ""

    def encode(self) -> str:
        """The token text (ASCII, no padding), at most :data:`MAX_LEN` characters (the
        fingerprints are left out when they would not fit)."""
        head: list[object] = [
            str(self.lease.job_id),
            self.step,
            self.iteration,
            self.lease.attempt,
            self.lease.owner,
            "",
            self.resumable,
        ]
        prints = [
            self.adapter_version,
            self.input_sha256,
            self.descriptor_sha256,
            self.definition_sha256,
        ]
        if self.definition_sha256:
            text = self._signed([*head, *prints])
            if len(text) <= MAX_LEN:
                return text
        return self._signed(head)

    def _signed(self, body: list[object]) -> str:
        body[5] = mac_of(_bound(body), self.lease.token)
        return _encode(body)

    @classmethod
    def decode(cls, text: object) -> ProgressToken:
        """Parse a token.

        :raises ValueError: ``token: ...`` when it is empty, too long, or not a token this
            node issues.
        """
        if not isinstance(text, str) or not text.strip():
            raise ValueError("token: must be the step call's protomolt-progress-token; got none")
        if len(text) > MAX_LEN or not text.startswith(PREFIX):
            raise ValueError(f"token: not a progress token (expected '{PREFIX}' ...)")
        raw = text[len(PREFIX) :]
        try:
            body = json.loads(base64.urlsafe_b64decode(raw + "=" * (-len(raw) % 4)))
            if not isinstance(body, list) or len(body) not in (7, 11):
                raise ValueError("shape")
            job_id, step, iteration, attempt, owner, mac, resumable = body[:7]
            if not isinstance(mac, str) or not _MAC.fullmatch(mac):
                raise ValueError("shape")
            prints = body[7:] if len(body) == 11 else ["", "", "", ""]
            if not all(isinstance(p, str) for p in prints):
                raise ValueError("shape")
            adapter, input_sha, descriptor_sha, definition_sha = prints
            if not all(_SHA256.fullmatch(h) for h in (input_sha, descriptor_sha, definition_sha)):
                raise ValueError("shape")
            if not (
                isinstance(step, str)
                and step
                and isinstance(owner, str)
                and owner
                and type(iteration) is int
                and type(attempt) is int
                and iteration >= 0
                and isinstance(resumable, bool)
            ):
                raise ValueError("shape")
            lease = Lease(uuid.UUID(job_id), owner, attempt, UNKNOWN_LEASE_TOKEN)
            bound = _bound(body)
        except (ValueError, TypeError, binascii.Error, AttributeError):
            raise ValueError("token: not a progress token this node issued") from None
        return cls(
            lease=lease,
            step=step,
            iteration=iteration,
            resumable=resumable,
            adapter_version=adapter,
            input_sha256=input_sha,
            descriptor_sha256=descriptor_sha,
            definition_sha256=definition_sha,
            mac=mac,
            bound=bound,
        )


def _encode(body: list[object]) -> str:
    raw = json.dumps(body, separators=(",", ":")).encode()
    return PREFIX + base64.urlsafe_b64encode(raw).decode().rstrip("=")
