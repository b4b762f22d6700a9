"""workflow/keys.py's table held to what it describes: every key docs/workflows.md documents
is known and every known key is documented, the guide's definitions hold only known keys,
its *Unknown keys* example is what the check says, and every key of upstream's typed envelope
(host/upstream_service.py) is known."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

import pytest
from google.protobuf import descriptor as _d
from google.protobuf import json_format
from google.protobuf.message import Message

from protomolt_jobs.workflow import keys

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "workflows.md"
TARGET = "127.0.0.1:9"  # never called


def step(**extra: Any) -> dict[str, Any]:
    return {"name": "s", "target": TARGET, "method": "p.S/M", **extra}


# -- docs/workflows.md ----------------------------------------------------------------------------


def _json_blocks() -> list[tuple[int, Any]]:
    """``(line, value)`` of every ```json block of the guide; a fragment (``"output": {...}``)
    is read as the object holding it."""
    text = GUIDE.read_text(encoding="utf-8")
    out = []
    for match in re.finditer(r"```json\n(.*?)```", text, re.DOTALL):
        body = match.group(1).strip()
        line = text.count("\n", 0, match.start()) + 1
        out.append((line, json.loads(body if body.startswith("{") else "{" + body + "}")))
    return out


def _kind_of(value: dict[str, Any]) -> str | None:
    """The object kind a guide block is an example of, by its keys."""
    for kind in ("workflow", "step"):
        if set(value) <= keys.KINDS[kind].known:
            return kind
    return None


def test_every_definition_in_the_guide_has_only_known_keys():
    checked = 0
    for line, value in _json_blocks():
        kind = _kind_of(value)
        if kind is None:
            # the one block that is not a definition: check-workflow's simulation answer
            assert {"runs", "skipped", "notRun", "criterion"} <= set(value), line
            continue
        found = [u.message for u in keys._walk(value, keys.KINDS[kind], "", "")]
        assert found == [], f"docs/workflows.md line {line}: {found}"
        checked += 1
    assert checked == 12


def _guide_table_keys(heading: str) -> set[str]:
    text = GUIDE.read_text(encoding="utf-8")
    section = text.split(heading, 1)[1].split("\n### ", 1)[0]
    out: set[str] = set()
    for row in re.findall(r"^\| (`[^|]*`) \|", section, re.MULTILINE):
        out.update(re.findall(r"`([A-Za-z]+)`", row))
    return out


@pytest.mark.parametrize(
    ("heading", "kind"),
    [("### Workflow keys", "workflow"), ("### Step keys", "step"), ("### Budgets", "budget")],
)
def test_the_guides_key_tables_are_the_tables_keys(heading, kind):
    documented = _guide_table_keys(heading)
    assert documented == set(keys.known_keys(kind))


def test_every_known_key_is_documented_in_the_guide():
    text = GUIDE.read_text(encoding="utf-8")
    for kind in keys.KINDS.values():
        for key in kind.keys:
            assert f"`{key}`" in text or f'"{key}"' in text, f"{kind.name}.{key} is undocumented"


def test_the_guides_unknown_keys_example_is_what_check_workflow_says():
    text = GUIDE.read_text(encoding="utf-8")
    section = text.split("### Unknown keys", 1)[1]
    block = re.search(r"```\n(.*?)```", section, re.DOTALL).group(1)
    lines = [line.strip() for line in block.strip().splitlines()]
    assert lines[0] == "workflow.json: 2 findings"
    workflow = next(v for _, v in _json_blocks() if v.get("name") == "greet-and-shout")
    workflow = {"maxParalel": 2, **copy.deepcopy(workflow)}  # as written at the top of a file
    workflow["steps"][1]["whn"] = "true"
    shown = [f"{f.step or '(workflow)'}: [{f.kind}] {f.error}" for f in keys.findings(workflow)]
    assert lines[1:] == shown
    quotes = re.findall(r"`([^`]*(?:not of|has the keys)[^`]*)`", section)
    assert len(quotes) == 3
    for quoted in quotes:
        # the prose quotes a message's words, shortened with "..." at either end
        words = " ".join(quoted.split()).removeprefix("... ").removesuffix(", ...")
        assert words in _messages_of_the_guides_cases(), quoted


def _messages_of_the_guides_cases() -> str:
    return " | ".join(
        u.message
        for u in keys.unknown_keys(
            {"priority": 2, "steps": [step(maxAtempts=3, colour=1)]}  # the guide's prose cases
        )
    )


# -- upstream's envelope stays accepted -----------------------------------------------------------


def _filled(message: Message, depth: int = 0) -> Message:
    """Set every field of ``message`` (and of its messages, recursively) to a non-default
    value, so its proto3 JSON holds every key upstream's typed envelope has."""
    for field in message.DESCRIPTOR.fields:
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            getattr(message, field.name)["k.proto"] = "v"
        elif field.type == _d.FieldDescriptor.TYPE_MESSAGE:
            if field.message_type.full_name.startswith("google.protobuf.") or depth > 4:
                continue
            target = (
                getattr(message, field.name).add()
                if field.is_repeated
                else getattr(message, field.name)
            )
            _filled(target, depth + 1)
        else:
            value: Any = {
                _d.FieldDescriptor.TYPE_STRING: "x",
                _d.FieldDescriptor.TYPE_BOOL: True,
            }.get(field.type, 1)
            if field.is_repeated:
                getattr(message, field.name).append(value)
            else:
                setattr(message, field.name, value)
    return message


def test_every_key_of_upstreams_typed_envelope_is_known():
    from protomolt_jobs.host.upstream_service import alias_classes

    envelope = json_format.MessageToDict(_filled(alias_classes()["CompiledWorkflow"]()))
    # the walk saw every kind upstream has (so the test cannot pass by walking nothing)
    assert set(envelope) == {"name", "schema", "inputType", "deadlineMs", "steps", "output"}
    assert {"structured", "edge", "fanOut", "celRules"} <= set(envelope["steps"][0])
    assert list(keys.unknown_keys(envelope)) == []
