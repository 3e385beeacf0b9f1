"""A rebuild on a real standalone Spark cluster (a master and a worker started with
``spark-class``) whose only worker is killed (``kill -9`` of its process group: the worker,
its executor and their Python workers) while the job's tasks run.

Spark alone then logs one "Lost executor" line and waits for another worker without end:
before :mod:`eventlane.replay.executors` the rebuild stood still with no word of why. Now
the driver says so within :data:`~eventlane.replay.executors.WARN_AFTER_S` and gives up
after ``EVENTLANE_SPARK_EXECUTOR_WAIT`` seconds (a retriable error, nothing written); a
worker that joins in time gets the lost tasks, and the result equals the local engine's.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pyspark
import pytest

from eventlane.errors import ConfigError
from eventlane.log.processes import free_ports
from eventlane.replay.checksum import compare, file_checksums
from eventlane.replay.executors import DEFAULT_WAIT_S, WAIT_ENV, wait_limit
from eventlane.replay.rebuild import rebuild
from tests.replay import replay_app
from tests.replay.conftest import APP, ROOT, GeneratedLog, child_env, make_history

pytestmark = pytest.mark.spark

SPARK_HOME = Path(pyspark.__file__).parent


def _wait(what: str, cond: Callable[[], bool], timeout: float, logs: list[Path]) -> None:
    """Poll ``cond`` until true; after ``timeout`` fail with the tails of ``logs``."""
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            tails = "\n".join(f"--- {p}\n{p.read_text(errors='replace')[-3000:]}" for p in logs)
            raise AssertionError(f"not within {timeout} s: {what}\n{tails}")
        time.sleep(0.2)


@dataclass
class Cluster:
    """A standalone master on loopback; workers started and killed by the tests."""

    url: str
    root: Path
    master_log: Path
    properties: Path
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    workers: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def env(self, **extra: str) -> dict[str, str]:
        spark = {
            "SPARK_HOME": str(SPARK_HOME),
            "SPARK_LOCAL_IP": "127.0.0.1",
            "PYSPARK_PYTHON": sys.executable,
        }
        return child_env(**{**spark, **extra})

    def spawn(self, args: list[str], log: Path, **env: str) -> subprocess.Popen[bytes]:
        with log.open("ab") as sink:
            proc = subprocess.Popen(
                args,
                env=self.env(**env),
                stdout=sink,
                stderr=sink,
                stdin=subprocess.DEVNULL,
                cwd=ROOT,
                start_new_session=True,  # a process group: the JVM and its children
            )
        self.procs.append(proc)
        return proc

    def registered(self) -> int:
        return self.master_log.read_text(errors="replace").count("Registering worker")

    def worker(self, **env: str) -> subprocess.Popen[bytes]:
        """A worker with one core (``env``: more of its environment); returns once the
        master registered it."""
        before = self.registered()
        n = len(self.procs)
        proc = self.spawn(
            [
                str(SPARK_HOME / "bin" / "spark-class"),
                "org.apache.spark.deploy.worker.Worker",
                self.url,
                "--host",
                "127.0.0.1",
                "--cores",
                "1",
                "--memory",
                "1g",
                "--webui-port",
                "0",
                "--work-dir",
                str(self.root / f"work-{n}"),
                "--properties-file",
                str(self.properties),
            ],
            self.root / f"worker-{n}.log",
            **env,
        )
        _wait("the worker registered", lambda: self.registered() > before, 90, [self.master_log])
        self.workers.append(proc)
        return proc

    def rebuild(
        self, history: GeneratedLog, projection: str, out: Path, **env: str
    ) -> tuple[subprocess.Popen[bytes], Path]:
        """``eventlane rebuild`` of ``projection`` into ``out`` on this cluster, in the
        background; the process and the file its output goes to."""
        log = out.with_suffix(".log")
        args = ["--data", str(history.data), "rebuild", APP, "-p", projection]
        args += ["--master", self.url, "--output", str(out)]
        return self.spawn([sys.executable, "-m", "eventlane.cli", *args], log, **env), log

    def stop_workers(self) -> None:
        for proc in self.workers:
            if proc.poll() is None:
                self.kill(proc)
        self.workers.clear()

    @staticmethod
    def kill(proc: subprocess.Popen[bytes]) -> None:
        """``kill -9`` of the process group: the JVM, its executors and Python workers."""
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                self.kill(proc)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    root = tmp_path_factory.mktemp("standalone")
    properties = root / "spark.properties"
    properties.write_text("spark.master.rest.enabled false\nspark.ui.enabled false\n")
    port, ui = free_ports(2)
    cluster = Cluster(f"spark://127.0.0.1:{port}", root, root / "master.log", properties)
    try:
        cluster.spawn(
            [
                str(SPARK_HOME / "bin" / "spark-class"),
                "org.apache.spark.deploy.master.Master",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--webui-port",
                str(ui),
                "--properties-file",
                str(properties),
            ],
            cluster.master_log,
        )
        _wait(
            "the master is ALIVE",
            lambda: "New state: ALIVE" in cluster.master_log.read_text(errors="replace"),
            90,
            [cluster.master_log],
        )
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(autouse=True)
def _no_worker_left(request: pytest.FixtureRequest) -> Iterator[None]:
    """Each test starts the workers it needs and none is left for the next."""
    yield
    if "cluster" in request.fixturenames:
        request.getfixturevalue("cluster").stop_workers()


@pytest.fixture(scope="module")
def history(tmp_path_factory: pytest.TempPathFactory) -> GeneratedLog:
    return make_history(tmp_path_factory.mktemp("history") / "data")


def _lose_the_worker_mid_rebuild(
    cluster: Cluster, history: GeneratedLog, out: Path, wait_s: int
) -> tuple[subprocess.Popen[bytes], Path]:
    """Start a worker and ``eventlane rebuild`` of ``slow_sales`` on the cluster (in the
    background); once one of its tasks has read records (its progress file), kill the
    worker. The rebuild's process and the file its output goes to."""
    worker = cluster.worker()
    proc, log = cluster.rebuild(
        history, "slow_sales", out, EVENTLANE_SPARK_EXECUTOR_WAIT=str(wait_s)
    )

    def replaying() -> bool:
        assert proc.poll() is None, log.read_text(errors="replace")[-3000:]
        files = out.parent.glob(f".{out.name}.parts-*/progress/*")
        return any(f.read_text().strip() not in ("", "0") for f in files)

    _wait("a task replays", replaying, 120, [log, cluster.master_log])
    cluster.kill(worker)
    return proc, log


def test_a_cluster_that_lost_its_only_worker_is_said_so_and_given_up_on(
    cluster: Cluster, history: GeneratedLog, tmp_path: Path
) -> None:
    out = tmp_path / "sales.sqlite"
    proc, log = _lose_the_worker_mid_rebuild(cluster, history, out, wait_s=20)
    killed = time.monotonic()
    try:
        code = proc.wait(timeout=120)
    except subprocess.TimeoutExpired:
        raise AssertionError(
            "the rebuild still waits two minutes after its cluster lost every worker:\n"
            + log.read_text(errors="replace")[-3000:]
        ) from None
    took = time.monotonic() - killed
    text = log.read_text(errors="replace")
    assert code == 1, text[-3000:]
    assert "the Spark job has no executor" in text and "waiting for one" in text, text[-3000:]
    error = next(line for line in text.splitlines() if line.startswith("Error:"))
    assert "had no executor for" in error and cluster.url in error, error
    assert "retriable" in error and "EVENTLANE_SPARK_EXECUTOR_WAIT=20" in error, error
    assert 20 <= took < 90, took
    assert not out.exists()
    time.sleep(2)  # a task the cancel did not reach would have written by now
    assert not list(tmp_path.glob(".sales.sqlite.parts-*"))


def test_a_worker_that_joins_in_time_gets_the_lost_tasks_and_the_result_is_exact(
    cluster: Cluster, history: GeneratedLog, tmp_path: Path
) -> None:
    out = tmp_path / "sales.sqlite"
    proc, log = _lose_the_worker_mid_rebuild(cluster, history, out, wait_s=300)
    _wait(
        "the warning",
        lambda: "the Spark job has no executor" in log.read_text(errors="replace"),
        60,
        [log],
    )
    cluster.worker()
    code = proc.wait(timeout=240)
    text = log.read_text(errors="replace")
    assert code == 0, text[-3000:]
    assert "the Spark job has executors again" in text, text[-3000:]
    local = tmp_path / "local.sqlite"
    with replay_app.app.open(history.data, create_topics=False) as runtime:
        rebuild(runtime, "sales", engine="local", output=local)
    differ = [d.table for d in compare(file_checksums(out), file_checksums(local)) if not d.equal]
    assert differ == []


def test_executors_that_cannot_import_the_application_are_named_as_the_cause(
    cluster: Cluster, history: GeneratedLog, tmp_path: Path
) -> None:
    """A cluster whose Python lacks eventlane (a worker without the project on its
    ``PYTHONPATH``, and a bare virtual environment as the executors' Python): the
    error line says what the executors lack and where the docs say how to ship it, not only
    Spark's ``ModuleNotFoundError``."""
    bare = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True)
    cluster.worker(PYTHONPATH="")
    out = tmp_path / "sales.sqlite"
    # the executors run the bare environment's Python
    proc, log = cluster.rebuild(history, "sales", out, PYSPARK_PYTHON=str(bare / "bin" / "python"))
    assert proc.wait(timeout=180) == 1, log.read_text(errors="replace")[-3000:]
    text = log.read_text(errors="replace")
    error = next(line for line in text.splitlines() if line.startswith("Error:"))
    assert "No module named" in error, error
    assert "the executors' Python cannot import it" in error and "docs/spark.md" in error, error
    assert not out.exists()


def test_the_wait_is_a_positive_number_of_seconds(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(WAIT_ENV, raising=False)
    assert wait_limit() == DEFAULT_WAIT_S
    monkeypatch.setenv(WAIT_ENV, "inf")
    assert wait_limit() == float("inf")
    monkeypatch.setenv(WAIT_ENV, " 45 ")
    assert wait_limit() == 45
    for bad in ("0", "-3", "soon", "nan"):
        monkeypatch.setenv(WAIT_ENV, bad)
        with pytest.raises(ConfigError, match=f"{WAIT_ENV}={bad!r}: not a positive number"):
            wait_limit()
