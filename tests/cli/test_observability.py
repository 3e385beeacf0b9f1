"""``framework.observability.configure_logging``: levels, formats, and where logs go."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import structlog
from click.testing import CliRunner

from framework.cli import main
from framework.errors import ConfigError
from framework.observability import configure_logging


def test_level_filters_and_console_goes_to_stderr(capsys: pytest.CaptureFixture[str]) -> None:
    configure_logging(level="warning", json=False)
    log = structlog.get_logger("eventlane.test")
    log.info("hidden", topic="t")
    log.warning("shown", topic="t", partition=3)
    out, err = capsys.readouterr()
    assert out == ""
    assert "hidden" not in err
    assert "shown" in err and "topic=t" in err and "partition=3" in err


def test_json_lines_carry_the_context(capsys: pytest.CaptureFixture[str]) -> None:
    configure_logging(level="debug", json=True)
    structlog.get_logger("eventlane.test").bind(group="g").debug("hello", offset=7)
    [line] = capsys.readouterr().err.splitlines()
    body = json.loads(line)
    assert body["event"] == "hello" and body["level"] == "debug"
    assert (body["group"], body["offset"], body["logger"]) == ("g", 7, "eventlane.test")
    assert "timestamp" in body


def test_environment_variables(monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    monkeypatch.setenv("EVENTLANE_LOG_LEVEL", "ERROR")
    monkeypatch.setenv("EVENTLANE_LOG_FORMAT", "json")
    configure_logging()
    log = structlog.get_logger("eventlane.test")
    log.warning("below the level")
    log.error("kept")
    [line] = capsys.readouterr().err.splitlines()
    assert json.loads(line)["event"] == "kept"


def test_bad_settings_are_config_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigError, match="unknown log level 'loud'"):
        configure_logging(level="loud")
    monkeypatch.setenv("EVENTLANE_LOG_FORMAT", "xml")
    with pytest.raises(ConfigError, match="unknown log format 'xml'"):
        configure_logging()


def test_logging_follows_a_replaced_stderr(monkeypatch: pytest.MonkeyPatch) -> None:
    """The stream is looked up per write: a logger bound earlier writes to the new stderr,
    and a closed stream never makes logging raise."""
    configure_logging(level="info", json=True)
    log = structlog.get_logger("eventlane.test").bind(topic="t")
    replaced = io.StringIO()
    monkeypatch.setattr(sys, "stderr", replaced)
    log.info("after")
    assert json.loads(replaced.getvalue())["event"] == "after"
    replaced.close()
    log.info("into a closed stream")  # no exception


def test_the_cli_configures_logging_from_the_environment(data_dir) -> None:
    runner = CliRunner(env={"EVENTLANE_LOG_LEVEL": "chatty"})
    result = runner.invoke(main, ["--data", str(data_dir), "topics", "list"])
    assert result.exit_code == 1 and "unknown log level 'chatty'" in result.stderr
    runner = CliRunner(env={"EVENTLANE_LOG_LEVEL": "info", "EVENTLANE_LOG_FORMAT": "json"})
    result = runner.invoke(main, ["--data", str(data_dir), "topics", "create", "t"])
    assert result.exit_code == 0
    events = [json.loads(line) for line in result.stderr.splitlines()]
    assert any(e["event"] == "topic created" and e["topic"] == "t" for e in events)
    assert result.stdout.startswith("topic t created")  # stdout stays clean


def test_structlog_loads_only_when_something_is_logged(tmp_path: Path) -> None:
    """A command that logs nothing never imports structlog (its import costs more than
    ``topics list``); one that logs gets the configuration asked for at start-up."""
    root = Path(__file__).resolve().parents[2]
    data = tmp_path / "data"
    code = (
        "import sys\n"
        "from framework.cli import main\n"
        "try:\n"
        "    main(sys.argv[1:])\n"
        "except SystemExit:\n"
        "    pass\n"
        "print('structlog' in sys.modules, file=sys.stderr)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(root), "EVENTLANE_LOG_FORMAT": "json"}

    def run(*args: str, level: str = "warning") -> list[str]:
        done = subprocess.run(
            [sys.executable, "-c", code, "--data", str(data), *args],
            env={**env, "EVENTLANE_LOG_LEVEL": level},
            capture_output=True,
            text=True,
            check=True,
        )
        return done.stderr.splitlines()

    created = run("topics", "create", "t")  # the first run creates the directory: a warning
    assert json.loads(created[0])["event"].startswith("created data directory")
    assert created[-1] == "True"
    assert run("topics", "list") == ["False"]
    *logged, loaded = run("topics", "create", "u", level="info")
    assert loaded == "True"
    assert any(json.loads(line)["event"] == "topic created" for line in logged)


def test_unconfigured_library_logs_go_to_stderr_and_configure_nothing(tmp_path: Path) -> None:
    """A library user who configures nothing: opening a runtime leaves structlog alone, and
    eventlane's warnings (not its info lines) go to stderr, never to stdout."""
    root = Path(__file__).resolve().parents[2]
    code = (
        "import sys, structlog\n"
        "from framework import App\n"
        "from framework.observability import get_logger\n"
        f"with App('quiet').open({str(tmp_path)!r}):\n"
        "    log = get_logger('eventlane.test').bind(topic='t')\n"
        "    log.info('hidden')\n"
        "    log.warning('shown')\n"
        "print(structlog.is_configured(), file=sys.stderr)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(root)}
    env.pop("EVENTLANE_LOG_LEVEL", None)
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    assert done.stdout == ""
    assert "shown" in done.stderr and "topic=t" in done.stderr and "hidden" not in done.stderr
    assert done.stderr.splitlines()[-1] == "False"
