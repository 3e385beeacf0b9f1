"""Helpers of the console's browser tests: invoicing data, a real ``eventlane console``
process, and one real headless Chromium (Debian's ``chromium`` + ``chromium-driver``,
driven by Selenium) per module.

Screenshots for docs/console.md are written to docs/img/console-*.png only when
``EVENTLANE_SCREENSHOTS=1`` (``make screenshots``).
"""

from __future__ import annotations

import contextlib
import copy
import http.cookiejar
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from selenium import webdriver
from selenium.common.exceptions import (
    NoSuchElementException,
    StaleElementReferenceException,
    WebDriverException,
)
from selenium.webdriver.chrome.service import Service

from eventlane.consumer.group import GroupConsumer
from eventlane.log import LogStore
from eventlane.projection import Runner, open_readmodel
from example_apps.invoicing import app
from example_apps.invoicing.workload import Workload

APP = "example_apps.invoicing:app"
ROOT = Path(__file__).resolve().parents[2]
SHOTS = ROOT / "docs" / "img"
CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
PROJECTOR = "orders_by_status"


def screenshots_wanted() -> bool:
    return os.environ.get("EVENTLANE_SCREENSHOTS") == "1"


def seed(data: Path, orders: int = 30, run: int = 1) -> None:
    """A seeded invoicing workload written through the app (orders, customers)."""
    with app.open(data) as runtime:
        for name in app.projectors:
            open_readmodel(runtime, name, migrate=True).close()
        for c in Workload(orders=orders, seed=5, run=run).commands():
            runtime.execute(c.cls, c.aggregate_id, c.action, create=c.create)


def consume_all_and_commit(log: LogStore, group: str, topic: str = "orders") -> int:
    """An eventlane group member that reads every record of ``topic``, commits and leaves
    (an inactive group with committed offsets); returns how many records the topic holds."""
    consumer = GroupConsumer(log, group_id=group, topics=[topic], auto_offset_reset="earliest")
    total = sum(log.offsets(topic, p).hwm for p in range(log.partition_count(topic)))
    seen = 0
    for _ in range(200):
        seen += len(consumer.poll(timeout=0.2))
        if seen >= total:
            break
    consumer.commit()
    consumer.close()
    return total


def projector_lag(data: Path, name: str = PROJECTOR) -> int:
    with app.open(data, create_topics=False) as runtime:
        return int(runtime.status(name)["lag"])


def run_projector_until_caught_up(data: Path, name: str = PROJECTOR, timeout: float = 90) -> None:
    runner = Runner(APP, name, data, workers=1, session_timeout_ms=2000)
    runner.start()
    try:
        deadline = time.monotonic() + timeout
        while projector_lag(data, name):
            assert time.monotonic() < deadline, "projector did not catch up"
            runner.supervise_once()
            time.sleep(0.2)
        time.sleep(1.5)  # one group commit interval: the group's committed offsets too
    finally:
        runner.stop()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Console:
    """A running ``eventlane console`` process, and an HTTP client of it that behaves as the
    console's own pages do: it keeps the session cookie and sends the session's CSRF token
    (from ``/api/session``) with every state change, and the access token where one is set."""

    def __init__(
        self, data: Path, *args: str, token: str | None = None, env: dict[str, str] | None = None
    ) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.token = token
        self.csrf: str | None = None
        self.cookies = http.cookiejar.CookieJar()
        self.opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(self.cookies))
        self.log_path = data.parent / f"console-{self.port}.log"
        self._log = self.log_path.open("wb")
        cmd = [
            sys.executable,
            "-c",
            "from eventlane.cli import main; main()",
            "console",
            "--data",
            str(data),
            "--port",
            str(self.port),
            "--lag-interval",
            "0.5",
            *args,
        ]
        self.proc = subprocess.Popen(
            cmd, stdout=self._log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})}
        )
        deadline = time.monotonic() + 90
        while True:
            try:
                self.get("/api/overview")
                break
            except (urllib.error.URLError, ConnectionError):
                assert self.proc.poll() is None, self.log_path.read_text()
                assert time.monotonic() < deadline, "console did not start"
                time.sleep(0.2)

    def request(
        self,
        method: str,
        path: str,
        body: bytes | None = None,
        headers: dict[str, str] | None = None,
    ) -> tuple[int, Any]:
        req = urllib.request.Request(self.url + path, data=body, method=method)
        if body is not None:
            req.add_header("content-type", "application/json")
        if self.token is not None:
            req.add_header("authorization", f"Bearer {self.token}")
        if method not in ("GET", "HEAD"):
            if self.csrf is None:
                status, doc = self.request("GET", "/api/session")
                self.csrf = doc["csrf_token"] if status == 200 else ""
            req.add_header("x-csrf-token", self.csrf)
        for name, value in (headers or {}).items():
            req.add_header(name, value)
        try:
            with self.opener.open(req, timeout=60) as resp:
                status, raw = resp.status, resp.read()
        except urllib.error.HTTPError as err:
            status, raw = err.code, err.read()
        try:
            return status, orjson.loads(raw)
        except orjson.JSONDecodeError:
            return status, raw.decode("utf-8", "replace")

    def client(self) -> Console:
        """Another client of the same console: its own cookie jar, so its own session."""
        other = copy.copy(self)
        other.csrf = None
        other.cookies = http.cookiejar.CookieJar()
        other.opener = urllib.request.build_opener(
            urllib.request.HTTPCookieProcessor(other.cookies)
        )
        return other

    def get(self, path: str) -> Any:
        status, doc = self.request("GET", path)
        assert status == 200, (path, status, doc)
        return doc

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()


@contextlib.contextmanager
def console_process(
    data: Path, *args: str, token: str | None = None, env: dict[str, str] | None = None
) -> Iterator[Console]:
    console = Console(data, *args, token=token, env=env)
    try:
        yield console
    finally:
        console.stop()


@contextlib.contextmanager
def chromium(*extra: str) -> Iterator[Any]:
    """One headless Chromium driven by Selenium, with a fresh profile (``extra``: more
    command-line switches, e.g. ``--host-resolver-rules=MAP evil.example 127.0.0.1``)."""
    if not (Path(CHROMIUM).exists() and Path(CHROMEDRIVER).exists()):
        pytest.fail("Debian's chromium and chromium-driver are missing: run `make test-deps`")
    profile = tempfile.mkdtemp(prefix="eventlane-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--window-size=1400,1000",
        f"--user-data-dir={profile}",
        *extra,
    ):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(60)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def shot(driver: Any, name: str) -> None:
    """docs/img/console-NAME.png, only when screenshots are asked for."""
    if screenshots_wanted():
        SHOTS.mkdir(parents=True, exist_ok=True)
        driver.save_screenshot(str(SHOTS / f"console-{name}.png"))


def wait_for(predicate: Any, timeout: float = 30.0, interval: float = 0.05) -> Any:
    """Poll ``predicate`` until truthy; an element replaced meanwhile (a page load, an htmx
    swap) counts as not yet. Chromedriver reports some of those replacements not as a stale
    element but as an "unknown error" whose inspector message says the node no longer
    belongs to the document (seen in CI: a page load between finding #page-meta and reading
    its text); that one counts as not yet too, any other driver error is raised."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = predicate()
        except (NoSuchElementException, StaleElementReferenceException):
            value = None
        except WebDriverException as e:
            if "does not belong to the document" not in (e.msg or ""):
                raise
            value = None
        if value:
            return value
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(interval)


__all__ = [
    "APP",
    "Console",
    "free_port",
    "PROJECTOR",
    "chromium",
    "console_process",
    "projector_lag",
    "run_projector_until_caught_up",
    "seed",
    "shot",
    "wait_for",
]
