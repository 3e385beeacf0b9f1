"""A throw-away PostgreSQL server for tests and benchmarks: ``initdb`` + ``pg_ctl`` in a
temporary directory, listening on a free loopback port only, stopped by its PID.

PostgreSQL refuses to run as root, so when this process is root the cluster belongs to a
dedicated OS user (``postgres``, Debian's package creates it) and the commands run through
``runuser``; otherwise they run as the current user. Authentication is ``trust`` on loopback
(a test cluster, reachable only from this machine). Nothing is installed here: the binaries
come from Debian's ``postgresql`` package (``make test-deps``), found under
``/usr/lib/postgresql/<version>/bin`` or on ``PATH``.

    >>> server = PostgresServer.start(Path(tmp))    # doctest: +SKIP
    >>> server.url                                  # doctest: +SKIP
    'postgresql://postgres@127.0.0.1:54321/postgres'
    >>> server.stop()                               # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import getpass
import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

__all__ = ["PostgresServer", "find_bin"]

OS_USER = "postgres"


def find_bin(name: str) -> str:
    """The path of PostgreSQL's ``name`` (``initdb``, ``pg_ctl``); newest version first."""
    root = Path("/usr/lib/postgresql")
    if root.is_dir():
        for version in sorted(root.iterdir(), key=lambda p: p.name, reverse=True):
            candidate = version / "bin" / name
            if candidate.exists():
                return str(candidate)
    found = shutil.which(name)
    if found is None:
        raise FileNotFoundError(
            f"PostgreSQL's {name} not found: install Debian's postgresql (make test-deps)"
        )
    return found


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _as_owner(cmd: list[str]) -> list[str]:
    if os.geteuid() != 0:
        return cmd
    return ["runuser", "-u", OS_USER, "--", *cmd]


@dataclass
class PostgresServer:
    """A running temporary cluster (see the module docstring)."""

    directory: Path
    port: int
    pid: int
    host: str = "127.0.0.1"

    @property
    def data(self) -> Path:
        """The cluster's data directory (``forget`` tests search its files)."""
        return self.directory / "pgdata"

    @property
    def url(self) -> str:
        user = OS_USER if os.geteuid() == 0 else getpass.getuser()
        return f"postgresql://{user}@{self.host}:{self.port}/postgres"

    @classmethod
    def start(
        cls,
        directory: Path,
        *,
        timeout: float = 60.0,
        host: str = "127.0.0.1",
        port: int | None = None,
        prefix: tuple[str, ...] = (),
        trust: str | None = None,
    ) -> PostgresServer:
        """Start a cluster listening on ``host`` (default loopback; ``port``: a free one).

        ``prefix`` runs the server under a command (``ip netns exec NS``: inside a network
        namespace of the caller's); ``trust`` (a CIDR such as ``10.211.0.0/24``) also lets
        clients of that network in without a password (``pg_hba.conf``)."""
        directory.mkdir(parents=True, exist_ok=True)
        data = directory / "pgdata"
        sockets = directory / "sock"
        sockets.mkdir(exist_ok=True)
        if os.geteuid() == 0:
            shutil.chown(directory, OS_USER)
            shutil.chown(sockets, OS_USER)
            directory.chmod(0o755)
            # the owner must reach the directory: its parents must be open for traversal
            # (give a directory outside pytest's private temporary root)
        user = OS_USER if os.geteuid() == 0 else getpass.getuser()
        subprocess.run(
            _as_owner(
                [
                    find_bin("initdb"),
                    "-D",
                    str(data),
                    "-U",
                    user,
                    "--auth=trust",
                    "--encoding=UTF8",
                    "--no-sync",
                    "--no-instructions",
                ]
            ),
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        if trust is not None:
            with (data / "pg_hba.conf").open("a") as hba:
                hba.write(f"host all all {trust} trust\n")
        port = port or _free_port()
        options = (
            f"-c listen_addresses={host} -c port={port} -c unix_socket_directories={sockets}"
            " -c fsync=off -c full_page_writes=off -c max_connections=200"
        )
        subprocess.run(
            [
                *prefix,
                *_as_owner(
                    [
                        find_bin("pg_ctl"),
                        "-D",
                        str(data),
                        "-o",
                        options,
                        "-l",
                        str(directory / "server.log"),
                        "-w",
                        "-t",
                        str(int(timeout)),
                        "start",
                    ]
                ),
            ],
            check=True,
            stdout=subprocess.DEVNULL,
        )
        pid = int((data / "postmaster.pid").read_text().split()[0])
        return cls(directory, port, pid, host)

    def stop(self, timeout: float = 30.0) -> None:
        """Fast shutdown (SIGINT to the postmaster, by PID), SIGKILL if it lingers."""
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGINT)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                os.kill(self.pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.05)
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)

    def checkpoint(self) -> None:
        """``CHECKPOINT``: flush shared buffers to the data directory's files."""
        import psycopg  # noqa: PLC0415 (the postgres extra)

        with psycopg.connect(self.url, autocommit=True) as conn:
            conn.execute("CHECKPOINT")
