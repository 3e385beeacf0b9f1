"""The JVM class archive of the Spark sessions a rebuild starts: a shorter JVM start.

A Spark driver loads and verifies some ten thousand classes each time it starts. HotSpot's
class data sharing maps them, already parsed and verified, from an archive instead: a
rebuild session's fixed cost (start, one job, stop) fell from ~6.6 to ~4.1 s of CPU on 2
cores (``benchmarks/bench_rebuild_cpu.py``). The first session of a set-up writes the
archive when its JVM exits (Java's ``-XX:ArchiveClassesAtExit``, ~10 s more, once); every
later one maps it (``-XX:SharedArchiveFile``).

Invariants:

* An archive is used only whole: the JVM writes it to ``<name>.<pid>.tmp``; the Python
  process that started that JVM renames it into place after the JVM has exited with status
  0 (:func:`keep_when_written`, at interpreter exit). A JVM killed while writing leaves a
  ``.tmp`` file no JVM reads; a later start removes it once it is an hour old.
* Its name is a digest of what the archive depends on: the ``java`` binary (path, size,
  modification time), Spark's jars (names and sizes), the driver's class-path additions and
  Java options. Another set-up gets its own archive. One the JVM finds unusable anyway
  (damaged, or made by another JDK build) is skipped by the JVM itself, which then loads
  classes as it always does; a JVM that does not start with the archive's options is
  started again without them (:func:`~eventlane.replay.session.spark_session`): the
  archive can make a start shorter, never make it fail.
* The JVM's own warnings go to stderr, never stdout (data only); the archive's only at
  error level (writing one warns of each of the hundreds of classes it leaves out).
* Used only where a new local-mode JVM is started by this process (not under
  ``spark-submit``, not when a session already runs), and never for executors on other
  hosts (their class paths differ).

``EVENTLANE_SPARK_CLASS_ARCHIVE``: the directory of the archives (default
``$XDG_CACHE_HOME/eventlane/spark-classes``, else ``~/.cache/eventlane/spark-classes``), or
``off``. An archive takes ~120-150 MB; one no session used for 30 days is removed when
another is written (a JDK upgrade or new Java options make a new one); deleting the
directory is always safe.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import os
import shutil
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path
from typing import NamedTuple

from eventlane.observability import get_logger

__all__ = ["ENV", "Archive", "archive_dir", "keep_when_written", "plan_archive"]

log = get_logger("eventlane.replay")

ENV = "EVENTLANE_SPARK_CLASS_ARCHIVE"
OFF = frozenset({"off", "0", "false", "no"})
JVM_LOG = "-Xlog:disable -Xlog:all=warning:stderr -Xlog:cds*=error:stderr"
"""Java's unified logging writes warnings to stdout by default: to stderr instead."""
SAVE_WAIT_S = 120.0
"""How long interpreter exit waits for a JVM writing its archive."""
STALE_TMP_S = 3600.0
UNUSED_S = 30 * 86_400.0
"""An archive no session mapped for this long is removed when another one is written."""


class Archive(NamedTuple):
    """Where a session's JVM finds (``use``) or writes (``tmp``, then ``path``) its archive."""

    path: Path
    tmp: Path | None
    """Set when the archive does not exist yet: this JVM writes it here at its exit."""

    @property
    def java_options(self) -> str:
        """Options to put before the driver's own (``-Xlog:disable`` would drop theirs)."""
        if self.tmp is None:
            return f"-XX:SharedArchiveFile={self.path} {JVM_LOG}"
        return f"-XX:ArchiveClassesAtExit={self.tmp} {JVM_LOG}"


def archive_dir() -> Path | None:
    """The archives' directory (module docstring), or None when turned off."""
    value = os.environ.get(ENV, "").strip()
    if value.lower() in OFF:
        return None
    if value:
        return Path(value)
    cache = os.environ.get("XDG_CACHE_HOME")
    if not cache:
        try:
            cache = str(Path.home() / ".cache")
        except (RuntimeError, KeyError):  # no home directory (a bare service account)
            return None
    return Path(cache) / "eventlane" / "spark-classes"


def plan_archive(settings: Mapping[str, str]) -> Archive | None:
    """The archive a new local driver JVM with ``settings`` uses or writes; None when there
    is none to use (turned off, no ``java`` or Spark found, the directory not writable)."""
    folder = archive_dir()
    if folder is None:
        return None
    digest = _digest(settings)  # (lists Spark's jars: only when archives are on)
    if digest is None:
        return None
    try:
        folder.mkdir(parents=True, exist_ok=True)
        _remove_older(folder, "*.tmp", STALE_TMP_S)  # a JVM killed while writing
    except OSError as exc:
        log.debug("no JVM class archive: no usable directory", path=str(folder), error=str(exc))
        return None
    path = folder / f"spark-{digest}.jsa"
    if path.is_file():
        with contextlib.suppress(OSError):
            os.utime(path)  # its modification time says when it was last used
        return Archive(path, None)
    if not os.access(folder, os.W_OK):
        return None
    _remove_older(folder, "spark-*.jsa", UNUSED_S)  # (a JVM mapping one keeps its pages)
    return Archive(path, path.with_name(f"{path.name}.{os.getpid()}.tmp"))


def keep_when_written(archive: Archive) -> None:
    """At interpreter exit: stop the session, let its JVM exit (it writes the archive as it
    does) and move the archive into place if the JVM exited cleanly."""
    if archive.tmp is not None:
        atexit.register(_keep, archive.path, archive.tmp)


def _keep(path: Path, tmp: Path) -> None:
    from pyspark import SparkContext  # noqa: PLC0415 - only once a session was started

    gateway = SparkContext._gateway
    proc: subprocess.Popen[bytes] | None = getattr(gateway, "proc", None)
    if proc is None:
        return
    with contextlib.suppress(Exception):
        if SparkContext._active_spark_context is not None:
            SparkContext._active_spark_context.stop()
    log.info("writing the JVM class archive for shorter Spark starts (once)", path=str(path))
    try:
        if proc.stdin is not None:
            proc.stdin.close()  # the gateway JVM exits when its stdin ends
        code = proc.wait(SAVE_WAIT_S)
    except (OSError, subprocess.TimeoutExpired):
        code = None
    try:
        if code == 0 and tmp.is_file() and tmp.stat().st_size > 0:
            os.replace(tmp, path)
        else:
            tmp.unlink(missing_ok=True)
    except OSError:
        pass


def _digest(settings: Mapping[str, str]) -> str | None:
    java = _java()
    jars = _spark_jars()
    if java is None or jars is None:
        return None
    h = hashlib.sha256()
    for part in (
        java,
        *jars,
        settings.get("spark.driver.extraClassPath", ""),
        settings.get("spark.driver.extraJavaOptions", ""),
    ):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()[:16]


def _java() -> str | None:
    home = os.environ.get("JAVA_HOME")
    found = str(Path(home) / "bin" / "java") if home else shutil.which("java")
    if found is None:
        return None
    try:
        real = os.path.realpath(found)
        st = os.stat(real)
    except OSError:
        return None
    return f"{real} {st.st_size} {st.st_mtime_ns}"


def _spark_jars() -> list[str] | None:
    home = os.environ.get("SPARK_HOME")
    if not home:
        try:
            import pyspark  # noqa: PLC0415 - an optional extra
        except ImportError:
            return None
        home = str(Path(pyspark.__file__).parent)  # pip's pyspark carries its jars
    try:
        entries = sorted(os.scandir(Path(home) / "jars"), key=lambda e: e.name)
        return [f"{e.name} {e.stat().st_size}" for e in entries]
    except OSError:
        return None


def _remove_older(folder: Path, pattern: str, seconds: float) -> None:
    """Remove the files of ``folder`` matching ``pattern`` not modified for ``seconds``."""
    now = time.time()
    for path in folder.glob(pattern):
        with contextlib.suppress(OSError):
            if now - path.stat().st_mtime > seconds:
                path.unlink()
