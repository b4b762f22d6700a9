"""A run's artifacts as the read verbs and the report show them, derived from its checkpoint
entries (issue 29; docs/artifacts.md).

One artifact per:

- entry that produced a response (``port: "response"``, ``kind: "response"``): its hash,
  size, producer (job, step, iteration, attempt, definition and descriptor hashes, adapter
  version, request hash) and ``inputs`` are the entry's (``workflow/artifacts.py`` writes
  them before the call); entries stored before those fields read without a hash;
- declared output port (``kind: "file"``, ``port`` its name): uri, hash, media type;
- external step's receipt (``kind: "receipt"``): the idempotency key, the verify probe's
  evidence or the provider's (``receipt.evidence``), its hash the canonical JSON's.

Artifacts of a step a ``retry-step`` superseded stay listed (``current: false``). An artifact
is ``stale`` when one of its inputs' recorded hash differs from that input's current artifact,
or that current artifact is stale itself (transitively). States (draft, verified, promoted)
are derived from the entries: a validator step that succeeded verifies, a publication step that
succeeded promotes (actor ``worker:<step>``).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping
from typing import Any

from protomolt_jobs.workflow import artifacts as wa

__all__ = [
    "MAX_DEPTH",
    "RunArtifacts",
    "is_uuid",
    "receipts_json",
    "report_json",
]

#: The deepest walk ``lineage`` makes.
MAX_DEPTH = 50

_PRODUCER_FIELDS = (
    ("attempt", "attempt"),
    ("definitionSha256", "definitionSha256"),
    ("descriptorSha256", "descriptorSha256"),
    ("adapterVersion", "adapterVersion"),
    ("requestSha256", "requestSha256"),
)


def _iteration(entry: Mapping[str, Any]) -> int:
    k = entry.get("iteration", 0)
    return k if isinstance(k, int) and not isinstance(k, bool) else 0


class RunArtifacts:
    """Every artifact of one run (``job``: a store row with ``job_id``, ``checkpoints``,
    ``status``; ``workflow``: the run's compiled workflow for the states, or None; ``rows``:
    ``{artifactId: state}`` of its ``workflow_artifact`` rows, which win over the states
    derived from the entries)."""

    def __init__(
        self, job: Any, workflow: Any = None, rows: Mapping[str, str] | None = None
    ) -> None:
        self.job_id = str(job.job_id)
        self.live = job.status not in ("COMPLETED", "FAILED", "CANCELLED", "DEAD")
        entries = [e for e in (job.checkpoints or []) if isinstance(e, dict)]
        self.entries = entries
        self.items: list[dict[str, Any]] = []
        states = wa.states(entries, workflow)
        latest: dict[tuple[str, int], int] = {}
        for i, entry in enumerate(entries):
            if isinstance(entry.get("name"), str):
                latest[(entry["name"], _iteration(entry))] = i
        for i, entry in enumerate(entries):
            self._add(i, entry, latest, states)
        self.by_id = {a["artifactId"]: a for a in self.items}
        for aid, state in (rows or {}).items():
            if aid in self.by_id:
                self.by_id[aid]["state"] = state
        self._mark_stale()

    # -- building ----------------------------------------------------------------------------

    def _add(
        self,
        i: int,
        entry: Mapping[str, Any],
        latest: Mapping[tuple[str, int], int],
        states: Mapping[str, str],
    ) -> None:
        name = entry.get("name")
        if not isinstance(name, str) or "failed" in entry or entry.get("skipped") is True:
            return
        k = _iteration(entry)
        current = latest.get((name, k)) == i
        producer: dict[str, Any] = {"jobId": self.job_id, "step": name, "iteration": k}
        for key, out in _PRODUCER_FIELDS:
            if key in entry:
                producer[out] = entry[key]
        inputs = [dict(x) for x in entry.get("inputs") or () if isinstance(x, dict)]
        for c in entry.get("consumed") or ():
            if isinstance(c, dict) and isinstance(c.get("ref"), str):
                step, _, port = c["ref"].partition(".")
                inputs.append({"step": step, "port": port or "response", "sha256": c["sha256"]})
        base = {"jobId": self.job_id, "step": name, "iteration": k, "checkpoint": i}
        if "response" in entry or "sha256" in entry:
            sha = entry.get("sha256")
            self._append(
                {
                    **base,
                    "port": "response",
                    "kind": "response",
                    "sha256": sha,
                    "sizeBytes": entry.get("sizeBytes"),
                    "mediaType": "application/json",
                    "state": states.get(name, "draft") if current else "draft",
                    "current": current,
                    "producer": producer,
                    "inputs": inputs,
                    "at": entry.get("at"),
                },
                entry,
            )
        for rec in entry.get("artifacts") or ():
            if not isinstance(rec, dict) or not isinstance(rec.get("port"), str):
                continue
            port = rec["port"]
            art = {
                **base,
                "port": port,
                "kind": str(rec.get("kind", "file")),
                "sha256": rec.get("sha256"),
                "uri": rec.get("uri"),
                "state": states.get(f"{name}.{port}", "draft") if current else "draft",
                "current": current,
                "producer": producer,
                "inputs": inputs,
                "at": entry.get("at"),
            }
            for key in ("sizeBytes", "mediaType"):
                if key in rec:
                    art[key] = rec[key]
            self._append(art, entry)
        receipt = entry.get("receipt")
        if isinstance(receipt, dict) and receipt:
            sha, size = wa.canonical_sha256(receipt)
            self._append(
                {
                    **base,
                    "port": "receipt",
                    "kind": "receipt",
                    "sha256": sha,
                    "sizeBytes": size,
                    "mediaType": "application/json",
                    "value": receipt,
                    "state": "draft",
                    "current": current,
                    "producer": producer,
                    "inputs": [{"step": name, "iteration": k, "sha256": entry.get("sha256")}]
                    if entry.get("sha256")
                    else [],
                    "at": entry.get("at"),
                },
                entry,
            )

    def _append(self, art: dict[str, Any], entry: Mapping[str, Any]) -> None:
        sha = art.get("sha256")
        key = sha if isinstance(sha, str) and sha else f"#{art['checkpoint']}"
        art["artifactId"] = wa.artifact_id(
            self.job_id, art["step"], art["iteration"], art["port"], entry.get("attempt"), key
        )
        art["stale"] = False
        self.items.append({"artifactId": art.pop("artifactId"), **art})

    def _find(self, ref: Mapping[str, Any]) -> dict[str, Any] | None:
        """The artifact an input names: by step, iteration, port and hash (the exact version
        read), else None (a version no entry holds any more)."""
        port = ref.get("port", "response")
        k = ref.get("iteration", 0)
        found = None
        for a in self.items:
            if (
                a["step"] == ref.get("step")
                and a["port"] == port
                and a["sha256"] == ref.get("sha256")
            ) and (a["iteration"] == k or found is None):
                found = a
        return found

    def _current(self, step: str, k: int, port: str) -> dict[str, Any] | None:
        for a in reversed(self.items):
            if a["step"] == step and a["iteration"] == k and a["port"] == port and a["current"]:
                return a
        return None

    def _mark_stale(self) -> None:
        memo: dict[str, bool] = {}

        def stale(a: dict[str, Any], depth: int = 0) -> bool:
            aid = a["artifactId"]
            if aid in memo:
                return memo[aid]
            memo[aid] = False  # a cycle (never in a run) reads as fresh
            result = False
            if depth < MAX_DEPTH:
                for ref in a["inputs"]:
                    step = ref.get("step")
                    if step == "input" or not isinstance(step, str):
                        continue
                    k = ref.get("iteration", 0) if isinstance(ref.get("iteration"), int) else 0
                    cur = self._current(step, k, ref.get("port", "response"))
                    if cur is None or cur["sha256"] is None:
                        continue  # an input no entry holds, or one stored without a hash
                    if cur["sha256"] != ref.get("sha256") or stale(cur, depth + 1):
                        result = True
                        break
            memo[aid] = result
            return result

        for a in self.items:
            a["stale"] = stale(a)
        for a in self.items:
            a["inputs"] = [self._linked(ref) for ref in a["inputs"]]

    def _linked(self, ref: Mapping[str, Any]) -> dict[str, Any]:
        out = dict(ref)
        found = self._find(ref) if ref.get("step") != "input" else None
        if found is not None:
            out["artifactId"] = found["artifactId"]
        return out

    # -- reading -----------------------------------------------------------------------------

    def summaries(self) -> list[dict[str, Any]]:
        """Every artifact, in checkpoint order (the list-artifacts answer)."""
        return [dict(a) for a in self.items]

    def entry(self, i: int) -> dict[str, Any]:
        """The checkpoint entry an artifact's ``checkpoint`` index names."""
        return self.entries[i]

    def get(self, artifact_id: str) -> dict[str, Any] | None:
        return self.by_id.get(artifact_id)

    def consumers(self, art: Mapping[str, Any]) -> list[dict[str, Any]]:
        """Artifacts whose inputs name ``art``."""
        aid = art["artifactId"]
        return [a for a in self.items if any(r.get("artifactId") == aid for r in a["inputs"])]

    def producers(self, art: Mapping[str, Any]) -> list[dict[str, Any]]:
        """Artifacts ``art``'s inputs name (those still held)."""
        out = []
        for ref in art["inputs"]:
            found = self.by_id.get(str(ref.get("artifactId", "")))
            if found is not None:
                out.append(found)
        return out

    def lineage(self, artifact_id: str, direction: str, depth: int) -> dict[str, Any] | None:
        """The walk ``lineage`` answers: ``{artifact, direction, depth, nodes: [artifact +
        distance (negative upstream)], edges: [{from, to}] (from an input to its consumer)}``,
        or None when no artifact of the run has that id."""
        root = self.by_id.get(artifact_id)
        if root is None:
            return None
        nodes: dict[str, int] = {artifact_id: 0}
        edges: set[tuple[str, str]] = set()
        for sign, step in (("up", -1), ("down", 1)):
            if direction not in (sign, "both"):
                continue
            frontier = [root]
            for d in range(1, depth + 1):
                nxt = []
                for a in frontier:
                    near = self.producers(a) if step < 0 else self.consumers(a)
                    for b in near:
                        edge = (b["artifactId"], a["artifactId"])
                        edges.add(edge if step < 0 else edge[::-1])
                        if b["artifactId"] not in nodes:
                            nodes[b["artifactId"]] = step * d
                            nxt.append(b)
                frontier = nxt
                if not frontier:
                    break
        return {
            "artifact": dict(root),
            "direction": direction,
            "depth": depth,
            "nodes": [
                {**self.by_id[aid], "distance": dist}
                for aid, dist in sorted(nodes.items(), key=lambda kv: (kv[1], kv[0]))
            ],
            "edges": [{"from": f, "to": t} for f, t in sorted(edges)],
        }


def receipts_json(items: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The receipts among ``items`` as the report lists them: ``{artifactId, step, iteration,
    sha256, value}``."""
    return [
        {
            "artifactId": a["artifactId"],
            "step": a["step"],
            "iteration": a["iteration"],
            "sha256": a["sha256"],
            "value": a.get("value"),
        }
        for a in items
        if a["kind"] == "receipt"
    ]


def report_json(items: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The artifacts a report lists (every one kept: a cancelled run's too): ``{artifactId,
    step, iteration, port, kind, sha256, state, stale, current, uri?}``."""
    out = []
    for a in items:
        row = {
            k: a[k] for k in ("artifactId", "step", "iteration", "port", "kind", "sha256", "state")
        }
        row["stale"] = a["stale"]
        row["current"] = a["current"]
        if a.get("uri"):
            row["uri"] = a["uri"]
        out.append(row)
    return out


def is_uuid(text: str) -> bool:
    try:
        uuid.UUID(text)
    except ValueError:
        return False
    return True
