"""The loops of one graph run, as the graph executor consults them (``loops.py`` has the rules).

:class:`LoopRun` joins a :class:`~.loops.LoopTracker` (iterations, pending re-runs, settled
loops) to the run's :class:`~.graph.GraphState`: it keeps ``GraphState.blocked`` in step with
the tracker, resets a body's outcomes when its next iteration starts, stamps entries with their
iteration, checks replayed entries (a repeated step name is legal only as the next iteration
of a declared body) and gives each call's idempotency-key suffix. ``graph_run`` builds one only
for a workflow that declares a ``loop``; every other run never reaches this module.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from google.protobuf.message import Message

from protomolt_jobs.workflow import graph as g
from protomolt_jobs.workflow.envelope import message_class
from protomolt_jobs.workflow.loops import LOOP_WAIT, LoopTracker, key_suffix
from protomolt_jobs.workflow.step_run import DRIFT, fail
from protomolt_jobs.workflow.types import (
    CompiledWorkflow,
    FailureKind,
    Parked,
    Step,
    WorkflowExecutionError,
)

__all__ = ["LoopRun"]

#: The checkpoint entry key of an iteration above 0.
ITERATION = "iteration"


class LoopRun:
    """The loop side of one graph run (used from the scheduling thread; :meth:`iteration` and
    :meth:`suffix` are also read by pool threads, for steps whose iteration cannot change while
    they run: a body re-runs only once none of its steps runs).

    :param effects: ``() -> the run's effects.EffectContext`` (or None): its
        ``loop_extensions`` gives the re-runs extend-loop added, asked only at a loop's bound.
    """

    def __init__(
        self,
        workflow: CompiledWorkflow,
        state: g.GraphState,
        effects: Callable[[], Any] = lambda: None,
    ) -> None:
        self.workflow = workflow
        self.tracker = LoopTracker(workflow, lambda: self._extensions(effects()))
        self.state = state
        self._seen: set[tuple[str, int]] = set()
        self._sync()

    @staticmethod
    def _extensions(effects: Any) -> Mapping[str, Any]:
        ask = getattr(effects, "loop_extensions", None)
        return ask() if ask is not None else {}

    def defaults(self) -> dict[str, Message]:
        """The loop steps bound to their output type's default: a body reads the loop step
        before it first ran."""
        out: dict[str, Message] = {}
        for s in self.workflow.loops:
            assert s.output_type is not None
            out[s.name] = message_class(s.output_type)()
        return out

    def current(self, step: Step, intent: Any, key: str) -> bool:
        """Whether ``step``'s stored intent is this iteration's: its key is ``key``, the
        call's; in iteration 0 any intent is (as in a run without loops)."""
        if not self.tracker.iteration(step.name):
            return True
        return isinstance(intent, dict) and intent.get("key") == key

    # -- what a step is --------------------------------------------------------------------

    def iteration(self, step: str) -> int:
        return self.tracker.iteration(step)

    def suffix(self, step: str) -> str:
        """What the iteration adds to ``step``'s idempotency key (``""`` in iteration 0)."""
        return key_suffix(self.tracker.iteration(step))

    def stamp(self, entry: dict[str, Any]) -> dict[str, Any]:
        """Add ``"iteration": k`` to a new entry of iteration ``k > 0`` (in place; returned)."""
        k = self.tracker.iteration(str(entry.get("name", "")))
        if k > 0:
            entry[ITERATION] = k
        return entry

    @property
    def parked(self) -> Parked | None:
        """The stop of a loop that exhausted with ``onExhausted: "park"``, or None."""
        step = self.tracker.parked
        return Parked(step, LOOP_WAIT) if step else None

    # -- replay ----------------------------------------------------------------------------

    def before_replay(self, i: int, step: Step, entry: Mapping[str, Any]) -> None:
        """Check stored entry ``i`` of ``step`` before it is bound: its iteration must be the
        step's current one, or the next one of a loop about to re-run its body (which then
        starts); never one already bound.

        :raises WorkflowExecutionError: WORKFLOW naming the entry (the definition changed).
        """
        name = step.name
        current = self.tracker.iteration(name)
        raw = entry.get(ITERATION)
        if raw is None:
            # an approval decision the timer sweep wrote before its timers carried the
            # iteration has none: its place (the step's open iteration) says it
            wanted = current if step.approval is not None else 0
        elif isinstance(raw, int) and not isinstance(raw, bool) and raw >= 0:
            wanted = raw
        else:
            raise fail(
                FailureKind.WORKFLOW, name, f"checkpoint {i} has an unreadable iteration; {DRIFT}"
            )
        while wanted > current:
            pending = next(
                (p for p in self.tracker.pending if name in self.tracker.plan.loops[p].body), None
            )
            if pending is None:
                break
            self.restart(pending)
            current = self.tracker.iteration(name)
        if wanted != current or (name, wanted) in self._seen:
            raise fail(
                FailureKind.WORKFLOW,
                name,
                f"checkpoint {i} repeats step '{name}' (iteration {wanted}), which is not the "
                f"next iteration of a declared loop body; {DRIFT}",
            )
        self._seen.add((name, wanted))

    # -- events ----------------------------------------------------------------------------

    def ended(self, name: str) -> WorkflowExecutionError | None:
        """``name`` ended (its outcome is in the state): a loop step's end may schedule the
        next iteration, settle the loop or exhaust it.

        :returns: the LOOP failure of a ``fail`` exhaustion (recorded as the state's unhandled
            failure, naming the loop step), else None.
        """
        outcome = self.state.outcomes.get(name)
        if outcome is None or name not in self.tracker.plan.loops:
            return None
        error = self.tracker.ended(name, outcome)
        self._sync()
        if error is not None:
            self.state.reasons[name] = error.message
            if self.state.unhandled is None:
                self.state.unhandled = name
        return error

    def restart_due(self, running: Iterable[str]) -> bool:
        """Start the next iteration of a loop whose body is idle; True when one started."""
        step = self.tracker.due(running)
        if step is None:
            return False
        self.restart(step)
        return True

    def restart(self, step: str) -> None:
        body = self.tracker.restart(step)
        self.state.reset(body)
        self._sync()

    def _sync(self) -> None:
        self.state.blocked = self.tracker.blocked()
