"""Graph workflows over the test ``Steps/Run`` service (tests/support/grpc_servers.py).

:func:`step` builds one step calling ``jobs.test.Steps/Run`` whose request names the step,
how long the server sleeps and whether it fails; ``reads`` copies upstream steps' ``seen``
lists into the request (so each reply lists the steps it depends on, data-wise).
:func:`graph` wraps steps into an envelope whose input is ``jobs.test.Text``.
"""

from __future__ import annotations

from typing import Any

from tests.support.grpc_servers import schema_for

METHOD = "jobs.test.Steps/Run"


def step(
    name: str,
    target: str,
    *,
    sleep_ms: int = 0,
    fail: str = "",
    reads: tuple[str, ...] | list[str] = (),
    **keys: Any,
) -> dict[str, Any]:
    """One ``Steps/Run`` step; ``keys`` are added as they are (``after``, ``when`` ...)."""
    rules = [f'step = "{name}"']
    if sleep_ms:
        rules.append(f"sleep_ms = {sleep_ms}")
    if fail:
        rules.append(f'fail = "{fail}"')
    rules.extend(f"seen += {r}.seen" for r in reads)
    return {"name": name, "target": target, "method": METHOD, "rules": rules, **keys}


def graph(steps: list[dict[str, Any]], *, name: str = "graph", **keys: Any) -> dict[str, Any]:
    """An envelope over ``steps`` (input ``jobs.test.Text``, 20 s budget, no output mapping)."""
    return {
        "name": name,
        "schema": schema_for("descriptorSetBase64"),
        "inputType": "jobs.test.Text",
        "deadlineMs": 20_000,
        "steps": steps,
        **keys,
    }


def diamond(target: str, *, sleep_ms: int = 1000, **keys: Any) -> dict[str, Any]:
    """a -> (b || c) -> d; b and c sleep ``sleep_ms`` each."""
    return graph(
        [
            step("a", target),
            step("b", target, sleep_ms=sleep_ms, reads=["a"], after=["a"]),
            step("c", target, sleep_ms=sleep_ms, reads=["a"], after=["a"]),
            step("d", target, reads=["b", "c"], after=["b", "c"]),
        ],
        name="diamond",
        **keys,
    )


def fan_out(
    target: str,
    *,
    policy: str = "FAIL_FAST",
    max_concurrency: int = 4,
    max_items: int = 1024,
    name: str = "fan",
) -> dict[str, Any]:
    """One fan-out step over the input's ``items`` (input ``jobs.test.StepBatch``): each item
    is a ``StepRequest`` sent to ``Steps/Run``; replies collected into ``StepReplies.replies``."""
    return {
        "name": "fan-out",
        "schema": schema_for("descriptorSetBase64"),
        "inputType": "jobs.test.StepBatch",
        "deadlineMs": 20_000,
        "steps": [
            {
                "name": name,
                "target": target,
                "method": METHOD,
                "edge": {
                    "sources": ["input"],
                    "produceType": "jobs.test.StepBatch",
                    "rules": ["items = input.items"],
                },
                "fanOut": {
                    "items": "items",
                    "maxItems": max_items,
                    "maxConcurrency": max_concurrency,
                    "failurePolicy": policy,
                    "collectType": "jobs.test.StepReplies",
                    "collectInto": "replies",
                },
            }
        ],
    }


def batch(
    n: int, *, failing: tuple[int, ...] = (), sleep_ms: int = 0, fail_after_ms: int = 0
) -> dict[str, Any]:
    """A ``StepBatch`` input of ``n`` items named ``item<i>``, each sleeping ``sleep_ms`` on
    the server; ``failing`` ones answer FAILED_PRECONDITION after ``fail_after_ms``."""
    items = []
    for i in range(n):
        item: dict[str, Any] = {"step": f"item{i}", "index": i}
        if i in failing:
            item["fail"] = "FAILED_PRECONDITION"
            if fail_after_ms:
                item["sleepMs"] = fail_after_ms
        elif sleep_ms:
            item["sleepMs"] = sleep_ms
        items.append(item)
    return {"items": items}
