"""docs/aggregates.md: its ```python blocks run, in file order, in one module namespace."""

from __future__ import annotations

import re
import sys
import types
from pathlib import Path

DOC = Path(__file__).parents[2] / "docs" / "aggregates.md"


def test_aggregates_doc_examples_run() -> None:
    blocks = re.findall(r"^```python\n(.*?)^```", DOC.read_text(), flags=re.S | re.M)
    assert len(blocks) >= 10
    # A real module, so typing.get_type_hints (used by cattrs and snapshots) resolves names.
    module = types.ModuleType("aggregates_doc")
    sys.modules[module.__name__] = module
    try:
        for number, block in enumerate(blocks, 1):
            # dont_inherit: this file's `from __future__ import annotations` must not leak in.
            code = compile(block, f"{DOC}:block{number}", "exec", dont_inherit=True)
            exec(code, module.__dict__)
    finally:
        del sys.modules[module.__name__]
        workdir = module.__dict__.get("workdir")
        if workdir is not None:
            workdir.cleanup()
