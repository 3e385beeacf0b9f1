"""A real ``eventlane serve --kafka`` process per test module, on a free loopback port."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from eventlane.log import LogStore


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class KafkaProcess:
    """One listener process: start, kill -9, restart on the same data and port."""

    def __init__(self, data: Path, port: int, *extra: str) -> None:
        self.data = data
        self.port = port
        self.extra = extra
        self.proc: subprocess.Popen[bytes] | None = None
        self.stderr = (
            Path(os.environ.get("EVENTLANE_KAFKA_TEST_LOGS", str(data.parent)))
            / f"kafka-{port}.log"
        )

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> None:
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        with open(self.stderr, "ab") as err:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-c",
                    "from eventlane.cli import main; main()",
                    "--data",
                    str(self.data),
                    "serve",
                    "--kafka",
                    self.bootstrap,
                    *self.extra,
                ],
                stdout=subprocess.DEVNULL,
                stderr=err,
                env=env,
            )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"listener exited: {self.stderr.read_text()[-2000:]}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("listener did not start")

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()


@pytest.fixture(scope="module")
def kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaProcess]:
    data = tmp_path_factory.mktemp("kafka") / "data"
    server = KafkaProcess(data, free_port())
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def read_log(kafka: KafkaProcess) -> Iterator[LogStore]:
    log = LogStore(kafka.data)
    try:
        yield log
    finally:
        log.close()
