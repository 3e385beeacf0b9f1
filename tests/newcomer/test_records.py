"""Item 18: what ``consume`` prints, ``produce --json`` appends back, faithfully."""

from __future__ import annotations

import json
from pathlib import Path

from tests.newcomer.kit import error_line, eventlane


def _records(workdir: Path, topic: str, *args: str) -> list[dict]:
    done = eventlane("--data", "d", "consume", topic, *args, cwd=workdir)
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in done.stdout.splitlines()]


def test_consume_piped_into_produce_json_copies_a_topic(workdir: Path) -> None:
    for topic in ("src", "copy", "text"):
        assert (
            eventlane(
                "--data", "d", "topics", "create", topic, "--partitions", "3", cwd=workdir
            ).returncode
            == 0
        )
    lines = b"k1:v1\nk2:\nk3:caf\xc3\xa9\n:no key\n"
    done = eventlane(
        "--data",
        "d",
        "produce",
        "src",
        "--key-separator",
        ":",
        "-H",
        "trace=abc",
        "-H",
        "e=",
        cwd=workdir,
        input=lines,
    )
    assert done.returncode == 0, done.stderr
    # a binary value and a tombstone-like null header, written through the JSON mode itself
    binary = {
        "key": "YmluYXJ5",
        "value": "/wD+",
        "headers": [["n", None]],
        "timestamp": 1_700_000_000_123,
        "partition": 2,
    }
    done = eventlane(
        "--data",
        "d",
        "produce",
        "src",
        "--json",
        "--base64",
        cwd=workdir,
        input=(json.dumps(binary) + "\n").encode(),
    )
    assert done.returncode == 0, done.stderr
    source = _records(workdir, "src", "--base64")
    assert {r["value"] for r in source} >= {"/wD+"}
    assert all(["trace", "YWJj"] in r["headers"] for r in source if r["value"] != "/wD+")

    dump = eventlane("--data", "d", "consume", "src", "--base64", cwd=workdir).stdout
    done = eventlane(
        "--data",
        "d",
        "produce",
        "copy",
        "--json",
        "--base64",
        "--print-offsets",
        cwd=workdir,
        input=dump.encode(),
    )
    assert done.returncode == 0, done.stderr

    def strip(rows: list[dict]) -> list[dict]:
        return [{k: v for k, v in r.items() if k != "topic"} for r in rows]

    assert strip(_records(workdir, "copy", "--base64")) == strip(source)
    # the text form round-trips UTF-8 data as well
    text = eventlane("--data", "d", "consume", "src", "--partition", "0", cwd=workdir).stdout
    done = eventlane("--data", "d", "produce", "text", "--json", cwd=workdir, input=text.encode())
    assert done.returncode == 0, done.stderr
    assert strip(_records(workdir, "text")) == strip(_records(workdir, "src", "--partition", "0"))


def test_produce_json_refuses_what_consume_never_prints(workdir: Path) -> None:
    eventlane("--data", "d", "topics", "create", "t", "--partitions", "2", cwd=workdir)
    good = '{"key":"a","value":"1"}\n'
    for bad, words in (
        ('{"value": 1}', "'value' must be a string"),
        ("not json", "line 2 is not a record"),
        ('{"value":"x","partition":5}', "partition 5 does not exist"),
        ('{"value":"x","timestamp":-3}', "'timestamp' must be an integer"),
    ):
        done = eventlane(
            "--data", "d", "produce", "t", "--json", cwd=workdir, input=(good + bad + "\n").encode()
        )
        assert words in error_line(done)
    # the good line before each bad one was appended: 4 records
    assert len(_records(workdir, "t")) == 4
    usage = eventlane("--data", "d", "produce", "t", "--base64", cwd=workdir, input=b"x\n")
    assert usage.returncode == 2
    bad_header = eventlane(
        "--data", "d", "produce", "t", "-H", "novalue", cwd=workdir, input=b"x\n"
    )
    assert bad_header.returncode == 2 and "name=value" in bad_header.stderr
