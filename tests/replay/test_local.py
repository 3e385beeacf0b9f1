"""The local engine against a live worker and the raw log; verification; the CLI (no Spark).

The history has upcast v1 records, poison payments, retention that moved ``orders``' low-
water marks, and a compacted ``customers`` topic (see ``replay_app``).
"""

from __future__ import annotations

import os
import shutil
import sqlite3
from pathlib import Path

import orjson
import pytest
from click.testing import CliRunner

from eventlane.cli import main
from eventlane.errors import ConfigError
from eventlane.log import LogStore, TopicPartition
from eventlane.projection import readmodel_path
from eventlane.replay.checksum import DEAD_LETTERS, POSITIONS, compare, file_checksums
from eventlane.replay.rebuild import default_output, rebuild
from eventlane.replay.verify import compare_live
from tests.replay import replay_app
from tests.replay.conftest import APP, GeneratedLog, expected_markers, rows, run_live


@pytest.fixture(scope="module")
def live(history: GeneratedLog) -> dict[TopicPartition, int]:
    """The live read model of ``sales``, built by a real worker up to the high-water marks."""
    with replay_app.app.open(history.data, create_topics=False) as runtime:
        return run_live(runtime, "sales")


def test_history_is_awkward(history: GeneratedLog) -> None:
    lwms = history.facts["lwms"]
    assert all(lwms[TopicPartition("orders", p)] > 0 for p in range(4)), lwms
    customers = rows_in_log(history.data, "customers")
    assert customers["present"] < customers["offsets"]  # compaction left gaps
    assert b'"version":1' in raw_values(history.data, "orders")  # v1 records to upcast


def test_local_engine_equals_the_live_model(
    history: GeneratedLog, live: dict[TopicPartition, int], tmp_path: Path
) -> None:
    with replay_app.app.open(history.data, create_topics=False) as runtime:
        result = rebuild(runtime, "sales", engine="local", output=tmp_path / "sales.sqlite")
        assert dict(result.end) == {
            tp: runtime.log.offsets(tp.topic, tp.partition).hwm for tp in result.end
        }
        comparison = compare_live(
            runtime.log, result.path, readmodel_path(history.data, "sales"), result.end
        )
    assert comparison.skipped is None
    assert [d.table for d in comparison.tables] == [
        "applied",
        "customer_stats",
        "daily",
        "orders",
        "totals",
    ]
    assert comparison.ok, comparison.differences
    # positions are E exactly; nothing below a low-water mark was applied
    assert rows(result.path, "SELECT topic, partition, next_offset FROM _eventlane_positions")
    got = {
        TopicPartition(t, p): o
        for t, p, o in rows(
            result.path, "SELECT topic, partition, next_offset FROM _eventlane_positions"
        )
    }
    assert got == dict(result.end)
    for tp, lwm in history.facts["lwms"].items():
        low = rows(
            result.path,
            f"SELECT min(offset) FROM applied WHERE topic='{tp.topic}' AND partition={tp.partition}",
        )[0][0]
        assert low is None or low >= lwm
    # the independent fold: exactly the events it must apply, each once
    markers = set(rows(result.path, "SELECT topic, partition, offset FROM applied"))
    assert markers == expected_markers(history.data)
    assert rows(result.path, "SELECT events FROM totals") == [(100 + len(markers),)]
    # poison payments are in the report (and the file), not applied
    assert result.counts.dead_lettered == len(result.dead_letters) > 0
    assert {d.topic for d in result.dead_letters} == {"payments"}
    assert all("negative payment" in d.error for d in result.dead_letters)
    assert rows(result.path, "SELECT DISTINCT published FROM _eventlane_dead_letters") == [(1,)]
    # upcast: every order has a currency, v1 ones included
    assert rows(result.path, "SELECT count(*) FROM orders WHERE currency IS NULL") == [(0,)]


def test_rebuild_never_writes_the_live_file(history: GeneratedLog, tmp_path: Path) -> None:
    with replay_app.app.open(history.data, create_topics=False) as runtime:
        with pytest.raises(ConfigError, match="live read model"):
            rebuild(runtime, "sales", engine="local", output=readmodel_path(history.data, "sales"))
        with pytest.raises(ConfigError, match="state_per_key"):
            rebuild(runtime, "sales", engine="local", output=tmp_path / "x.sqlite", key_groups=2)
    assert default_output(history.data, "sales").name == "sales.rebuild.sqlite"


def test_cli_verify_passes_then_catches_a_tampered_live_model(
    history: GeneratedLog, live: dict[TopicPartition, int], tmp_path: Path
) -> None:
    runner = CliRunner()
    out = tmp_path / "cli.sqlite"
    args = ["rebuild", APP, "-p", "sales", "--engine", "local", "--output", str(out)]
    result = runner.invoke(main, [*args, "--verify", "--json", "--data", str(history.data)])
    assert result.exit_code == 0, result.output
    body = orjson.loads(result.stdout)
    assert body["rebuild"]["records"] > 0 and body["rebuild"]["dead_lettered"] > 0
    live_cmp = next(c for c in body["verify"] if c["what"] == "live")
    assert live_cmp["ok"] and live_cmp["skipped"] is None
    assert {t["table"] for t in live_cmp["tables"]} >= {"customer_stats", "applied"}

    # tamper with a copy of the live model: the check must fail, naming the table
    tampered = tmp_path / "data-copy"
    copy_tree(history.data, tampered)
    conn = sqlite3.connect(readmodel_path(tampered, "sales"))
    conn.execute("UPDATE customer_stats SET paid = paid + 1 WHERE rowid = 1")
    conn.commit()
    conn.close()
    result = runner.invoke(main, [*args, "--verify", "--data", str(tampered)])
    assert result.exit_code == 1, result.output
    assert "customer_stats" in result.stdout and "DIFFERENT" in result.stdout


def test_checksums_ignore_order_but_not_content(tmp_path: Path, history: GeneratedLog) -> None:
    with replay_app.app.open(history.data, create_topics=False) as runtime:
        a = rebuild(runtime, "sales", engine="local", output=tmp_path / "a.sqlite").path
    b = tmp_path / "b.sqlite"
    conn = sqlite3.connect(b)
    conn.execute("ATTACH ? AS src", (str(a),))
    for name, sql in conn.execute("SELECT name, sql FROM src.sqlite_master WHERE type='table'"):
        conn.execute(sql)
        conn.execute(f'INSERT INTO main."{name}" SELECT * FROM src."{name}" ORDER BY random()')
    conn.commit()
    conn.close()
    assert all(d.equal for d in compare(file_checksums(a), file_checksums(b)))
    conn = sqlite3.connect(b)
    victim = conn.execute("SELECT topic, partition, offset FROM applied LIMIT 1").fetchone()
    conn.execute("DELETE FROM applied WHERE topic=? AND partition=? AND offset=?", victim)
    conn.execute(
        "UPDATE _eventlane_positions SET next_offset = next_offset - 1 WHERE partition = 0"
        " AND topic = 'orders'"
    )
    conn.commit()
    conn.close()
    diffs = {d.table for d in compare(file_checksums(a), file_checksums(b)) if not d.equal}
    assert diffs == {"applied", POSITIONS}
    assert DEAD_LETTERS in file_checksums(a)
    # a path as text (what a script or the CLI has) is the same file
    assert file_checksums(str(a)) == file_checksums(a)


# ---------------------------------------------------------------------------- helpers
def raw_values(data: Path, topic: str) -> bytes:
    log = LogStore(data)
    try:
        out = []
        for p in range(log.partition_count(topic)):
            marks = log.offsets(topic, p)
            records, _ = log.read(topic, p, marks.lwm, max_bytes=1 << 30, upto=marks.hwm)
            out.extend(r.value or b"" for r in records)
        return b"\n".join(out)
    finally:
        log.close()


def rows_in_log(data: Path, topic: str) -> dict[str, int]:
    log = LogStore(data)
    try:
        present = offsets = 0
        for p in range(log.partition_count(topic)):
            marks = log.offsets(topic, p)
            offsets += marks.hwm - marks.lwm
            offset = marks.lwm
            while offset < marks.hwm:
                records, _ = log.read(topic, p, offset, upto=marks.hwm)
                if not records:
                    break
                present += len(records)
                offset = records[-1].offset + 1
        return {"present": present, "offsets": offsets}
    finally:
        log.close()


def copy_tree(src: Path, dst: Path) -> None:
    """Copy a data directory (read models copied with SQLite's backup API)."""
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("*.sqlite*"))
    (dst / "readmodels").mkdir(exist_ok=True)
    for path in (src / "readmodels").glob("*.sqlite"):
        source = sqlite3.connect(path)
        target = sqlite3.connect(dst / "readmodels" / path.name)
        source.backup(target)
        source.close()
        target.close()
    assert os.path.exists(dst / "topics")
