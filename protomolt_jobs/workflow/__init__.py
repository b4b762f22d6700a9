"""The workflow engine: parse, verify and run descriptor-first workflows over unary gRPC.

It knows nothing of jobs, the store or Kafka (docs/internals.md). The public surface:

- :class:`Runtime` (the host's type pool and in-process channel factory);
- :func:`parse_workflow`, :func:`parse_input`, :func:`verify`, :func:`check`;
- :func:`run_segment` (replay a checkpoint prefix, run on, park or complete), :func:`run`
  (synchronous), :func:`next_target`;
- :class:`CompiledWorkflow`, :class:`Step`, :class:`Finding`, :class:`Completed`,
  :class:`Parked`, :class:`FailureKind`, :class:`WorkflowParseError`,
  :class:`WorkflowExecutionError`.
"""

from protomolt_jobs.workflow.envelope import parse_input, parse_workflow
from protomolt_jobs.workflow.runner import CANNOT_PARK, next_target, run, run_segment
from protomolt_jobs.workflow.step_run import checkpoint_entry
from protomolt_jobs.workflow.types import (
    DEFAULT_DEADLINE_MS,
    CompiledWorkflow,
    Completed,
    FailureKind,
    Finding,
    Output,
    Parked,
    RecoveryRequired,
    Runtime,
    Step,
    WorkflowExecutionError,
    WorkflowParseError,
)
from protomolt_jobs.workflow.verifier import check, verify

__all__ = [
    "CANNOT_PARK",
    "DEFAULT_DEADLINE_MS",
    "CompiledWorkflow",
    "Completed",
    "FailureKind",
    "Finding",
    "Output",
    "Parked",
    "RecoveryRequired",
    "Runtime",
    "Step",
    "WorkflowExecutionError",
    "WorkflowParseError",
    "check",
    "checkpoint_entry",
    "next_target",
    "parse_input",
    "parse_workflow",
    "run",
    "run_segment",
    "verify",
]
