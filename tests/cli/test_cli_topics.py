"""``eventlane topics``: create/list/describe/alter/delete, and refusing bad input cleanly."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from cli_helpers import tree
from click.testing import CliRunner

from eventlane.cli import main
from eventlane.log import LogStore, TopicConfig

PARTITION_KEYS = {"partition", "lwm", "hwm", "leo", "segments", "bytes"}

# A non-default value for every TopicConfig knob, as a user types it after --config.
NON_DEFAULTS = {
    "cleanup.policy": "compact,delete",
    "retention.ms": "3600000",
    "retention.bytes": "1048576",
    "segment.bytes": "65536",
    "segment.ms": "60000",
    "min.compaction.lag.ms": "1000",
    "delete.retention.ms": "5000",
    "max.record.bytes": "4096",
    "timestamp.type": "LogAppendTime",
    "flush.policy": "os",
    "index.interval.bytes": "1024",
}


def describe(cli, name: str) -> dict:
    result = cli("topics", "describe", name, "--json")
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_create_then_describe_json_has_exactly_the_documented_shape(cli, data_dir: Path) -> None:
    result = cli("topics", "create", "orders", "--partitions", "3")
    assert result.exit_code == 0, result.output
    assert "orders" in result.stdout
    body = describe(cli, "orders")
    assert set(body) == {"name", "config", "partitions"}
    assert body["name"] == "orders"
    assert body["config"] == TopicConfig().to_dict()
    assert [p["partition"] for p in body["partitions"]] == [0, 1, 2]
    for p in body["partitions"]:
        assert set(p) == PARTITION_KEYS
        assert (p["lwm"], p["hwm"], p["leo"], p["segments"], p["bytes"]) == (0, 0, 0, 1, 0)
    with LogStore(data_dir) as log:  # the CLI wrote what the library reads
        assert log.partition_count("orders") == 3


def test_every_topic_config_knob_is_reachable(cli) -> None:
    assert set(NON_DEFAULTS) == {f.name.replace("_", ".") for f in dataclasses.fields(TopicConfig)}
    args = [arg for key, value in NON_DEFAULTS.items() for arg in ("--config", f"{key}={value}")]
    result = cli("topics", "create", "tuned", *args)
    assert result.exit_code == 0, result.output
    config = describe(cli, "tuned")["config"]
    for key, value in NON_DEFAULTS.items():
        assert str(config[key.replace(".", "_")]) == value


def test_dedicated_options_set_their_config(cli) -> None:
    result = cli(
        "topics", "create", "state", "--compact", "--retention-ms", "-1",
        "--retention-bytes", "2048", "--segment-bytes", "4096",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    config = describe(cli, "state")["config"]
    assert config["cleanup_policy"] == "compact"
    assert (config["retention_ms"], config["retention_bytes"], config["segment_bytes"]) == (
        -1,
        2048,
        4096,
    )


def test_list_human_and_json(cli) -> None:
    empty = cli("topics", "list")
    assert empty.exit_code != 0  # no data directory yet: says so instead of creating one
    assert "no eventlane data" in empty.stderr
    cli("topics", "create", "b-topic", "--partitions", "2")
    cli("topics", "create", "a-topic", "--compact")
    human = cli("topics", "list")
    assert human.exit_code == 0
    assert "a-topic" in human.stdout and "b-topic" in human.stdout
    listed = json.loads(cli("topics", "list", "--json").stdout)
    assert [(t["name"], t["partitions"], t["config"]["cleanup_policy"]) for t in listed] == [
        ("a-topic", 1, "compact"),
        ("b-topic", 2, "delete"),
    ]


def test_describe_human_output_names_the_marks(cli) -> None:
    cli("topics", "create", "orders", "--partitions", "2")
    result = cli("topics", "describe", "orders")
    assert result.exit_code == 0
    for word in ("LWM", "HWM", "LEO", "segments", "cleanup_policy", "retention_ms"):
        assert word in result.stdout


def test_create_existing_topic_fails_unless_if_not_exists(cli) -> None:
    assert cli("topics", "create", "orders", "--partitions", "2").exit_code == 0
    again = cli("topics", "create", "orders", "--partitions", "5")
    assert again.exit_code == 1
    assert "already exists" in again.stderr and "orders" in again.stderr
    assert "Traceback" not in again.output
    ok = cli("topics", "create", "orders", "--partitions", "5", "--if-not-exists")
    assert ok.exit_code == 0, ok.output
    assert len(describe(cli, "orders")["partitions"]) == 2  # unchanged


def test_alter_increase_warns_and_decrease_is_refused(cli) -> None:
    cli("topics", "create", "orders", "--partitions", "3")
    more = cli("topics", "alter", "orders", "--partitions", "5")
    assert more.exit_code == 0, more.output
    assert "warning" in more.stderr and "partition" in more.stderr
    assert len(describe(cli, "orders")["partitions"]) == 5

    fewer = cli("topics", "alter", "orders", "--partitions", "2")
    assert fewer.exit_code == 1
    assert "cannot decrease" in fewer.stderr and "topic=orders" in fewer.stderr
    assert len(describe(cli, "orders")["partitions"]) == 5


def test_alter_config(cli) -> None:
    cli("topics", "create", "orders")
    result = cli("topics", "alter", "orders", "--config", "retention.ms=1000")
    assert result.exit_code == 0, result.output
    assert "retention_ms" in result.stdout
    assert describe(cli, "orders")["config"]["retention_ms"] == 1000

    bad = cli("topics", "alter", "orders", "--config", "retention.hours=1")
    assert bad.exit_code == 1 and "retention.hours" in bad.stderr
    nothing = cli("topics", "alter", "orders")
    assert nothing.exit_code == 2 and "nothing to alter" in nothing.stderr
    assert describe(cli, "orders")["config"]["retention_ms"] == 1000


def test_delete(cli, data_dir: Path) -> None:
    cli("topics", "create", "orders", "--partitions", "2")
    result = cli("topics", "delete", "orders")
    assert result.exit_code == 0, result.output
    assert json.loads(cli("topics", "list", "--json").stdout) == []
    assert not (data_dir / "topics" / "orders").exists()
    again = cli("topics", "delete", "orders")
    assert again.exit_code == 1 and "does not exist" in again.stderr


HOSTILE = ["..", ".", "../x", "/abs", "a" * 250, "a\x00b", "tøpic", "a/b", "", "x y"]


@pytest.mark.parametrize("name", HOSTILE, ids=repr)
def test_hostile_topic_names_create_nothing(cli, tmp_path: Path, data_dir: Path, name: str) -> None:
    before = tree(tmp_path)
    result = cli("topics", "create", name, "--partitions", "2")
    assert result.exit_code != 0
    assert "topic name" in result.stderr
    assert "Traceback" not in result.output
    assert tree(tmp_path) == before  # not even the data directory
    # Same with an existing data directory: nothing appears in it, nothing outside it.
    cli("topics", "create", "existing")
    before = tree(tmp_path)
    for args in (
        ("topics", "create", name),
        ("topics", "describe", name),
        ("topics", "delete", name),
        ("topics", "alter", name, "--partitions", "3"),
        ("consume", name),
        ("compact", name),
        ("cleanup", name),
        ("verify", name),
    ):
        result = cli(*args, input="x\n")
        assert result.exit_code != 0, args
        assert "topic name" in result.stderr, (args, result.stderr)
    assert cli("produce", name, input="x\n").exit_code != 0
    assert tree(tmp_path) == before


def test_unknown_config_key_creates_nothing(cli, tmp_path: Path) -> None:
    before = tree(tmp_path)
    result = cli("topics", "create", "orders", "--config", "retention.hours=1")
    assert result.exit_code == 1
    assert "unknown topic config key 'retention.hours'" in result.stderr
    assert tree(tmp_path) == before


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--partitions", "0"), "--partitions"),
        (("--partitions", "many"), "--partitions"),
        (("--retention-ms", "-5"), "retention_ms"),
        (("--segment-bytes", "0"), "segment_bytes"),
        (("--config", "segment.bytes=abc"), "segment_bytes"),
        (("--config", "cleanup.policy=sometimes"), "cleanup_policy"),
        (("--config", "novalue"), "key=value"),
        (("--config", "retention.ms=1", "--config", "retention_ms=2"), "twice"),
        (("--retention-ms", "5", "--config", "retention.ms=1"), "both given"),
        (("--compact", "--config", "cleanup.policy=delete"), "--compact"),
    ],
)
def test_bad_create_arguments_are_named_and_create_nothing(
    cli, tmp_path: Path, args: tuple[str, ...], message: str
) -> None:
    before = tree(tmp_path)
    result = cli("topics", "create", "orders", *args)
    assert result.exit_code != 0
    assert message in result.stderr, result.stderr
    assert "Traceback" not in result.output
    assert tree(tmp_path) == before


def test_data_option_after_subcommand_and_env_var(cli, tmp_path: Path) -> None:
    one, two, three = tmp_path / "one", tmp_path / "two", tmp_path / "three"
    assert cli("topics", "create", "t1", "--data", str(one), data=None).exit_code == 0
    assert cli("topics", "--data", str(two), "create", "t2", data=None).exit_code == 0
    assert (one / "topics" / "t1" / "topic.json").exists()
    assert (two / "topics" / "t2" / "topic.json").exists()

    runner = CliRunner(env={"EVENTLANE_DATA": str(three)})
    assert runner.invoke(main, ["topics", "create", "t3"]).exit_code == 0
    assert (three / "topics" / "t3" / "topic.json").exists()
    # The subcommand's --data wins over the root option and the environment.
    result = runner.invoke(
        main, ["--data", str(two), "topics", "list", "--json", "--data", str(one)]
    )
    assert [t["name"] for t in json.loads(result.stdout)] == ["t1"]


def test_data_dir_that_is_a_file_is_refused(cli, tmp_path: Path) -> None:
    file = tmp_path / "file"
    file.write_text("not a directory")
    result = cli("topics", "create", "t", data=file)
    assert result.exit_code == 1 and "not a directory" in result.stderr


def test_unknown_topic_is_named(cli) -> None:
    cli("topics", "create", "orders")
    for args in (("topics", "describe", "nope"), ("consume", "nope"), ("compact", "nope")):
        result = cli(*args)
        assert result.exit_code == 1
        assert "'nope' does not exist" in result.stderr
