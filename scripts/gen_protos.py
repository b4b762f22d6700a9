#!/usr/bin/env python3
"""Regenerate ``protomolt_jobs/pb/`` from every ``.proto`` under ``proto/``.

Usage::

    python scripts/gen_protos.py           # write protomolt_jobs/pb/ (idempotent)
    python scripts/gen_protos.py --check   # exit 1 when the committed modules are stale

Each file gets ``*_pb2.py`` and ``*_pb2.pyi``. No ``*_pb2_grpc.py`` stubs: every service
here is served and called through grpcio's generic handlers and ``channel.unary_unary`` over
the descriptors (the same path the workflow engine uses for any step), so generated servicer
base classes would be dead code. Imports of our own protos are rewritten from ``ai.pipestream...`` to
``protomolt_jobs.pb.ai.pipestream...`` so the generated modules live inside the package while
the descriptors keep their upstream file names (which is what makes them interoperate).
Well-known types (``google/protobuf/*``) come from the protobuf runtime and are not generated.
"""

from __future__ import annotations

import argparse
import difflib
import importlib.resources
import re
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTO_DIR = ROOT / "proto"
PACKAGE = "protomolt_jobs.pb"
OUT_DIR = ROOT / "protomolt_jobs" / "pb"

PB_INIT = '"""Generated protobuf modules (scripts/gen_protos.py). Do not edit by hand."""\n'

# Files this script owns inside OUT_DIR; anything else there is left alone.
_GENERATED_SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py")


def _protoc(args: list[str]) -> None:
    from grpc_tools import protoc

    wkt = str(importlib.resources.files("grpc_tools") / "_proto")
    argv = ["grpc_tools.protoc", f"-I{PROTO_DIR}", f"-I{wkt}", *args]
    code = protoc.main(argv)
    if code != 0:
        raise SystemExit(f"protoc failed (exit {code}): {' '.join(argv)}")


def proto_files() -> list[str]:
    """Every ``.proto`` under ``proto/``, as import paths relative to it, sorted."""
    return sorted(p.relative_to(PROTO_DIR).as_posix() for p in PROTO_DIR.rglob("*.proto"))


def _rewrite_imports(text: str, roots: set[str]) -> str:
    """Point imports of our own generated modules at ``protomolt_jobs.pb``."""
    alternatives = "|".join(re.escape(r) for r in sorted(roots))
    pattern = re.compile(rf"^(\s*)(from|import) ((?:{alternatives})\.)", re.MULTILINE)
    return pattern.sub(rf"\1\2 {PACKAGE}.\3", text)


def generate(dest: Path) -> dict[str, str]:
    """Generate every module into ``dest``; returns ``{relative path: text}`` of what it wrote.

    :param dest: an empty directory standing for ``protomolt_jobs/pb``.
    :raises SystemExit: when protoc rejects a file.
    """
    files = proto_files()
    if not files:
        raise SystemExit(f"no .proto files under {PROTO_DIR}")
    with tempfile.TemporaryDirectory(prefix="pmj-protoc-") as work:
        raw = Path(work) / "out"
        raw.mkdir()
        _protoc([f"--python_out={raw}", f"--pyi_out={raw}", *files])
        roots = {f.split("/", 1)[0] for f in files if "/" in f}
        result: dict[str, str] = {}
        for path in sorted(raw.rglob("*")):
            if not path.is_file():
                continue
            rel = path.relative_to(raw).as_posix()
            result[rel] = _rewrite_imports(path.read_text(), roots)
    # Every directory on the way to a module is a package.
    for rel in list(result):
        parts = rel.split("/")[:-1]
        for i in range(len(parts) + 1):
            init = "/".join([*parts[:i], "__init__.py"])
            result.setdefault(init, "")
    result["__init__.py"] = PB_INIT
    for rel, text in result.items():
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
    return result


def _existing(out: Path) -> dict[str, str]:
    found: dict[str, str] = {}
    if not out.exists():
        return found
    for path in out.rglob("*"):
        if not path.is_file() or "__pycache__" in path.parts:
            continue
        if path.name == "__init__.py" or path.name.endswith(_GENERATED_SUFFIXES):
            found[path.relative_to(out).as_posix()] = path.read_text()
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--check", action="store_true", help="exit 1 when protomolt_jobs/pb/ is stale"
    )
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="pmj-gen-") as tmp:
        fresh = generate(Path(tmp))
    current = _existing(OUT_DIR)
    changed = sorted(rel for rel, text in fresh.items() if current.get(rel) != text)
    stale = sorted(set(current) - set(fresh))
    if args.check:
        if not changed and not stale:
            print(f"protomolt_jobs/pb is up to date ({len(fresh)} files)")
            return 0
        for rel in changed:
            diff = difflib.unified_diff(
                current.get(rel, "").splitlines(keepends=True),
                fresh[rel].splitlines(keepends=True),
                fromfile=f"committed/{rel}",
                tofile=f"generated/{rel}",
                n=1,
            )
            sys.stdout.writelines(list(diff)[:40])
        for rel in stale:
            print(f"stale file (no .proto produces it): protomolt_jobs/pb/{rel}")
        print("protomolt_jobs/pb is stale: run python scripts/gen_protos.py")
        return 1
    for rel in changed:
        target = OUT_DIR / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(fresh[rel])
    for rel in stale:
        (OUT_DIR / rel).unlink()
    print(f"protomolt_jobs/pb: {len(changed)} written, {len(stale)} removed, {len(fresh)} total")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
