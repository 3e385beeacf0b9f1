"""The docs are tested: their examples run, and every CLI command and option is documented.

* Every fenced block opened with exactly ```` ```python ```` in every ``docs/*.md`` file (and
  the README) runs,
  in file order, in one fresh module namespace per file, with a temporary working directory
  and ``tempfile`` pointed into it. Use another fence (```` ```pycon ````, ```` ```text ````)
  for code that must not run.
* ``docs/cli.md`` has a section (a heading quoting ``eventlane <command path>``) for every
  command of the framework's click tree, and each section names every option of its command
  and its arguments. ``--data``, accepted by every command, is documented once, with the
  root. Commands that installed applications contribute through entry points (e.g. the
  example apps' ``eventlane invoicing``) are documented by those applications.
"""

from __future__ import annotations

import re
import sys
import tempfile
import types
from pathlib import Path

import click
import pytest
import structlog

from eventlane.cli import main

DOCS = Path(__file__).resolve().parents[1] / "docs"
FENCE = re.compile(r"^```python[ \t]*\n(.*?)^```[ \t]*$", re.S | re.M)
HEADING = re.compile(r"^(#{1,6})\s+(.*)$", re.M)


def doc_files() -> list[Path]:
    return [*sorted(DOCS.glob("*.md")), DOCS.parent / "README.md"]


def python_blocks(path: Path) -> list[tuple[int, str]]:
    """``(line number, code)`` of each ```python block of ``path``."""
    text = path.read_text(encoding="utf-8")
    return [(text.count("\n", 0, m.start()) + 2, m.group(1)) for m in FENCE.finditer(text)]


@pytest.mark.parametrize("path", doc_files(), ids=lambda p: p.name)
def test_python_examples_run(path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.delenv("EVENTLANE_DATA", raising=False)
    saved_logging = structlog.get_config() if structlog.is_configured() else None
    # A real module, so typing.get_type_hints (cattrs, attrs) resolves the doc's own names.
    module = types.ModuleType(f"docs_{path.stem.replace('-', '_')}")
    module.__file__ = str(path)
    sys.modules[module.__name__] = module
    try:
        for line, code in python_blocks(path):
            # dont_inherit: this file's `from __future__ import annotations` must not leak in.
            compiled = compile(code, f"{path}:{line}", "exec", dont_inherit=True)
            exec(compiled, module.__dict__)
    finally:
        del sys.modules[module.__name__]
        # Configuring the saved defaults would mark structlog configured (a later test's
        # debug lines on stdout): an unconfigured structlog is restored as unconfigured.
        if saved_logging is None:
            structlog.reset_defaults()
        else:
            structlog.configure(**saved_logging)


def test_every_doc_with_examples_is_found() -> None:
    names = {p.name for p in doc_files() if python_blocks(p)}
    assert {"log.md", "file-format.md", "architecture.md", "README.md", "api.md"} <= names


# ---------------------------------------------------------------------------- CLI coverage
def commands(
    group: click.Group, path: tuple[str, ...] = ()
) -> list[tuple[tuple[str, ...], click.Command]]:
    """Every framework command under ``group`` with its path, groups included, depth first."""
    out: list[tuple[tuple[str, ...], click.Command]] = []
    ctx = click.Context(group)
    for name in group.list_commands(ctx):  # the root group imports its subcommands lazily
        command = group.get_command(ctx, name)
        assert command is not None, name
        if not getattr(command.callback, "__module__", "eventlane.").startswith("eventlane."):
            continue  # contributed by an installed application (entry point plugin)
        out.append(((*path, name), command))
        if isinstance(command, click.Group):
            out.extend(commands(command, (*path, name)))
    return out


def sections(text: str) -> dict[str, str]:
    """Each heading's text mapped to its section: up to the next heading of its level or above."""
    found = list(HEADING.finditer(text))
    out: dict[str, str] = {}
    for i, m in enumerate(found):
        level = len(m.group(1))
        end = len(text)
        for nxt in found[i + 1 :]:
            if len(nxt.group(1)) <= level:
                end = nxt.start()
                break
        out[m.group(2)] = text[m.start() : end]
    return out


def section_for(path: tuple[str, ...], text: str) -> str | None:
    """The section whose heading quotes exactly `eventlane <path>`."""
    wanted = "eventlane " + " ".join(path)
    for heading, body in sections(text).items():
        if wanted in re.findall(r"`([^`]+)`", heading):
            return body
    return None


def long_names(param: click.Parameter) -> list[str]:
    return [opt for opt in [*param.opts, *param.secondary_opts] if opt.startswith("--")]


CLI_DOC = DOCS / "cli.md"


def test_root_options_are_documented() -> None:
    text = CLI_DOC.read_text(encoding="utf-8")
    for param in main.params:
        for opt in long_names(param):
            assert opt in text, f"eventlane {opt} is not in docs/cli.md"
    assert "EVENTLANE_DATA" in text and "EVENTLANE_LOG_LEVEL" in text


@pytest.mark.parametrize(
    ("path", "command"), commands(main), ids=lambda v: " ".join(v) if isinstance(v, tuple) else ""
)
def test_every_command_and_option_is_documented(
    path: tuple[str, ...], command: click.Command
) -> None:
    text = CLI_DOC.read_text(encoding="utf-8")
    body = section_for(path, text)
    where = "eventlane " + " ".join(path)
    assert body is not None, f"docs/cli.md has no section headed `{where}`"
    if isinstance(command, click.Group):
        return
    assert "```" in body, f"the section on `{where}` has no example"
    for param in command.params:
        if isinstance(param, click.Argument):
            assert param.human_readable_name in body, f"{where}: argument {param.name}"
            continue
        for opt in long_names(param):
            if opt in ("--data", "--log"):
                continue  # shared by every command; documented once with the root
            assert opt in body, f"`{where}` option {opt} is not in its section of docs/cli.md"
