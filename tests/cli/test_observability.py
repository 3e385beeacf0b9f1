"""Logging: eventlane's loggers are stdlib loggers the host governs; ``configure_logging``
(entry points only): levels, formats, and where logs go."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from eventlane.cli import main
from eventlane.errors import ConfigError
from eventlane.observability import configure_logging, get_logger


def test_level_filters_and_console_goes_to_stderr(capsys: pytest.CaptureFixture[str]) -> None:
    configure_logging(level="warning", json=False)
    log = get_logger("eventlane.test")
    log.info("hidden", topic="t")
    log.warning("shown", topic="t", partition=3)
    out, err = capsys.readouterr()
    assert out == ""
    assert "hidden" not in err
    assert "shown" in err and "topic=t" in err and "partition=3" in err


def test_json_lines_carry_the_context(capsys: pytest.CaptureFixture[str]) -> None:
    configure_logging(level="debug", json=True)
    get_logger("eventlane.test").bind(group="g").debug("hello", offset=7)
    [line] = capsys.readouterr().err.splitlines()
    body = json.loads(line)
    assert body["event"] == "hello" and body["level"] == "debug"
    assert (body["group"], body["offset"], body["logger"]) == ("g", 7, "eventlane.test")
    assert "timestamp" in body


def test_environment_variables(monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    monkeypatch.setenv("EVENTLANE_LOG_LEVEL", "ERROR")
    monkeypatch.setenv("EVENTLANE_LOG_FORMAT", "json")
    configure_logging()
    log = get_logger("eventlane.test")
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
    log = get_logger("eventlane.test").bind(topic="t")
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
        "from eventlane.cli import main\n"
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
        "import logging, sys, structlog\n"
        "from eventlane import App\n"
        "from eventlane.observability import get_logger\n"
        "root = logging.getLogger()\n"
        "before = (list(root.handlers), root.level, logging.lastResort)\n"
        f"with App('quiet').open({str(tmp_path)!r}):\n"
        "    log = get_logger('eventlane.test').bind(topic='t')\n"
        "    log.info('hidden')\n"
        "    log.warning('shown')\n"
        "after = (list(root.handlers), root.level, logging.lastResort)\n"
        "print(before == after, logging.getLogger('eventlane').handlers, file=sys.stderr)\n"
        "print(structlog.is_configured(), file=sys.stderr)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(root)}
    env.pop("EVENTLANE_LOG_LEVEL", None)
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    assert done.stdout == ""
    assert "shown" in done.stderr and "topic=t" in done.stderr and "hidden" not in done.stderr
    assert done.stderr.splitlines()[-2:] == ["True []", "False"]


def test_the_host_applications_logging_configuration_governs_eventlane(tmp_path: Path) -> None:
    """A user program configures stdlib logging (dictConfig, as uvicorn does) and sees
    eventlane's records through it: its format, its level, its handler, with the fields as
    record attributes (what JSON formatters pick up)."""
    root = Path(__file__).resolve().parents[2]
    code = (
        "import logging, logging.config, sys\n"
        "class Keep(logging.Handler):\n"
        "    records = []\n"
        "    def emit(self, record):\n"
        "        Keep.records.append(record)\n"
        "logging.config.dictConfig({'version': 1, 'handlers': {\n"
        "    'err': {'class': 'logging.StreamHandler', 'stream': 'ext://sys.stderr',\n"
        "            'formatter': 'f'}, 'keep': {'()': Keep}},\n"
        "    'formatters': {'f': {'format': 'HOST %(name)s %(levelname)s %(message)s'}},\n"
        "    'loggers': {'eventlane': {'level': 'INFO', 'handlers': ['err', 'keep']}}})\n"
        "from eventlane import App\n"
        f"with App('host').open({str(tmp_path)!r}) as runtime:\n"
        "    runtime.log.create_topic('orders', 2)\n"
        "[r] = [r for r in Keep.records if r.getMessage().startswith('topic created')]\n"
        "print(r.name, r.topic, r.partitions, r.eventlane_event, r.eventlane_fields['topic'])\n"
        "print(r.pathname.endswith('.py') and 'observability' not in r.pathname)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(root)}
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    assert done.stdout.splitlines() == [
        "eventlane.log orders 2 topic created orders",
        "True",  # the record names eventlane's caller, not the logging adapter
    ]
    line = next(x for x in done.stderr.splitlines() if "topic created" in x)
    assert line.startswith("HOST eventlane.log INFO topic created")
    assert "partitions=2" in line and "topic=orders" in line


def test_cli_log_options_and_worker_environment(data_dir: Path) -> None:
    runner = CliRunner(env={"EVENTLANE_LOG_LEVEL": None, "EVENTLANE_LOG_FORMAT": None})
    argv = ["--data", str(data_dir), "--log-level", "info", "--log-format", "json"]
    result = runner.invoke(main, [*argv, "topics", "create", "t2"])
    assert result.exit_code == 0, result.output
    events = [json.loads(line) for line in result.stderr.splitlines()]
    assert any(e["event"] == "topic created" and e["topic"] == "t2" for e in events)
    assert all(e["level"] in ("info", "warning") for e in events)
    assert result.stdout.startswith("topic t2 created")
    from eventlane.observability import logging_env  # noqa: PLC0415 - after the CLI ran

    assert logging_env() == {"EVENTLANE_LOG_LEVEL": "info", "EVENTLANE_LOG_FORMAT": "json"}
    result = runner.invoke(main, ["--log-level", "loud", "topics", "list"])
    assert result.exit_code == 2 and "loud" in result.stderr


def test_an_applications_structlog_loggers_follow_the_cli(tmp_path: Path) -> None:
    """In an entry point, an application's own structlog loggers write where eventlane's do
    (stderr, the chosen format), never to stdout (structlog's own default)."""
    root = Path(__file__).resolve().parents[2]
    code = (
        "import structlog\n"
        "from eventlane.observability import configure_logging, route_structlog\n"
        "configure_logging(level='info', json=True)\n"
        "route_structlog()\n"
        "structlog.get_logger('myapp').info('booked', room=7)\n"
        "structlog.get_logger('myapp').debug('hidden')\n"
    )
    env = {**os.environ, "PYTHONPATH": str(root)}
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    assert done.stdout == ""
    [line] = done.stderr.splitlines()
    body = json.loads(line)
    assert (body["event"], body["room"], body["logger"], body["level"]) == (
        "booked",
        7,
        "myapp",
        "info",
    )
