"""A SparkSession with defaults that fit one machine, and the ``eventlane`` data source.

Defaults (every one can be overridden by passing the ``spark.*`` key in ``conf``):

========================================  ===========================================
``spark.master``                          ``local[*]`` (``master=`` overrides; under
                                          ``spark-submit``, its ``--master``)
``spark.ui.enabled``                      ``false``
``spark.driver.memory``                   ``1g`` (records never reach the driver)
``spark.sql.shuffle.partitions``          twice the local cores (4 on 2 cores)
``spark.python.worker.reuse``             ``true``
``spark.sql.execution.arrow.pyspark.enabled``  ``true``
log level                                 ``WARN`` (a log4j2 file set at JVM start)
========================================  ===========================================

In local mode the environment the JVM and its Python workers inherit is prepared first:
``PYSPARK_PYTHON`` (when unset) is this interpreter, so workers import the same packages
(pyarrow, the application); ``SPARK_LOCAL_IP`` is ``127.0.0.1``; and the directories on this
process's ``sys.path`` that are not part of the Python installation (the project root, a
benchmark directory) are appended to ``PYTHONPATH``, so the application module a driver can
import, a worker can import too. On a cluster, ship the application as a package or with
``--py-files`` instead (see ``docs/spark.md``).

The master is checked before a JVM starts: :func:`validate_master` refuses a string Spark
would not understand (``local[x]``) with a :class:`~eventlane.errors.ConfigError`, and for a
``spark://host:port`` master one of its hosts must accept a TCP connection within
``EVENTLANE_SPARK_CONNECT_TIMEOUT`` seconds (default 10), else a
:class:`~eventlane.errors.ReplayError` says so (Spark itself would wait about a minute, then
print pages of Java traces). A session that still fails to start is reported as one
``ReplayError`` naming the master.

A session is process-wide: once the JVM runs, JVM settings (``spark.driver.memory``, Java
options) of a later call are ignored, as ``SparkSession.builder.getOrCreate`` does.
"""

from __future__ import annotations

import os
import re
import socket
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from eventlane.errors import ConfigError, ReplayError
from eventlane.observability import get_logger
from eventlane.replay.class_archive import Archive, keep_when_written, plan_archive

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = get_logger("eventlane.replay")

__all__ = [
    "DEFAULT_CONF",
    "REBUILD_JVM_OPTIONS",
    "is_local",
    "rebuild_conf",
    "register_source",
    "spark_session",
    "validate_master",
]

_LOCAL = re.compile(r"local(\[(\*|[1-9]\d*)(,\s*[1-9]\d*)?\])?")
_LOCAL_CLUSTER = re.compile(r"local-cluster\[[1-9]\d*,\s*[1-9]\d*,\s*[1-9]\d*\]")
_HOST_PORT = re.compile(r"[A-Za-z0-9._-]+:\d{1,5}")
MASTER_FORMS = (
    "local, local[N], local[*], local[N,F], spark://HOST:PORT[,HOST:PORT], yarn, k8s://URL"
)

DEFAULT_CONF: Mapping[str, str] = {
    "spark.app.name": "eventlane",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.driver.memory": "1g",
    "spark.python.worker.reuse": "true",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    "spark.sql.adaptive.enabled": "true",
}

_LOG4J = """\
rootLogger.level = warn
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{HH:mm:ss} %p %c{1}: %m%n
logger.hadoop.name = org.apache.hadoop
logger.hadoop.level = error
logger.spark.name = org.apache.spark
logger.spark.level = warn
logger.netty.name = io.netty
logger.netty.level = error
"""


def is_local(master: str) -> bool:
    return master == "local" or master.startswith("local[")


def validate_master(master: str) -> str:
    """``master`` if Spark understands it, else a :class:`ConfigError` listing the forms."""
    text = master.strip()
    ok = (
        _LOCAL.fullmatch(text) is not None
        or _LOCAL_CLUSTER.fullmatch(text) is not None
        or text == "yarn"
        or (text.startswith("k8s://") and len(text) > len("k8s://"))
        or (
            text.startswith("spark://")
            and all(_HOST_PORT.fullmatch(h) for h in text[len("spark://") :].split(","))
        )
    )
    if not ok:
        raise ConfigError(f"not a Spark master: {master!r}; use one of {MASTER_FORMS}")
    return text


def check_reachable(master: str, timeout: float | None = None) -> None:
    """For ``spark://host:port[,...]``: wait at most ``timeout`` seconds (default
    ``$EVENTLANE_SPARK_CONNECT_TIMEOUT`` or 10) for one host to accept a TCP connection."""
    if not master.startswith("spark://"):
        return
    if timeout is None:
        timeout = float(os.environ.get("EVENTLANE_SPARK_CONNECT_TIMEOUT", "10"))
    deadline = time.monotonic() + timeout
    reasons: list[str] = []
    while True:
        reasons.clear()
        for hostport in master[len("spark://") :].split(","):
            host, _, port = hostport.rpartition(":")
            left = max(0.1, deadline - time.monotonic())
            try:
                socket.create_connection((host, int(port)), timeout=min(left, 2.0)).close()
                return
            except OSError as exc:
                reasons.append(f"{hostport}: {exc.strerror or exc}")
        if time.monotonic() >= deadline:
            raise ReplayError(
                f"cannot reach Spark master {master} after {timeout:g} s ({'; '.join(reasons)});"
                " is the master running? (local mode needs no master: --master 'local[2]')"
            )
        time.sleep(min(0.5, max(0.0, deadline - time.monotonic())))


def _local_cores(master: str) -> int:
    inner = master[len("local[") : -1] if master.startswith("local[") else "1"
    first = inner.split(",")[0].strip()
    return (os.cpu_count() or 1) if first == "*" else max(1, int(first))


def _extra_python_path() -> list[str]:
    prefixes = {os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)}
    out = []
    for entry in sys.path:
        path = os.path.realpath(entry or os.getcwd())
        if not os.path.isdir(path) or any(path.startswith(p + os.sep) for p in prefixes):
            continue
        if path not in out:
            out.append(path)
    return out


def _log4j_file() -> Path:
    path = Path(tempfile.gettempdir()) / f"eventlane-log4j2-{os.getuid()}.properties"
    if not path.exists() or path.read_text() != _LOG4J:
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(_LOG4J)
        os.replace(tmp, path)
    return path


def prepare_local_environment() -> None:
    """The environment a local-mode JVM and its Python workers must inherit (see above)."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    current = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    extra = [p for p in _extra_python_path() if p not in current]
    if extra:
        os.environ["PYTHONPATH"] = os.pathsep.join(current + extra)


WORKER_DAEMON = "eventlane.replay.worker_daemon"
"""``spark.python.daemon.module`` of a local rebuild session (:func:`spark_session`)."""

REBUILD_JVM_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
"""Java options of a session a rebuild starts for itself (the CLI's ``eventlane rebuild``).

A rebuild's records never enter the JVM (tasks read, decode and write in their Python
workers; the JVM schedules tasks and returns small results), so the optimising JIT compiler
and parallel GC threads are start-up cost with nothing to pay it back: with the client JIT
only and the serial collector, starting a session, running a job and stopping took 17.7-18.0
s of CPU instead of 33.3-33.8 s (perf stat, 2 cores, load 10-20). Not set on sessions given
to a rebuild or started by :func:`spark_session` for DataFrames (Spark SQL over
``event_frame`` runs in the JVM, where the optimising compiler pays)."""


def rebuild_conf(conf: Mapping[str, str] | None) -> dict[str, str]:
    """``conf`` with :data:`REBUILD_JVM_OPTIONS` for the driver and the executors, unless it
    sets their Java options itself.

    >>> rebuild_conf({"spark.executor.memory": "2g"})["spark.driver.extraJavaOptions"]
    '-XX:TieredStopAtLevel=1 -XX:+UseSerialGC'
    >>> rebuild_conf({"spark.driver.extraJavaOptions": "-Dx=1"})["spark.driver.extraJavaOptions"]
    '-Dx=1'
    """
    out = dict(conf or {})
    for key in ("spark.driver.extraJavaOptions", "spark.executor.extraJavaOptions"):
        out.setdefault(key, REBUILD_JVM_OPTIONS)
    return out


def spark_session(
    master: str | None = None,
    conf: Mapping[str, str] | None = None,
    *,
    app_name: str | None = None,
    rebuild: bool = False,
) -> SparkSession:
    """Get or start the process's SparkSession, with the ``eventlane`` data source
    registered (``spark.read.format("eventlane")``).

    ``rebuild=True``: a session for a rebuild, whose records never enter the JVM:
    :func:`rebuild_conf`'s Java options; in local mode the Python workers forked from
    :mod:`~eventlane.replay.worker_daemon` (the replay path imported once; on a cluster an
    executor's Python may get eventlane only with the tasks) and, when this call starts the
    JVM, the set-up's class archive (:mod:`~eventlane.replay.class_archive`); and no data
    source (registering the first Python data source makes Spark start a Python process
    that looks for others, ~0.6 s of CPU; the typed frames register it on any session)."""
    # pyspark (an optional extra) is imported only when a session is wanted
    from pyspark import SparkContext  # noqa: PLC0415

    settings = dict(DEFAULT_CONF)
    settings.update(rebuild_conf(conf) if rebuild else (conf or {}))
    if master is not None:
        settings["spark.master"] = master
    submitted = "PYSPARK_GATEWAY_PORT" in os.environ  # under spark-submit: its --master rules
    if not submitted:
        settings.setdefault("spark.master", os.environ.get("SPARK_MASTER", "local[*]"))
    if app_name is not None:
        settings["spark.app.name"] = app_name
    chosen = settings.get("spark.master", "")
    if chosen:
        chosen = settings["spark.master"] = validate_master(chosen)
        check_reachable(chosen)
    if is_local(chosen):
        prepare_local_environment()
        settings.setdefault("spark.sql.shuffle.partitions", str(2 * _local_cores(chosen)))
        settings.setdefault("spark.driver.host", "127.0.0.1")
        settings.setdefault("spark.driver.bindAddress", "127.0.0.1")
    archive = None
    if rebuild and is_local(chosen):
        settings.setdefault("spark.python.daemon.module", WORKER_DAEMON)
        if not submitted and SparkContext._gateway is None:
            archive = plan_archive(settings)
    log4j = f"-Dlog4j2.configurationFile=file:{_log4j_file()}"
    java = settings.get("spark.driver.extraJavaOptions", "")
    if "log4j2.configurationFile" not in java:
        settings["spark.driver.extraJavaOptions"] = f"{java} {log4j}".strip()
    try:
        try:
            spark = _get_or_create(settings, archive)
        except Exception as exc:
            if archive is None:
                raise
            log.warning(  # the archive must never cost the session: once more without
                "Spark did not start with the JVM class archive; starting it without",
                archive=str(archive.path),
                error=_first_line(exc),
            )
            archive = None
            spark = _get_or_create(settings, None)
    except Exception as exc:  # py4j/JVM failures: one line naming the master
        raise ReplayError(
            f"cannot start Spark with master {chosen or '?'!r}: {_first_line(exc)}"
        ) from exc
    if archive is not None:
        keep_when_written(archive)
    spark.sparkContext.setLogLevel("WARN")
    if not rebuild:
        register_source(spark)
    return spark


def _get_or_create(settings: Mapping[str, str], archive: Archive | None) -> SparkSession:
    """The session of ``settings``; a JVM it starts uses ``archive`` (its options go first:
    they turn the JVM's log outputs off and on again, the driver's own may add some)."""
    from pyspark.sql import SparkSession  # noqa: PLC0415

    options = dict(settings)
    if archive is not None:
        java = options.get("spark.driver.extraJavaOptions", "")
        options["spark.driver.extraJavaOptions"] = f"{archive.java_options} {java}".strip()
    builder = SparkSession.builder
    for key, value in options.items():
        builder = builder.config(key, value)
    return builder.getOrCreate()


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def register_source(spark: SparkSession) -> None:
    """Register the ``eventlane`` data source on ``spark`` unless it has it (registering
    again would log Spark's "replaced a previously registered data source" warning).
    :func:`spark_session` does it, and the typed frames for any session they get."""
    from eventlane.replay.datasource import EventlaneDataSource  # noqa: PLC0415

    jsession = getattr(spark, "_jsparkSession", None)  # none on a Spark Connect session
    if jsession is not None:
        manager = jsession.sessionState().dataSourceManager()
        if manager.dataSourceExists(EventlaneDataSource.name()):
            return
    spark.dataSource.register(EventlaneDataSource)
