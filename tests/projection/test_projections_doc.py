"""docs/projections.md: its ```python blocks run, in file order, in one module namespace;
and every projection command of the CLI appears in it."""

from __future__ import annotations

import re
import sys
import types
from pathlib import Path

DOC = Path(__file__).parents[2] / "docs" / "projections.md"


def test_projections_doc_examples_run() -> None:
    blocks = re.findall(r"^```python\n(.*?)^```", DOC.read_text(), flags=re.S | re.M)
    assert len(blocks) >= 12
    # A real module, so typing.get_type_hints (used by cattrs) can resolve the doc's names.
    module = types.ModuleType("projections_doc")
    sys.modules[module.__name__] = module
    try:
        for number, block in enumerate(blocks, 1):
            # dont_inherit: this file's `from __future__ import annotations` must not leak in.
            code = compile(block, f"{DOC}:block{number}", "exec", dont_inherit=True)
            exec(code, module.__dict__)
    finally:
        del sys.modules[module.__name__]


def test_every_projection_command_is_documented() -> None:
    text = DOC.read_text()
    for command in (
        "eventlane project run",
        "eventlane project status",
        "eventlane migrate",
        "eventlane dlq list",
        "eventlane dlq show",
        "eventlane dlq retry",
    ):
        assert command in text, command
