"""Apache Kafka's jars for tests that run Kafka's own programs (tools, brokers) by main class.

``make kafka-jars`` (a step of ``make test-deps``) resolves ``tools/kafka/pom.xml`` with Maven
and copies every jar into ``tools/kafka/lib``; nothing is downloaded at test time.
:func:`classpath` is that directory's jars, :func:`java` a command line for one main class::

    subprocess.run(java("org.apache.kafka.tools.TopicCommand", "--bootstrap-server", b, "--list"))
    subprocess.Popen(java("kafka.Kafka", "server.properties"))   # a broker (KRaft)

``python tools/kafka/jars.py`` prints the classpath (``fetch`` runs Maven first).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
LIB = HERE / "lib"
KAFKA_VERSION = "4.4.0"
FAST_START = ("-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC", "-Xshare:auto")
"""JVM options that halve a short-lived tool's start on a small machine (a broker omits them)."""


class MissingJarsError(RuntimeError):
    """Kafka's jars are not fetched: run ``make kafka-jars``."""


def fetch() -> None:
    """Resolve the pom and copy the jars into :data:`LIB` (what ``make kafka-jars`` runs)."""
    if shutil.which("mvn") is None:
        raise MissingJarsError("Maven (mvn) is not installed: run `make test-deps`")
    subprocess.run(
        [
            "mvn",
            "-q",
            "-B",
            "-f",
            str(HERE / "pom.xml"),
            "dependency:copy-dependencies",
            "-DoutputDirectory=lib",
            "-DincludeScope=runtime",
        ],
        check=True,
    )


def classpath() -> str:
    """The ``-cp`` value holding Kafka's jars, or :class:`MissingJarsError`."""
    jars = sorted(LIB.glob("*.jar"))
    if not any(j.name == f"kafka-tools-{KAFKA_VERSION}.jar" for j in jars):
        raise MissingJarsError(
            f"Kafka {KAFKA_VERSION}'s jars are not in {LIB}: run `make kafka-jars`"
        )
    return ":".join(str(j) for j in jars)


def java(main: str, *args: str, fast_start: bool = True) -> list[str]:
    """The command line running ``main`` (a class name) with Kafka's jars."""
    java_bin = shutil.which("java")
    if java_bin is None:
        raise MissingJarsError("java is not installed: run `make test-deps`")
    return [java_bin, *(FAST_START if fast_start else ()), "-cp", classpath(), main, *args]


if __name__ == "__main__":
    if sys.argv[1:] == ["fetch"]:
        fetch()
    print(classpath())
