"""A rebuild's Spark session, with real JVMs: its class archive (eventlane.replay.class_archive),
its worker daemon (eventlane.replay.worker_daemon) and its lazily registered data source.

Each session runs in a child process, as ``eventlane rebuild`` does, so the archive is
written at a real interpreter exit. Whether a JVM uses the archive is read from outside
its own report: the archive file appears among the JVM process's memory mappings
(``/proc/<pid>/maps``) only when HotSpot mapped it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from eventlane.replay.class_archive import ENV, archive_dir, plan_archive

ROOT = Path(__file__).resolve().parents[2]

CHILD = """
import sys
from pyspark import SparkContext
from eventlane.replay.session import spark_session

s = spark_session("local[1]", rebuild=True)
count = s.range(3).count()
pid = SparkContext._gateway.proc.pid
with open(f"/proc/{pid}/maps") as f:
    mapped = sorted({line.split()[-1] for line in f if line.rstrip().endswith(".jsa")})
sys.stderr.write(f"count={count} mapped={','.join(mapped)}\\n")
"""


def _child(code: str, archives: str, *args: str) -> tuple[str, str]:
    """Run ``code`` in a child process with ``archives`` as the archives' directory (or
    ``off``); its (stdout, stderr), once it exited 0."""
    env = {**os.environ, ENV: archives, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", code, *args],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout, done.stderr


def _session(archives: str) -> tuple[str, str]:
    """One session in a child process (:data:`CHILD`)."""
    return _child(CHILD, archives)


def _report(stderr: str) -> tuple[int, list[str]]:
    line = next(ln for ln in stderr.splitlines() if ln.startswith("count="))
    count, mapped = line.split(" ", 1)
    files = mapped.removeprefix("mapped=")
    return int(count.removeprefix("count=")), [f for f in files.split(",") if f]


def _archives(folder: Path) -> list[Path]:
    return sorted(folder.iterdir()) if folder.exists() else []


def test_the_first_session_writes_the_archive_and_the_next_maps_it(tmp_path: Path) -> None:
    folder = tmp_path / "classes"
    out, err = _session(str(folder))
    assert out == ""  # stdout carries data only: nothing from the JVM
    count, mapped = _report(err)
    assert count == 3
    assert not [m for m in mapped if m.startswith(str(folder))]  # nothing to map yet
    written = _archives(folder)
    assert len(written) == 1 and written[0].suffix == ".jsa", written  # no .tmp left behind
    assert written[0].stat().st_size > 1_000_000

    out, err = _session(str(folder))
    assert out == ""
    count, mapped = _report(err)
    assert count == 3
    assert str(written[0]) in mapped  # the JVM mapped the archive
    assert _archives(folder) == written  # used, not written again

    # a damaged archive is not used, and costs the session nothing but the archive
    written[0].write_bytes(b"not an archive" * 100_000)
    out, err = _session(str(folder))
    assert out == ""
    count, mapped = _report(err)
    assert count == 3
    assert str(written[0]) not in mapped


BROKEN = """
import logging, sys
from eventlane.replay import class_archive
from eventlane.replay.session import spark_session

logging.basicConfig(stream=sys.stderr, level=logging.WARNING)
class_archive.Archive.java_options = property(lambda self: "-Xmx1k")
s = spark_session("local[1]", rebuild=True)
sys.stderr.write(f"count={s.range(3).count()}\\n")
"""


def test_a_jvm_that_will_not_start_with_the_archive_starts_without(tmp_path: Path) -> None:
    """The archive can make a start shorter, never make it fail: a JVM that refuses its
    options (here a heap too small to start) is started again without them."""
    out, err = _child(BROKEN, str(tmp_path / "classes"))
    assert "count=3" in err.splitlines()
    assert "did not start with the JVM class archive" in err
    assert out == ""


def test_off_writes_and_maps_no_archive(tmp_path: Path) -> None:
    out, err = _session("off")
    assert out == ""
    count, mapped = _report(err)
    assert count == 3
    assert not [m for m in mapped if "spark-" in Path(m).name]


def test_an_archive_per_set_up_and_stale_partial_writes_removed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ENV, str(tmp_path))
    a = plan_archive({"spark.driver.extraJavaOptions": "-XX:+UseSerialGC"})
    b = plan_archive({"spark.driver.extraJavaOptions": "-XX:+UseParallelGC"})
    c = plan_archive({"spark.driver.extraClassPath": "/opt/extra.jar"})
    assert a is not None and b is not None and c is not None
    assert len({a.path, b.path, c.path}) == 3
    assert a.tmp is not None and a.tmp.name.endswith(f".{os.getpid()}.tmp")
    assert "-XX:ArchiveClassesAtExit=" in a.java_options
    a.path.write_bytes(b"x")
    again = plan_archive({"spark.driver.extraJavaOptions": "-XX:+UseSerialGC"})
    assert again == (a.path, None)
    assert again is not None and f"-XX:SharedArchiveFile={a.path}" in again.java_options

    old, fresh = tmp_path / "spark-old.jsa.1.tmp", tmp_path / "spark-new.jsa.2.tmp"
    old.write_bytes(b"partial")
    fresh.write_bytes(b"partial")
    hours_ago = time.time() - 2 * 3600
    os.utime(old, (hours_ago, hours_ago))
    plan_archive({})
    assert not old.exists() and fresh.exists()  # a JVM may still be writing the fresh one


def test_an_archive_unused_for_a_month_goes_when_another_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ENV, str(tmp_path))
    used = plan_archive({"spark.driver.extraJavaOptions": "-Da=1"})
    unused = plan_archive({"spark.driver.extraJavaOptions": "-Db=1"})
    assert used is not None and unused is not None
    used.path.write_bytes(b"x")
    unused.path.write_bytes(b"x")
    months_ago = time.time() - 40 * 86_400
    for archive in (used, unused):
        os.utime(archive.path, (months_ago, months_ago))
    assert plan_archive({"spark.driver.extraJavaOptions": "-Da=1"}) == (used.path, None)
    assert used.path.stat().st_mtime > months_ago  # using it marks it used
    assert unused.path.exists()  # nothing is written: nothing removed
    new = plan_archive({"spark.driver.extraJavaOptions": "-Dc=1"})
    assert new is not None and new.tmp is not None  # a new set-up: an archive to write
    assert used.path.exists() and not unused.path.exists()


FRAME = """
import sys
from eventlane.log import LogStore
from eventlane.replay.typed import event_frame
from eventlane.replay.session import spark_session
from tests.replay import replay_app

data = sys.argv[1]
log = LogStore(data)
replay_app.generate(log, orders=40)
log.close()
s = spark_session("local[1]", rebuild=True)
frame = event_frame(s, replay_app.app, data, replay_app.OrderPlaced, topics=["orders"])
again = event_frame(s, replay_app.app, data, replay_app.OrderPlaced, topics=["orders"])
sys.stderr.write(f"frame={frame.count()} again={again.count()}\\n")
"""


def test_a_session_without_the_data_source_still_gives_typed_frames(tmp_path: Path) -> None:
    """A rebuild's session skips the data source (its registration starts a Python process
    that looks for others); a typed frame registers it on the session it is given."""
    _, err = _child(FRAME, "off", str(tmp_path / "data"))
    line = next(ln for ln in err.splitlines() if ln.startswith("frame="))
    frame, again = (int(part.split("=")[1]) for part in line.split())
    assert 0 < frame == again <= 40  # one a placed order (retention took some)
    assert "replaced a previously registered" not in err  # registered once


def test_the_worker_daemon_imports_start_no_thread() -> None:
    """Spark forks its Python workers from the daemon: a thread started by an import there
    would be missing in every worker."""
    code = (
        "import os, threading, eventlane.replay.worker_daemon;"
        " print(threading.active_count(), len(os.listdir('/proc/self/task')))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert done.stdout.split() == ["1", "1"]


def test_the_archives_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert archive_dir() == tmp_path / "eventlane" / "spark-classes"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert archive_dir() == tmp_path / "home" / ".cache" / "eventlane" / "spark-classes"
    for off in ("off", "OFF", "0", "false"):
        monkeypatch.setenv(ENV, off)
        assert archive_dir() is None and plan_archive({}) is None
