"""docs/long-steps.md's render example, as written (issue 28 item 6): the proto, the node's
configuration, the two submit envelopes and the operator's commands are read out of the doc
(blocks marked ``<!-- render-example: ... -->``) and run, the commands through the real CLI,
against a real node (real PostgreSQL, its worker and sweeper) and real render gRPC services on
loopback that sleep per frame and count frames. The 8-frame render is paused during frame 3,
resumed "tomorrow 22:00" in Warsaw (the planned time checked against the database's own
resolution, then, as the doc says, the operator changes their mind and resumes at once), and
preempted by an urgent job at a frame boundary; every frame is rendered exactly once."""

from __future__ import annotations

import json
import re
import shlex
import threading
from datetime import datetime

import psycopg
import pytest

from protomolt_jobs.host.cli import main
from tests.support.guides import DOCS, doc_blocks
from tests.support.node import start_node_with_file, wait_for
from tests.support.render_service import PROTO_PATH, ROOT, RenderService

GUIDE = DOCS / "long-steps.md"
TOKEN = "render-guide-token"
NODE = f"""
[node]
api_token = "{TOKEN}"

"""
FRAMES = 8


@pytest.fixture(scope="module")
def blocks() -> dict[str, str]:
    found = doc_blocks(GUIDE, "render-example")
    assert set(found) == {
        f"proto {PROTO_PATH}",
        "protomolt.toml",
        "render.json",
        "urgent.json",
        "commands",
    }, set(found)
    return found


def _commands(block: str) -> list[list[str]]:
    out = []
    for line in block.splitlines():
        line = line.strip()
        if line:
            assert line.startswith("$ protomolt-jobs "), line
            out.append(shlex.split(line[len("$ protomolt-jobs ") :]))
    return out


class Sampler(threading.Thread):
    """Samples the gpu queue's RUNNING count every 10 ms until stopped."""

    def __init__(self, dsn):
        super().__init__(daemon=True)
        self.dsn = dsn
        self.samples: list[int] = []
        self.stop = threading.Event()

    def run(self):
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            while not self.stop.is_set():
                (n,) = conn.execute(
                    "SELECT count(*) FROM workflow_run WHERE status = 'RUNNING' AND queue = 'gpu'"
                ).fetchone()
                self.samples.append(n)
                self.stop.wait(0.01)


def test_the_render_example_runs_as_written(blocks, tmp_path, fresh_dsn, capsys):
    proto = blocks[f"proto {PROTO_PATH}"]
    # the service serves exactly the doc's messages
    assert proto == (ROOT / PROTO_PATH).read_text(encoding="utf-8")
    commands = _commands(blocks["commands"])
    assert [c[:2] for c in commands] == [
        ["call", "submit-workflow"],
        ["jobs", "pause"],
        ["jobs", "get"],
        ["jobs", "resume"],
        ["jobs", "list"],
        ["jobs", "pause"],
        ["jobs", "resume"],
        ["call", "submit-workflow"],
        ["jobs", "history"],
    ]
    sampler = Sampler(fresh_dsn)
    with (
        RenderService(frame_s=0.15) as film,
        RenderService(frame_s=0.05) as urgent_svc,
    ):
        files = {}
        for name in ("render.json", "urgent.json"):
            text = blocks[name].replace("127.0.0.1:7001", film.target)
            text = text.replace("127.0.0.1:7002", urgent_svc.target)
            envelope = json.loads(text)
            envelope["workflow"]["schema"]["sources"][PROTO_PATH] = proto
            files[name] = json.dumps(envelope)
        surfaces = start_node_with_file(tmp_path, fresh_dsn, NODE + blocks["protomolt.toml"])
        door = ["--url", surfaces.http.url, "--token", TOKEN]
        job = ""

        def run(i: int) -> str:
            """Command ``i`` of the doc, as written (``$JOB`` and ``$(cat f)`` filled in)."""
            args = []
            for arg in commands[i]:
                found = re.fullmatch(r"\$\(cat (\S+)\)", arg)
                args.append(files[found.group(1)] if found else arg.replace("$JOB", job))
            code = main([*args, *door])
            captured = capsys.readouterr()
            assert code == 0, (commands[i], captured.out, captured.err)
            return captured.out

        def get(job_id: str = "") -> dict:
            assert main(["jobs", "get", job_id or job, *door]) == 0
            return json.loads(capsys.readouterr().out)["job"]

        try:
            sampler.start()
            # 1. submit; the pause is typed during frame 3
            frame3 = film.hold(3)
            answer = json.loads(run(0))
            assert answer["ok"], answer
            job = answer["jobId"]
            assert frame3.wait(30), "frame 3 never started"
            paused = json.loads(run(1))
            assert paused["ok"] and paused["status"] == "RUNNING", paused  # pending
            film.release(3)
            wait_for(lambda: get()["status"] == "PAUSED" or None, timeout_s=30)
            shown = json.loads(run(2))["job"]
            assert film.rendered == [1, 2, 3], film.rendered  # after frame 3, not 8
            assert shown["status"] == "PAUSED" and shown["attempt"] == 1
            progress = shown["progress"]
            assert progress["step"] == "render" and progress["percent"] == 37.5
            assert progress["details"] == "frame 3 of 8"

            # 2. "tomorrow 22:00" in Warsaw: the planned time is the database's resolution
            planned = json.loads(run(3))
            with psycopg.connect(fresh_dsn) as conn:
                (expected,) = conn.execute(
                    "SELECT (((now() AT TIME ZONE 'Europe/Warsaw')::date + 1) + time '22:00')"
                    " AT TIME ZONE 'Europe/Warsaw'"
                ).fetchone()
            assert planned["ok"] and planned["status"] == "QUEUED", planned
            assert datetime.fromisoformat(planned["runAfter"]) == expected, (planned, expected)
            listed = json.loads(run(4))["jobs"]
            assert [(j["jobId"], datetime.fromisoformat(j["runAfter"])) for j in listed] == [
                (job, expected)
            ], listed
            assert datetime.fromisoformat(get()["runAfter"]) == expected
            assert film.rendered == [1, 2, 3]  # not claimed before its time

            # 3. the operator changes their mind: pause (a QUEUED job at once), resume now
            assert json.loads(run(5))["status"] == "PAUSED"
            frame5 = film.hold(5)
            assert json.loads(run(6))["status"] == "QUEUED"
            assert frame5.wait(30), "frame 5 never started"

            # 4. the urgent job arrives while frame 5 renders; the sweeper asks for a yield
            urgent = json.loads(run(7))
            assert urgent["ok"], urgent
            wait_for(
                lambda: (get().get("control") or {}).get("kind") == "yield" or None,
                timeout_s=30,
            )
            assert urgent_svc.started == []  # the cap holds it until the yield commits
            film.release(5)
            wait_for(lambda: urgent_svc.started or None, timeout_s=30, interval_s=0.01)
            film_when_urgent_started = list(film.started)
            wait_for(lambda: get()["status"] == "COMPLETED" or None, timeout_s=60)
            assert get(urgent["jobId"])["status"] == "COMPLETED"
            done = get()
            history = run(8)
        finally:
            sampler.stop.set()
            sampler.join(5)
            surfaces.close()
    # every frame of the film rendered exactly once, resumed from its progress twice
    assert film.started == list(range(1, FRAMES + 1)), film.started
    assert film.rendered == list(range(1, FRAMES + 1)), film.rendered
    assert done["result"]["framesDone"] == FRAMES and done["attempt"] == 1, done
    # the urgent job ran between frame 5 and frame 6 of the film (a frame boundary)
    assert film_when_urgent_started == [1, 2, 3, 4, 5], film_when_urgent_started
    assert urgent_svc.rendered == [1, 2]
    # the GPU was never held by two runs
    assert len(sampler.samples) > 20 and max(sampler.samples) == 1, max(sampler.samples)
    kinds = [t["kind"] for t in json.loads(history)["transitions"]]
    assert kinds == [
        "submit",
        "claim",
        "pause-request",
        "pause",
        "resume",
        "pause",
        "resume",
        "claim",
        "yield-request",
        "yield",
        "claim",
        "complete",
    ], kinds
