"""The ``workflow_artifact`` rows a checkpoint entry asks for (migration 0027; docs/artifacts.md):
a projection of the entry, written by the checkpoint's own statement
(``job_checkpoint_artifacts``), never by another transaction.

An entry asks for rows when it declares output ports (``artifacts``), a declared receipt
(``receipt.evidence``), artifacts it verified (``validated``) or consumed (``consumed``); an
entry with none of them (every entry of a workflow without artifact keys) asks for none and is
written by the plain ``job_checkpoint``, as before. Pure JSON: nothing here knows a workflow. Each row carries its ``artifactId``
(``hooks.contract.artifact_id``, the id the engine and the read verbs give it).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from protomolt_jobs.hooks.contract import artifact_id

__all__ = ["artifact_rows", "has_artifact_rows"]


def has_artifact_rows(entry: Mapping[str, Any]) -> bool:
    """Whether ``entry`` asks for artifact rows (so its checkpoint takes the variant)."""
    receipt = entry.get("receipt")
    return bool(
        entry.get("artifacts")
        or entry.get("validated")
        or entry.get("consumed")
        or (isinstance(receipt, dict) and "evidence" in receipt)
    )


#: The largest ``size_bytes`` the column (BIGINT) holds; a port's larger size is not kept.
_BIGINT_MAX = 2**63 - 1


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def artifact_rows(entry: Mapping[str, Any], job_id: Any) -> list[dict[str, Any]]:
    """The rows ``entry`` of job ``job_id`` asks for, each ``{artifactId, step, iteration,
    port, kind, attempt, sha256, uri?, mediaType?, sizeBytes?, state, reason}``: its ports and
    declared receipt as ``draft``, what it validated as ``verified``, what it consumed as
    ``promoted``."""
    name = str(entry.get("name", ""))
    k, attempt = _int(entry.get("iteration")), _int(entry.get("attempt"))
    rows: list[dict[str, Any]] = []
    for rec in entry.get("artifacts") or ():
        if isinstance(rec, dict) and rec.get("port") and rec.get("sha256"):
            row: dict[str, Any] = {
                "step": name,
                "iteration": k,
                "port": str(rec["port"]),
                "kind": str(rec.get("kind", "file")),
                "attempt": attempt,
                "sha256": str(rec["sha256"]),
                "state": "draft",
                "reason": f"produced by step '{name}'",
            }
            for key in ("uri", "mediaType"):
                if isinstance(rec.get(key), str):
                    row[key] = rec[key]
            size = rec.get("sizeBytes")
            if type(size) is int and 0 <= size <= _BIGINT_MAX:  # else no size (the column's)
                row["sizeBytes"] = size
            rows.append(row)
    receipt = entry.get("receipt")
    if isinstance(receipt, dict) and "evidence" in receipt:
        data = json.dumps(receipt, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        rows.append(
            {
                "step": name,
                "iteration": k,
                "port": "receipt",
                "kind": "receipt",
                "attempt": attempt,
                "sha256": hashlib.sha256(data.encode()).hexdigest(),
                "sizeBytes": len(data.encode()),
                "mediaType": "application/json",
                "state": "draft",
                "reason": f"receipt of effect '{name}'",
            }
        )
    for key, state, why in (
        ("validated", "verified", "validated by"),
        ("consumed", "promoted", "published by"),
    ):
        for ref in entry.get(key) or ():
            if not isinstance(ref, dict) or not ref.get("sha256") or not ref.get("step"):
                continue
            row = {
                "step": str(ref["step"]),
                "iteration": _int(ref.get("iteration")),
                "port": str(ref.get("port", "response")),
                "kind": str(ref.get("kind", "response")),
                "attempt": _int(ref.get("attempt")),
                "sha256": str(ref["sha256"]),
                "state": state,
                "reason": f"{why} step '{name}'",
            }
            rows.append(row)
    for row in rows:
        row["artifactId"] = artifact_id(
            job_id, row["step"], row["iteration"], row["port"], row["attempt"], row["sha256"]
        )
    return rows
