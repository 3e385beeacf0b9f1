"""The test tree's own invariants.

pytest imports a test module of a directory without ``__init__.py`` under its bare basename
("prepend" import mode), and test modules import their directory's helpers the same way
(``from console_helpers import ...``): two such modules with one name in different
directories break the collection of the *whole* suite, or silently import the other
directory's helper. This happened twice; this test names the clash instead.
"""

from __future__ import annotations

import re
from collections import defaultdict
from pathlib import Path

TESTS = Path(__file__).resolve().parent
IMPORT = re.compile(r"^(?:from|import)\s+(\w+)", re.MULTILINE)


def import_name(path: Path) -> str:
    """The name pytest (or a sibling's ``import``) gives the module: qualified by the packages
    (directories with ``__init__.py``) it sits in, bare otherwise."""
    parts = [path.stem]
    parent = path.parent
    while (parent / "__init__.py").exists():
        parts.insert(0, parent.name)
        parent = parent.parent
    return ".".join(parts)


def test_modules_imported_by_name_have_unique_names() -> None:
    files = [p for p in TESTS.rglob("*.py") if "__pycache__" not in p.parts]
    imported = {m for p in files for m in IMPORT.findall(p.read_text(encoding="utf-8"))}
    seen: dict[str, list[str]] = defaultdict(list)
    for path in files:
        if path.name == "conftest.py":
            continue
        name = import_name(path)
        if path.name.startswith("test_") or name in imported:
            seen[name].append(str(path.relative_to(TESTS)))
    clashes = {name: paths for name, paths in seen.items() if len(paths) > 1}
    assert not clashes, f"module names used twice under tests/ (rename one): {clashes}"
    assert "test_layout" in seen and "console_helpers" in seen  # the scan sees both kinds
