"""The CLI's pure rendering helpers (tests/test_doctests.py skips eventlane.cli)."""

from __future__ import annotations

import doctest

from eventlane.cli import render
from eventlane.cli.render import describe_config_value, human_bytes, human_ms


def test_docstring_examples() -> None:
    assert doctest.testmod(render).failed == 0


def test_human_forms() -> None:
    assert human_ms(3_600_000) == "1h" and human_ms(60_000) == "1min" and human_ms(1500) == "1500ms"
    assert human_bytes(0) == "0 B" and human_bytes(5 << 40) == "5120.0 GiB"
    assert describe_config_value("retention_ms", -1) == "-1 (unbounded)"
    assert describe_config_value("segment_bytes", 1024) == "1024 (1.0 KiB)"
    assert describe_config_value("cleanup_policy", "compact") == "compact"
