"""What the realistic workload's parts cost in the engine: ``python -m bench.realistic_parts``.

``run_steps`` (the sequential runner, with an ``EffectContext`` as the worker gives it) runs the
no-op workflow, the realistic one, and the realistic one without ``validate``, without
``celRules``, without ``when`` and without all three, against the loopback no-op gRPC server,
in one thread with no database: each checkpoint entry is JSON-encoded as the store would. The
variants are interleaved in rounds; each prints its thread CPU per job (ms) per round, the
minimum, and the minimum's ratio to the no-op workflow's.

``--pieces``: instead, loop micro-benchmarks of the realistic job's parts over its three steps
(gates, request mapping, validation, checkpoint entries; no gRPC), best of three, in us. In
place each part costs more than in a hot loop (docs/benchmarks.md, issue 33 item 5).
"""

from __future__ import annotations

import argparse
import copy
import json
import time
import uuid
from typing import Any

import grpc

from bench import ours
from bench.noop_grpc import NoopServer
from protomolt_jobs.workflow import envelope
from protomolt_jobs.workflow.effects import EffectContext
from protomolt_jobs.workflow.sequential_run import run_steps
from protomolt_jobs.workflow.types import Runtime

_DROPS = {
    "no-validate": ("validate",),
    "no-celRules": ("celRules",),
    "no-when": ("when",),
    "bare": ("validate", "celRules", "when"),
}


def _variant(definition: dict, name: str) -> dict:
    out = copy.deepcopy(definition)
    out["name"] = f"bench-realistic-{name}"
    for step in out["steps"]:
        for key in _DROPS[name]:
            step.pop(key, None)
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.realistic_parts")
    p.add_argument("--n", type=int, default=500, help="jobs per variant (over 5 rounds)")
    p.add_argument("--pieces", action="store_true", help="loop micro-benchmarks of the parts")
    args = p.parse_args(argv)
    if args.pieces:
        _pieces(max(100, args.n))
        return
    per_round = max(1, args.n // 5)
    with NoopServer(threads=4) as srv:
        channels: dict[str, grpc.Channel] = {}

        def factory(target: str, tls: bool) -> grpc.Channel:
            ch = channels.get(target)
            if ch is None:
                ch = channels[target] = grpc.insecure_channel(target)
            return ch

        runtime = Runtime(channel_factory=factory)
        realistic = ours.realistic_workflow(srv.target)
        defs = {"noop": ours.workflow(srv.target), "realistic": realistic}
        for name in _DROPS:
            defs[name] = _variant(realistic, name)
        workflows = {k: envelope.parse_workflow(v, runtime) for k, v in defs.items()}
        inputs = {
            k: envelope.parse_input(wf, {"text": "p1"} if k == "noop" else ours.realistic_input(7))
            for k, wf in workflows.items()
        }
        sink: list[str] = []

        def on_checkpoint(entry: dict[str, Any]) -> None:
            sink.append(json.dumps(entry, separators=(",", ":")))
            if len(sink) > 100:
                sink.clear()

        def one(kind: str) -> None:
            effects = EffectContext(job_id=str(uuid.uuid4()), attempt=1)
            run_steps(
                workflows[kind], inputs[kind], [], on_checkpoint, runtime=runtime, effects=effects
            )

        for kind in workflows:
            one(kind)
        results: dict[str, list[float]] = {k: [] for k in workflows}
        for _ in range(5):
            for kind in workflows:
                c0 = time.thread_time()
                for _ in range(per_round):
                    one(kind)
                results[kind].append((time.thread_time() - c0) / per_round * 1e3)
        for channel in channels.values():
            channel.close()
    base = min(results["noop"])
    for kind, values in results.items():
        rounds = " ".join(f"{v:.3f}" for v in values)
        print(f"{kind:12s} {rounds}  min {min(values):.3f} ms/job  {min(values) / base:.2f}x")


def _pieces(n: int) -> None:
    from protomolt_jobs.workflow.step_run import (
        Scope,
        build_message,
        checkpoint_entry,
        gate_open,
        validate_response,
    )

    wf = envelope.parse_workflow(ours.realistic_workflow("127.0.0.1:1"), Runtime())
    doc = envelope.parse_input(wf, ours.realistic_input(7))
    scope = Scope({"input": doc})
    responses = []
    for step in wf.steps:
        responses.append(
            build_message(step.input_type, step.rules, step.cel_rules, scope, step.name)
        )
        scope.bind(step.name, responses[-1])

    def job() -> None:
        s = Scope({"input": doc})
        for step in wf.steps:
            gate_open(step, s)
            r = build_message(step.input_type, step.rules, step.cel_rules, s, step.name)
            validate_response(step, r)
            s.bind(step.name, r)
            checkpoint_entry(step.name, r, wf.pool)

    def gates() -> None:
        s = Scope({"input": doc})
        for step, r in zip(wf.steps, responses, strict=True):
            gate_open(step, s)
            s.bind(step.name, r)

    def mapping() -> None:
        s = Scope({"input": doc})
        for step, r in zip(wf.steps, responses, strict=True):
            build_message(step.input_type, step.rules, step.cel_rules, s, step.name)
            s.bind(step.name, r)

    def validation() -> None:
        for step, r in zip(wf.steps, responses, strict=True):
            validate_response(step, r)

    def checkpoints() -> None:
        for step, r in zip(wf.steps, responses, strict=True):
            checkpoint_entry(step.name, r, wf.pool)

    for label, fn in [
        ("job: gates, mapping, validation, checkpoints", job),
        ("gates", gates),
        ("mapping (rules and celRules)", mapping),
        ("validation", validation),
        ("checkpoint entries", checkpoints),
    ]:
        fn()
        best = float("inf")
        for _ in range(3):
            c0 = time.thread_time()
            for _ in range(n):
                fn()
            best = min(best, (time.thread_time() - c0) / n * 1e6)
        print(f"{label:46s} {best:8.1f} us per job (3 steps)")


if __name__ == "__main__":
    main()
