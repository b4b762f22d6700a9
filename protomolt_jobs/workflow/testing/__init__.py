"""Tests in the definition (DESIGN.md 25): a workflow's ``tests`` cases run on the real engine
with mocked steps, a virtual clock and no network.

==================  =====================================================================
:mod:`.cases`       the ``tests`` key: cases, mocks, events, expectations; strict parsing
:mod:`.transport`   the mock transport (a ``Runtime.channel_factory``) and virtual clock
:mod:`.harness`     one case over a stand-in run row: the worker's settle loop in-process
:mod:`.verdict`     a case's first difference from its ``expect``
:mod:`.coverage`    decisions, failure edges, loop exits, escalations no case reached
:mod:`.suite`       every case of a definition: verdicts and coverage
==================  =====================================================================

``suite.run_tests`` is what the ``test-workflow`` verb runs. This package's ``__init__`` imports nothing, so the verifier can use :mod:`.cases` alone.
"""
