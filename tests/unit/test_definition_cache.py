"""The claim's decode cache of stored definitions (``records.decoded_definition``) and the
parsed workflow kept by a shared definition's identity (``StoredRun.load``)."""

from __future__ import annotations

import json
import threading
import uuid
from datetime import UTC, datetime
from types import SimpleNamespace

from protomolt_jobs.runs.stored_run import StoredRun
from protomolt_jobs.store import records
from protomolt_jobs.store.records import JobRecord, decoded_definition, is_shared_definition
from protomolt_jobs.workflow import Runtime
from tests.support.grpc_servers import seed_workflow


def _text(definition: dict) -> str:
    return json.dumps(definition)


def test_the_same_text_decodes_once_to_one_shared_object():
    text = _text({"name": "cache-once", "steps": [{"name": "a"}]})
    first, problem = decoded_definition(text)
    assert problem is None and first == json.loads(text)
    again, _ = decoded_definition("".join(list(text)))  # an equal text, another object
    assert again is first and is_shared_definition(first)
    assert not is_shared_definition(json.loads(text))


def test_a_text_differing_only_in_the_middle_never_hits():
    pad = "x" * 600  # both ends (the slot) and the length are the same
    a = '{"p": "' + pad + '", "k": "aaaa", "q": "' + pad + '"}'
    b = '{"p": "' + pad + '", "k": "bbbb", "q": "' + pad + '"}'
    assert len(a) == len(b) and a[:256] == b[:256] and a[-256:] == b[-256:]
    va, _ = decoded_definition(a)
    vb, _ = decoded_definition(b)
    assert va["k"] == "aaaa" and vb["k"] == "bbbb"
    assert decoded_definition(a)[0]["k"] == "aaaa"


def test_unreadable_or_wrong_shape_texts_answer_as_from_row_and_are_not_kept():
    for text in ("{broken", "[1, 2]", '"s"'):
        value, problem = decoded_definition(text)
        assert value is None and problem
        assert decoded_definition(text) == (value, problem)
    row_problem = JobRecord.from_row(_row("{broken"), shared_definition=True).unreadable
    assert row_problem == JobRecord.from_row(_row("{broken")).unreadable
    assert row_problem.startswith("workflow_definition: JSONDecodeError")


def test_the_cache_is_bounded_and_forgets_the_least_recently_used():
    texts = [_text({"name": f"bounded-{i}"}) for i in range(records.DEFINITION_CACHE_SIZE + 5)]
    values = [decoded_definition(t)[0] for t in texts]
    assert len(records._definitions) <= records.DEFINITION_CACHE_SIZE
    assert len(records._shared) == len(records._definitions)
    assert not is_shared_definition(values[0])  # evicted first
    assert is_shared_definition(values[-1])
    fresh, _ = decoded_definition(texts[0])
    assert fresh is not values[0] and fresh == values[0]


def test_the_cache_holds_at_most_its_characters(monkeypatch):
    monkeypatch.setattr(records, "DEFINITION_CACHE_CHARS", 3000)
    big = _text({"name": "too-big", "pad": "x" * 4000})
    value, _ = decoded_definition(big)
    assert value["name"] == "too-big" and not is_shared_definition(value)
    kept = [
        decoded_definition(_text({"name": f"chars-{i}", "pad": "y" * 900}))[0] for i in range(5)
    ]
    assert records._cached_chars <= 3000
    assert records._cached_chars == sum(len(t) for t, _ in records._definitions.values())
    assert is_shared_definition(kept[-1]) and not is_shared_definition(kept[0])


def test_concurrent_decodes_of_one_text_agree():
    text = _text({"name": "threads", "steps": list(range(200))})
    got: list[object] = []

    def decode() -> None:
        for _ in range(200):
            got.append(decoded_definition(text)[0])

    threads = [threading.Thread(target=decode) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(v == json.loads(text) for v in got)
    assert len(records._shared) == len(records._definitions)


def test_from_row_shares_only_when_asked():
    text = _text({"name": "ask"})
    shared = JobRecord.from_row(_row(text), shared_definition=True).workflow_definition
    own = JobRecord.from_row(_row(text)).workflow_definition
    assert shared == own and shared is not own
    assert JobRecord.from_row(_row(text), shared_definition=True).workflow_definition is shared


def test_a_shared_definition_is_parsed_once_per_runtime_and_others_as_always():
    definition = seed_workflow("127.0.0.1:1")
    text = _text(definition)
    runtime, other = Runtime(), Runtime()
    shared = JobRecord.from_row(_row(text), shared_definition=True)
    first = StoredRun.load(shared, runtime, verified=True).workflow
    assert StoredRun.load(shared, runtime).workflow is first
    assert StoredRun.load(shared, other).workflow is not first  # its own runtime's parse
    plain = StoredRun.load(SimpleNamespace(workflow_definition=json.loads(text)), runtime)
    assert plain.workflow is first  # parse_workflow's own cache, by canonical text


def _row(definition_text: str) -> dict:
    now = datetime.now(UTC)
    return {
        "job_id": uuid.uuid4(),
        "workflow_name": "wf",
        "workflow_definition": definition_text,
        "input": "{}",
        "status": "RUNNING",
        "attempt": 1,
        "max_attempts": 3,
        "run_after": now,
        "outstanding_step": None,
        "checkpoints": "[]",
        "result": None,
        "verdict": None,
        "error": None,
        "lease_owner": "w",
        "lease_token": uuid.uuid4(),
        "lease_until": now,
        "created_at": now,
        "updated_at": now,
        "completed_at": None,
    }
