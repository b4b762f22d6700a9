"""``protomolt-jobs serve`` as a subprocess, driven by ``protomolt-jobs call`` and ``jobs``."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tests.support.grpc_servers import TestServices, seed_workflow
from tests.support.node import node_environ, wait_for

CLI = [sys.executable, "-m", "protomolt_jobs.host.cli"]


class Served:
    """A ``serve`` subprocess; its stdout lines are collected on a thread."""

    def __init__(self, env: dict[str, str], cwd: Path, *args: str) -> None:
        full_env = {k: v for k, v in os.environ.items() if not k.startswith("PROTOMOLT_")}
        full_env.update(env)
        self.proc = subprocess.Popen(
            [*CLI, "serve", *args],
            env=full_env,
            cwd=cwd,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.lines: list[str] = []
        self.stderr = ""
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def wait_ready(self) -> tuple[str, str]:
        def ready():
            if self.proc.poll() is not None:
                raise AssertionError(
                    f"serve exited {self.proc.returncode}: {self.proc.stderr.read()}"
                )
            text = "\n".join(self.lines)
            http = re.search(r"^actions route: (http://\S+)/protomolt/actions$", text, re.MULTILINE)
            grpc = re.search(r"^grpc: (\S+)$", text, re.MULTILINE)
            return http and grpc and (http.group(1), grpc.group(1))

        return wait_for(ready, timeout_s=60)

    def stop(self, sig: int = signal.SIGTERM) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            code = self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise
        self.stderr = self.proc.stderr.read()
        return code


def cli(*args: str, env: dict[str, str] | None = None, stdin: str | None = None):
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("PROTOMOLT_")}
    full_env.update(env or {})
    return subprocess.run(
        [*CLI, *args],
        check=False,
        env=full_env,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
    )


def call(url: str, verb: str, envelope: dict | str, *extra: str):
    text = envelope if isinstance(envelope, str) else json.dumps(envelope)
    return cli("call", verb, text, "--url", url, *extra)


@pytest.fixture
def services():
    with TestServices(max_workers=16) as s:
        yield s


@pytest.fixture
def served(tmp_path, fresh_dsn):
    node = Served(node_environ(tmp_path / "data", fresh_dsn), tmp_path)
    try:
        yield node, *node.wait_ready()
    finally:
        code = node.stop()
        assert code == 0, node.stderr


def test_serve_prints_its_surfaces_and_the_kafka_lanes_off_then_stops_on_sigterm(
    tmp_path, fresh_dsn
):
    node = Served(node_environ(tmp_path / "data", fresh_dsn), tmp_path)
    url, target = node.wait_ready()
    assert re.fullmatch(r"http://127\.0\.0\.1:\d+", url)
    assert re.fullmatch(r"127\.0\.0\.1:\d+", target)
    assert not url.endswith(":0") and not target.endswith(":0")
    assert any("Kafka lanes are off" in line for line in node.lines)
    assert not any("embedded PostgreSQL" in line for line in node.lines)
    assert cli("verbs", "--url", url).returncode == 0
    assert node.stop(signal.SIGTERM) == 0
    assert node.lines[-1] == "stopped"


def test_sigint_stops_cleanly_too(tmp_path, fresh_dsn):
    node = Served(node_environ(tmp_path / "data", fresh_dsn), tmp_path)
    node.wait_ready()
    assert node.stop(signal.SIGINT) == 0
    assert "Traceback" not in node.stderr


def test_seed_lifecycle_through_call(served, services):
    _, url, _ = served
    verbs = cli("verbs", "--url", url)
    assert verbs.returncode == 0
    for verb in ("submit-workflow", "get-job", "list-jobs", "complete-step"):
        assert verb in verbs.stdout

    put = subprocess.run(
        [
            "curl",
            "-sS",
            "-X",
            "PUT",
            "--data-binary",
            json.dumps(seed_workflow(services.target)),
            f"{url}/protomolt/workflows/seed-review",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    stored = json.loads(put.stdout)
    assert (stored["name"], stored["version"], stored["tests"]["ok"]) == ("seed-review", 1, False)

    sub = call(url, "submit-workflow", {"workflowName": "seed-review", "input": {"text": "a b c"}})
    assert sub.returncode == 0, sub.stderr
    answer = json.loads(sub.stdout)
    assert answer["ok"] is True
    job_id = answer["jobId"]

    def status():
        got = call(url, "get-job", {"jobId": job_id})
        assert got.returncode == 0, got.stderr
        return json.loads(got.stdout)["job"]

    parked = wait_for(lambda: (j := status())["status"] == "WAITING" and j)
    assert parked["outstandingStep"] == "review"

    listed = call(url, "list-jobs", {"status": "WAITING"})
    assert [j["jobId"] for j in json.loads(listed.stdout)["jobs"]] == [job_id]
    table = cli("jobs", "list", "--url", url)
    assert table.returncode == 0 and "WAITING" in table.stdout
    assert cli("jobs", "get", job_id, "--url", url).returncode == 0

    done = call(
        url,
        "complete-step",
        {"jobId": job_id, "stepName": "review", "response": {"approved": True, "note": "fine"}},
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"ok": True, "status": "QUEUED"}
    final = wait_for(lambda: (j := status())["status"] == "COMPLETED" and j)
    assert [c["name"] for c in final["checkpoints"]] == ["tokenize", "embed", "review"]

    watch = cli("jobs", "watch", "--count", "2", "--interval", "0.1", "--url", url)
    assert watch.returncode == 0 and "COMPLETED" in watch.stdout


def test_jobs_retry_only_runs_the_named_step_alone(served, services):
    # issue 27 item 3 through the CLI: `jobs retry ID --step b --only` on a COMPLETED graph
    # run calls b once more and nothing else; the history records the scope.
    from tests.integration.test_retry_scope import chain_graph

    _, url, _ = served
    sub = call(url, "submit-workflow", {"workflow": chain_graph(services.target), "input": {}})
    job_id = json.loads(sub.stdout)["jobId"]

    def status():
        return json.loads(call(url, "get-job", {"jobId": job_id}).stdout)["job"]["status"]

    wait_for(lambda: status() == "COMPLETED")
    retried = cli("jobs", "retry", job_id, "--step", "b", "--only", "--url", url)
    assert retried.returncode == 0, retried.stderr
    answer = json.loads(retried.stdout)
    assert (answer["ok"], answer["scope"], answer["dropped"]) == (True, "only", ["b"])
    wait_for(lambda: status() == "COMPLETED")
    assert {n: services.step_calls(n) for n in "abcd"} == {"a": 1, "b": 2, "c": 1, "d": 1}
    history = json.loads(cli("jobs", "history", job_id, "--json", "--url", url).stdout)
    (retry,) = [t for t in history["transitions"] if t["kind"] == "retry-step"]
    assert (retry["step"], retry["reason"]) == ("b", "scope only")


def _parked_job(url: str, services) -> str:
    """A seed job submitted inline through ``call``, once it is WAITING on review."""
    sub = call(
        url,
        "submit-workflow",
        {"workflow": seed_workflow(services.target), "input": {"text": "a b c"}},
    )
    assert sub.returncode == 0, sub.stderr
    job_id = json.loads(sub.stdout)["jobId"]

    def waiting():
        return json.loads(call(url, "get-job", {"jobId": job_id}).stdout)["job"]["status"]

    wait_for(lambda: waiting() == "WAITING")
    return job_id


BRACKETS = "every sink [effect, fix]: required"


def test_stored_text_is_printed_literally_not_as_markup(served, services):
    """Issue 31: square brackets in a stored error or reason are not swallowed as rich markup
    (``every sink [effect, fix]: required`` printed as ``every sink : required``)."""
    _, url, _ = served
    job_id = _parked_job(url, services)
    cancelled = cli("jobs", "cancel", job_id, "--reason", BRACKETS, "--url", url)
    assert cancelled.returncode == 0 and json.loads(cancelled.stdout)["status"] == "CANCELLED"
    wide = {"COLUMNS": "200"}
    listed = cli("jobs", "list", "--url", url, env=wide)
    assert listed.returncode == 0, listed.stderr
    assert f"CANCELLED by anonymous: {BRACKETS}" in listed.stdout, listed.stdout
    history = cli("jobs", "history", job_id, "--url", url, env=wide)
    assert history.returncode == 0, history.stderr
    assert BRACKETS in history.stdout, history.stdout


def test_jobs_list_fits_80_columns_with_short_ids_and_compact_times(served, services):
    """Issue 31: at COLUMNS=80 no line of ``jobs list`` is longer than 80 characters (it was a
    UUID folded over four lines and times cut to ``2026-12-...``); the id is its first 8
    characters, the time ``HH:MM:SS`` (UTC, today), the error cut with an ellipsis but never
    read as markup; ``--json`` has every value whole."""
    _, url, _ = served
    job_id = _parked_job(url, services)
    other = _parked_job(url, services)
    cli("jobs", "cancel", job_id, "--reason", "[effect, fix]", "--url", url)
    narrow = {"COLUMNS": "80"}
    listed = cli("jobs", "list", "--url", url, env=narrow)
    assert listed.returncode == 0, listed.stderr
    lines = listed.stdout.splitlines()
    assert max(len(line) for line in lines) <= 80, listed.stdout
    assert job_id not in listed.stdout and other not in listed.stdout
    (waiting,) = [line for line in lines if line.startswith(other[:8])]
    assert "WAITING" in waiting and "review" in waiting, waiting
    assert re.search(r"  \d\d:\d\d:\d\d  ", waiting), waiting
    # Alone in the list (no step column), the error's start shows, its bracket kept.
    only = cli("jobs", "list", "--status", "CANCELLED", "--url", url, env=narrow).stdout
    assert max(len(line) for line in only.splitlines()) <= 80, only
    (row,) = [line for line in only.splitlines() if line.startswith(job_id[:8])]
    assert "CANCELLED by anonymous: [eff" in row, row
    whole = json.loads(cli("jobs", "list", "--json", "--url", url, env=narrow).stdout)
    cancelled = next(j for j in whole["jobs"] if j["jobId"] == job_id)
    assert cancelled["error"] == "CANCELLED by anonymous: [effect, fix]"
    assert cancelled["updatedAt"].endswith("Z")


def test_jobs_get_takes_a_unique_id_prefix_and_names_the_candidates_of_another(served, services):
    """Issue 31: ``jobs get 38ff9f29`` (the dashboard's short id) is the job when one id starts
    with it; when several do it is a usage error naming them; the other job commands too."""
    _, url, _ = served
    ids = [f"38ff9f29-0000-4000-8000-00000000000{i}" for i in (1, 2)] + [
        "38ff0000-0000-4000-8000-000000000003"
    ]
    for job_id in ids:
        sub = call(
            url,
            "submit-workflow",
            {"workflow": seed_workflow(services.target), "input": {"text": "a"}, "jobId": job_id},
        )
        assert json.loads(sub.stdout)["ok"] is True, sub.stdout
    got = cli("jobs", "get", "38ff0000", "--url", url)
    assert got.returncode == 0, got.stderr
    assert json.loads(got.stdout)["job"]["jobId"] == ids[2]
    ambiguous = cli("jobs", "get", "38ff9f29", "--url", url)
    assert ambiguous.returncode == 2
    assert "starts several job ids" in ambiguous.stderr
    assert ids[0] in ambiguous.stderr and ids[1] in ambiguous.stderr
    assert ids[2] not in ambiguous.stderr
    by_longer = cli("jobs", "get", "38FF9F29000040008000000000000002", "--url", url)
    assert json.loads(by_longer.stdout)["job"]["jobId"] == ids[1]
    none = cli("jobs", "get", "0badcafe", "--url", url)
    assert none.returncode == 2 and "no job id starts with '0badcafe'" in none.stderr
    history = cli("jobs", "history", "38ff0000", "--json", "--url", url)
    assert json.loads(history.stdout)["jobId"] == ids[2]
    # Not a prefix: passed on as given, and the verb refuses it.
    refused = cli("jobs", "get", "not-a-uuid", "--url", url)
    assert refused.returncode == 2 and "invalid-input" in refused.stderr


def test_call_exit_codes(served):
    _, url, _ = served
    not_found = call(url, "get-job", {"jobId": "00000000-0000-0000-0000-000000000001"})
    assert not_found.returncode == 0
    assert json.loads(not_found.stdout)["ok"] is False

    bad_input = call(url, "get-job", {"jobId": "nope"})
    assert bad_input.returncode == 1
    assert bad_input.stderr.startswith("invalid-input: ")

    assert call(url, "no-such-verb", {}).returncode == 2
    assert call(url, "get-job", "[1, 2]").returncode == 2
    assert call(url, "get-job", "{oops").returncode == 2
    assert cli("call").returncode == 2
    from_stdin = cli("call", "list-jobs", "-", "--url", url, stdin="{}")
    assert from_stdin.returncode == 0 and json.loads(from_stdin.stdout)["ok"] is True


def test_jobs_exits_2_on_invalid_input_where_call_exits_1(served, services):
    """README *Exit codes*: the same refused field is a usage error of ``jobs`` (2) and an
    action error of ``call`` (1); an answer, ``ok: false`` included, is 0 through both; an
    error envelope other than invalid-input, or no node, is 1 through both."""
    _, url, _ = served
    job_id = _parked_job(url, services)
    # the verb refuses 'artifactId' (not a UUID): jobs 2, call 1, the same message
    through_jobs = cli("jobs", "promote", "nope", "--reason", "x", "--url", url)
    assert through_jobs.returncode == 2, through_jobs.stderr
    assert through_jobs.stderr.startswith("invalid-input: ")
    through_call = call(url, "promote-artifact", {"artifactId": "nope", "reason": "x"})
    assert through_call.returncode == 1, through_call.stderr
    assert through_call.stderr == through_jobs.stderr
    # a refused option value of a control command: 2
    stuck = cli("jobs", "resume", job_id, "--at", "next tuesday", "--url", url)
    assert stuck.returncode == 2 and stuck.stderr.startswith("invalid-input: "), stuck.stderr
    # a response that is not JSON never leaves the command line: 2
    local = cli(
        "jobs", "reconcile", job_id, "--step", "review", "--outcome", "done",
        "--response", "{oops", "--url", url,
    )  # fmt: skip
    assert local.returncode == 2 and "--response is not JSON" in local.stderr
    # an answer, ok: false included: 0 through both
    missing = "00000000-0000-0000-0000-000000000001"
    refused = cli("jobs", "cancel", missing, "--url", url)
    assert refused.returncode == 0 and json.loads(refused.stdout)["ok"] is False
    assert call(url, "cancel-job", {"jobId": missing}).returncode == 0
    # no node: 1 through both
    for argv in (("jobs", "list"), ("call", "list-jobs", "{}")):
        gone = cli(*argv, "--url", "http://127.0.0.1:1")
        assert gone.returncode == 1 and "cannot reach the node" in gone.stderr, argv


def test_a_reader_that_goes_away_is_not_a_traceback(served):
    """`protomolt-jobs call ... | head` closes the pipe early: a quiet exit, no traceback."""
    _, url, _ = served
    env = {k: v for k, v in os.environ.items() if not k.startswith("PROTOMOLT_")}
    proc = subprocess.Popen(
        [*CLI, "call", "list-jobs", "{}", "--url", url],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )
    proc.stdout.close()  # the reader is gone before the answer is printed
    _, err = proc.communicate(timeout=60)
    assert b"Traceback" not in err, err.decode()
    assert proc.returncode == 0


def test_an_unreachable_node_is_exit_1():
    result = cli("call", "list-jobs", "{}", "--url", "http://127.0.0.1:1")
    assert result.returncode == 1
    assert "cannot reach the node" in result.stderr


def test_token_on_serve_and_call(tmp_path, fresh_dsn):
    node = Served(node_environ(tmp_path / "data", fresh_dsn, token="t0k"), tmp_path)
    try:
        url, _ = node.wait_ready()
        refused = call(url, "list-jobs", {})
        assert refused.returncode == 1
        assert refused.stderr.startswith("unauthenticated: ")
        assert call(url, "list-jobs", {}, "--token", "t0k").returncode == 0
        assert (
            cli(
                "call", "list-jobs", "{}", "--url", url, env={"PROTOMOLT_API_TOKEN": "t0k"}
            ).returncode
            == 0
        )
        # Issue 31: options before, between or after the positional arguments.
        envelope = '{"limit": 1}'
        for argv in (
            ("call", "list-jobs", "--token", "t0k", "--url", url, envelope),
            ("call", "--token", "t0k", "list-jobs", "--url", url, envelope),
            ("call", "list-jobs", "--token", "t0k", envelope, "--url", url),
            ("jobs", "list", "--token", "t0k", "--json", "--url", url),
        ):
            done = cli(*argv)
            assert done.returncode == 0, (argv, done.stderr)
            assert json.loads(done.stdout)["ok"] is True, argv
        unknown = cli("call", "list-jobs", "--token", "t0k", envelope, "--url", url, "--nope")
        assert unknown.returncode == 2 and "--nope" in unknown.stderr
        # an error envelope other than invalid-input is 1 through jobs too (README Exit codes)
        unauthenticated = cli("jobs", "list", "--url", url)
        assert unauthenticated.returncode == 1
        assert unauthenticated.stderr.startswith("unauthenticated: ")
    finally:
        assert node.stop() == 0


def test_a_bad_config_is_exit_2(tmp_path):
    config = tmp_path / "protomolt.toml"
    config.write_text('[node]\nhttp_port = "eighty"\n')
    result = cli("serve", "--config", str(config))
    assert result.returncode == 2
    assert "http_port" in result.stderr


def test_config_file_is_read(tmp_path, fresh_dsn):
    config = tmp_path / "protomolt.toml"
    config.write_text(
        "[node]\n"
        'roles = ["registry", "jobs"]\n'
        f'data_dir = "{tmp_path / "cfgdata"}"\n'
        "http_port = 0\n"
        "grpc_port = 0\n"
        "[jobs]\n"
        f'dsn = "{fresh_dsn}"\n'
    )
    node = Served({}, tmp_path, "--config", str(config))
    try:
        node.wait_ready()
        assert any(line.startswith("roles: registry, jobs") for line in node.lines)
        assert (tmp_path / "cfgdata" / "workflows").is_dir()
    finally:
        assert node.stop() == 0


def test_serve_without_a_dsn_runs_on_the_embedded_postgresql_and_stops_it(open_data_dir):
    data = open_data_dir / "data"
    node = Served(node_environ(data, None), open_data_dir)
    try:
        url, _ = node.wait_ready()
        note = next(line for line in node.lines if line.startswith("embedded PostgreSQL: "))
        assert str(data / "pg") in note
        listed = call(url, "list-jobs", {})
        assert listed.returncode == 0 and json.loads(listed.stdout) == {"ok": True, "jobs": []}
        pid = int((data / "pg" / "postmaster.pid").read_text().split()[0])
    finally:
        assert node.stop() == 0, node.stderr
    # The library's own INFO lines (each pg_ctl command line and its output) stay out.
    assert "Running commandline" not in node.stderr, node.stderr[:2000]

    def gone():
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        return False

    wait_for(gone, timeout_s=30)
    assert json.loads((data / "pg" / ".handle_pids.json").read_text()) == []


def _postgres_processes_of(pgdata: Path) -> list[int]:
    """Pids of live processes whose command line names ``pgdata`` (the postmaster carries
    ``-D <pgdata>``; its children are found through their parent)."""
    found: list[int] = []
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
        if str(pgdata) in cmdline and "postgres" in cmdline:
            found.append(int(entry.name))
    children = [pid for pid, ppid in parents.items() if ppid in found]
    return sorted(set(found) | set(children))


def test_sighup_stops_serve_cleanly_and_its_embedded_postgresql(open_data_dir):
    data = open_data_dir / "data"
    node = Served(node_environ(data, None), open_data_dir)
    try:
        node.wait_ready()
        pid = int((data / "pg" / "postmaster.pid").read_text().split()[0])
        assert pid in _postgres_processes_of(data / "pg")
    finally:
        code = node.stop(signal.SIGHUP)
    assert code == 0, node.stderr
    assert node.lines[-2:] == ["stopping", "stopped"]
    wait_for(lambda: _postgres_processes_of(data / "pg") == [], timeout_s=30)


def test_sighup_stops_the_demo_cleanly_and_its_embedded_postgresql(open_data_dir):
    from protomolt_jobs.host.demo import samples_dir

    data = open_data_dir / "data"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PROTOMOLT_")}
    proc = subprocess.Popen(
        [*CLI, "demo", str(samples_dir() / "leases.md"), "--data-dir", str(data)],
        env=env,
        cwd=open_data_dir,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True).start()
    try:
        # The one job parks on the external review: the demo then serves until stopped.
        wait_for(lambda: any("parked on the external" in line for line in lines), timeout_s=120)
        assert _postgres_processes_of(data / "pg")
        proc.send_signal(signal.SIGHUP)
        code = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    # Not killed by the signal: it stopped, said so, and answered "not every job completed".
    assert code == 1, proc.stderr.read()
    assert any(line.strip() == "interrupted" for line in lines)
    wait_for(lambda: _postgres_processes_of(data / "pg") == [], timeout_s=30)
