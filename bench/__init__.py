"""Side-by-side benchmarks of protomolt-jobs against DBOS and Procrastinate (issue 9).

Run ``python -m bench <scenario>`` with one of ``ceiling``, ``throughput``, ``latency``,
``scale``, ``memory``, ``all`` or ``smoke``. Every database the harness uses is created fresh
on the target cluster and dropped at the end; every process it starts (the no-op gRPC server,
one child process per system under test) is stopped in a ``finally``.

Each system runs in its own child process (``bench.child``), so DBOS's process-wide singleton,
event loops and peak RSS never leak from one run into the next, and the parent can count the
database's transactions from outside while the child works.
"""
