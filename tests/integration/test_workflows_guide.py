"""docs/workflows.md's worked example, run as written: the code blocks come from the doc.

Blocks preceded by an ``<!-- example: ... -->`` comment are the example:

- ``file NAME``: the block is written to ``NAME``;
- ``run``: the block runs in ``bash -euo pipefail`` and must exit 0;
- ``background, ready when "TEXT"``: the block starts in the background and is ready once its
  output shows TEXT (it is stopped at the end).

They run in order in an empty directory with the test's virtual environment first on PATH.
What differs from a reader's machine is only where things listen: the node gets this test's
database (``PROTOMOLT_JOBS_DSN``, instead of the embedded PostgreSQL) and free ports
(``PROTOMOLT_NODE_HTTP_PORT`` with ``PROTOMOLT_URL`` for the client commands), and the greeter's
``50051`` is replaced by a free port in every block, so parallel runs do not collide.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tests.support.broker import free_port
from tests.support.node import wait_for

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "workflows.md"
_BLOCK = re.compile(
    r"<!-- example: (?P<directive>[^>]*?) -->\n```[^\n]*\n(?P<body>.*?)```", re.DOTALL
)
GREETER_PORT = "50051"


def example_blocks(text: str) -> list[tuple[str, str]]:
    """``(directive, body)`` of every example block, in document order."""
    return [(m.group("directive").strip(), m.group("body")) for m in _BLOCK.finditer(text)]


class Background:
    """A background block; its combined output collected on a thread."""

    def __init__(self, body: str, cwd: Path, env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(
            ["bash", "-euo", "pipefail", "-c", f"exec {body.strip()}"],
            cwd=cwd,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        self.output: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.output.append(line)

    def ready(self, marker: str) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"exited {self.proc.returncode}:\n{''.join(self.output)}")
        return marker in "".join(self.output)

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


def test_the_guide_has_an_example_with_each_kind_of_block():
    directives = [d.split(",")[0].split()[0] for d, _ in example_blocks(GUIDE.read_text())]
    assert {"file", "run", "background"} <= set(directives)


@pytest.mark.slow
def test_the_worked_example_gets_a_custom_two_step_workflow_to_completed(tmp_path, fresh_dsn):
    http_port = free_port()
    greeter_port = str(free_port())
    venv_bin = str(Path(sys.executable).parent)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PROTOMOLT_")}
    env.update(
        PATH=f"{venv_bin}{os.pathsep}{env.get('PATH', '')}",
        PROTOMOLT_JOBS_DSN=fresh_dsn,
        PROTOMOLT_NODE_HTTP_PORT=str(http_port),
        PROTOMOLT_NODE_GRPC_PORT="0",
        PROTOMOLT_URL=f"http://127.0.0.1:{http_port}",
    )
    cwd = tmp_path / "greeter"
    cwd.mkdir()
    background: list[Background] = []
    outputs: list[str] = []
    try:
        for directive, body in example_blocks(GUIDE.read_text()):
            body = body.replace(GREETER_PORT, greeter_port)
            kind, _, rest = directive.partition(" ")
            if kind == "file":
                (cwd / rest.strip()).write_text(body)
            elif kind == "run":
                done = subprocess.run(
                    ["bash", "-euo", "pipefail", "-c", body],
                    cwd=cwd,
                    env=env,
                    capture_output=True,
                    text=True,
                    timeout=180,
                    check=False,
                )
                assert done.returncode == 0, f"{body}\n{done.stdout}\n{done.stderr}"
                outputs.append(done.stdout)
            elif kind == "background,":
                marker = re.search(r'ready when "([^"]+)"', directive)
                assert marker, directive
                proc, text = Background(body, cwd, env), marker.group(1)
                background.append(proc)
                wait_for(lambda p=proc, t=text: p.ready(t), timeout_s=90)
            else:
                raise AssertionError(f"unknown example directive: {directive}")
    finally:
        for proc in reversed(background):
            proc.stop()
    # What the guide says the reader sees.
    assert "workflow.json: ok (no findings)" in outputs[1]
    assert "stored workflow 'greet-and-shout'" in outputs[1]
    final = outputs[-1]
    assert '"status": "COMPLETED"' in final
    assert '"HELLO, ADA!"' in final and '"Hello, Ada!"' in final
    assert "2 steps, output greet.v1.ShoutReply" in final
