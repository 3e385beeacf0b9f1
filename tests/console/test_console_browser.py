"""The console in a real headless Chromium against a real read-only ``eventlane console``
process on invoicing data: every view, search by key and by time, the aggregate view, the
live tail, lag falling to 0 while a worker runs, escaping, and read-only refusals.

One console process and one browser serve the whole module (see console_helpers).
"""

from __future__ import annotations

import http.client
import random
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import orjson
import pytest
from console_helpers import (
    APP,
    PROJECTOR,
    chromium,
    console_process,
    projector_lag,
    run_projector_until_caught_up,
    seed,
    shot,
    wait_for,
)
from selenium.common.exceptions import WebDriverException
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import Select

from eventlane.log import LogStore, Producer, ProducerRecord
from eventlane.log.partitioner import partition_for_key
from eventlane.projection import Runner
from example_apps.invoicing import app
from example_apps.invoicing.domain import CancelUnconfirmed
from example_apps.invoicing.workload import Workload

XSS = b"<script>window.__xss = 1</script><b class='bold'>bold?</b>"


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimpleNamespace]:
    data = tmp_path_factory.mktemp("console") / "data"
    seed(data, orders=30)
    run_projector_until_caught_up(data)
    log = LogStore(data)
    log.create_topic("notes", 1)
    producer = Producer(log)
    producer.send_batch(
        "notes",
        [
            ProducerRecord(b"<i>key</i>", XSS, (("event-type", b"<u>Note</u>"),)),
            ProducerRecord(b"plain", b"hello"),
        ],
    )
    with console_process(data, APP) as console, chromium() as driver:
        yield SimpleNamespace(data=data, log=log, producer=producer, console=console, b=driver)
    producer.close()
    log.close()


def events_of(log: LogStore, topic: str, key: str) -> list[tuple[int, int, dict[str, Any]]]:
    """``(offset, timestamp, value)`` of ``key``'s records, read straight from the log."""
    p = partition_for_key(key.encode(), log.partition_count(topic))
    marks = log.offsets(topic, p)
    out = []
    offset = marks.lwm
    while offset < marks.hwm:
        records, _ = log.read(topic, p, offset, upto=marks.hwm)
        out += [
            (r.offset, r.timestamp, orjson.loads(r.value)) for r in records if r.key == key.encode()
        ]
        offset = records[-1].offset + 1
    return out


def texts(b: Any, css: str) -> list[str]:
    return [e.text for e in b.find_elements(By.CSS_SELECTOR, css)]


def test_every_view_loads_in_the_browser_and_as_json(env: SimpleNamespace) -> None:
    b, url = env.b, env.console.url
    pages = {
        "/": "Overview",
        "/topics": "Topics",
        "/topics/orders": "Topic orders",
        "/topics/orders/records": "Records of orders",
        "/topics/orders/tail": "Live tail of orders",
        "/aggregates": "Aggregate",
        "/groups": "Consumer groups",
        f"/groups/{PROJECTOR}": f"Consumer group {PROJECTOR}",
        "/projectors": "Projectors",
        f"/projectors/{PROJECTOR}": f"Projector {PROJECTOR}",
        f"/projectors/{PROJECTOR}/dead-letters": f"Dead letters of {PROJECTOR}",
        "/schedules": "Schedules",
    }
    for path, title in pages.items():
        b.get(url + path)
        assert b.find_element(By.TAG_NAME, "h1").text == title, path
        assert not b.find_elements(By.ID, "error"), path
        assert b.find_element(By.ID, "mode").text == "read-only"
        assert "embedded log" in b.find_element(By.TAG_NAME, "nav").text, path
        assert "LogStore" not in b.page_source, path
        if path != "/topics/orders/tail":  # its page only opens a stream
            env.console.get("/api/overview" if path == "/" else "/api" + path)
    b.get(url + f"/readmodels/{PROJECTOR}")
    assert "orders" in b.page_source  # Datasette lists the read model's tables
    # the numbers on the overview are the log's
    b.get(url + "/")
    total = sum(
        env.log.offsets(t, p).hwm - env.log.offsets(t, p).lwm
        for t in env.log.list_topics()
        for p in range(env.log.partition_count(t))
    )
    assert b.find_element(By.ID, "n-records").text.replace(",", "") == str(total)
    shot(b, "overview")
    for name, path in (("topics", "/topics"), ("topic", "/topics/orders")):
        b.get(url + path)
        shot(b, name)


def test_schedules_view_lists_due_key_command_and_state_without_the_commands_fields(
    env: SimpleNamespace,
) -> None:
    """Three deadlines written as the app writes them (a policy's schedule, a cancel, the
    scheduler's ``fired`` record), then the page and ``/api/schedules``: one row each with
    its moment, key, command type and state; the state filter; and none of the commands'
    field values anywhere (the order ids here stand for whatever a command carries)."""
    due = 1_900_000_000_000
    with app.open(env.data) as rt:
        rt.schedule(CancelUnconfirmed("secret-order-1"), at=due, key="deadline-pending")
        rt.schedule(CancelUnconfirmed("secret-order-2"), at=due + 1000, key="deadline-cancelled")
        rt.schedule(CancelUnconfirmed("secret-order-3"), at=due - 1000, key="deadline-fired")
        assert rt.cancel_schedule("deadline-cancelled")
        fired = rt.schedules.entry("deadline-fired")
        rt.schedules.mark_fired(fired, due + 5)
    b, url = env.b, env.console.url
    b.get(url + "/schedules")
    assert b.find_element(By.TAG_NAME, "h1").text == "Schedules"
    rows = {
        row.get_attribute("data-key"): [td.text for td in row.find_elements(By.TAG_NAME, "td")]
        for row in b.find_elements(By.CSS_SELECTOR, "#schedules tr.schedule")
    }
    when = datetime.fromtimestamp(due / 1000, UTC).isoformat(timespec="milliseconds")
    assert rows["deadline-pending"] == [
        when,
        "deadline-pending",
        "CancelUnconfirmedOrder",
        "pending",
        "-",
    ]
    assert rows["deadline-cancelled"][2:4] == ["CancelUnconfirmedOrder", "cancelled"]
    assert rows["deadline-fired"][3] == "fired" and rows["deadline-fired"][4] != "-"
    keys = list(rows)  # in order of their moment
    assert (
        keys.index("deadline-fired")
        < keys.index("deadline-pending")
        < keys.index("deadline-cancelled")
    )
    assert "secret-order" not in b.page_source
    shot(b, "schedules")
    Select(b.find_element(By.ID, "s-state")).select_by_visible_text("pending")
    b.find_element(By.CSS_SELECTOR, "#schedules-form button").click()
    wait_for(lambda: "state=pending" in b.current_url)
    assert texts(b, "#schedules tr.schedule td:nth-child(4)") == ["pending"] * len(
        texts(b, "#schedules tr.schedule")
    )
    assert "deadline-pending" in texts(b, "#schedules tr.schedule td:nth-child(2)")
    api = env.console.get("/api/schedules")
    assert {r["key"]: r["state"] for r in api if r["key"].startswith("deadline-")} == {
        "deadline-pending": "pending",
        "deadline-cancelled": "cancelled",
        "deadline-fired": "fired",
    }
    assert all(
        set(r) == {"key", "due_ms", "command", "state", "fired_ms", "partition", "offset"}
        for r in api
    )
    assert b"secret-order" not in orjson.dumps(api)
    assert [r["key"] for r in env.console.get("/api/schedules?state=fired")] == ["deadline-fired"]
    status, _ = env.console.request("GET", "/api/schedules?state=nope")
    assert 400 <= status < 500


def test_api_topics_has_partition_marks_and_api_groups_has_lag(env: SimpleNamespace) -> None:
    topics = {t["name"]: t for t in env.console.get("/api/topics")}
    assert set(topics) == set(env.log.list_topics())
    for row in topics["orders"]["partition_details"]:
        marks = env.log.offsets("orders", row["partition"])
        assert (row["lwm"], row["hwm"], row["leo"]) == (marks.lwm, marks.hwm, marks.leo)
    groups = {g["group"]: g for g in env.console.get("/api/groups")}
    assert groups[PROJECTOR]["lag"] == 0
    assert groups[PROJECTOR]["state"] == "Empty"
    assert env.console.get("/api/groups?min_lag=1") == []  # filtered by lag
    assert [g["group"] for g in env.console.get("/api/groups?state=Empty&sort=lag")] == [PROJECTOR]
    assert env.console.get("/api/groups?state=Stable") == []
    status, doc = env.console.request("GET", "/api/groups?sort=password")
    assert status == 400 and "cannot sort" in doc["error"]


def test_browser_finds_an_orders_events_by_key_and_by_time(env: SimpleNamespace) -> None:
    b, url = env.b, env.console.url
    order = Workload(orders=30, seed=5, run=1).order_id(3)
    events = events_of(env.log, "orders", order)
    assert len(events) >= 2
    b.get(url + "/topics/orders/records")
    b.find_element(By.ID, "f-key").send_keys(order)
    b.find_element(By.ID, "f-go").click()
    wait_for(lambda: "index" in b.find_element(By.ID, "page-meta").text)
    rows = b.find_elements(By.CSS_SELECTOR, "#records tr.record")
    assert [int(r.get_attribute("data-offset")) for r in rows] == [e[0] for e in events]
    assert set(texts(b, "#records td.key")) == {order}
    assert "OrderPlaced" in rows[0].text  # decoded with the app's codec
    shot(b, "browse")
    # by time: start at the timestamp of the order's second event, same key
    second_offset, second_ts, _ = events[1]
    iso = datetime.fromtimestamp(second_ts / 1000, UTC).isoformat(timespec="milliseconds")
    b.get(url + "/topics/orders/records")
    b.find_element(By.ID, "f-key").send_keys(order)
    Select(b.find_element(By.ID, "f-start")).select_by_visible_text("timestamp")
    b.find_element(By.ID, "f-value").send_keys(iso)
    b.find_element(By.ID, "f-go").click()
    wait_for(lambda: "timestamp" in b.current_url)
    offsets = [
        int(r.get_attribute("data-offset"))
        for r in b.find_elements(By.CSS_SELECTOR, "#records tr.record")
    ]
    assert offsets == [e[0] for e in events if e[1] >= second_ts]
    assert second_offset in offsets  # after the first event when both have one millisecond
    assert offsets[-1] == events[-1][0]
    # filters by event type header and JSON path, through the API
    page = env.console.get("/api/topics/orders/records?partition=0&header=OrderPlaced&limit=500")
    assert page["records"] and all(
        ["event-type", "OrderPlaced"] in r["headers"] for r in page["records"]
    )
    customer = events[0][2]["data"]["customer_id"]
    p = partition_for_key(order.encode(), 6)
    page = env.console.get(
        f"/api/topics/orders/records?partition={p}&jpath=data.customer_id={customer}"
    )
    assert order in {r["key"] for r in page["records"]}
    assert all(r["json"]["data"]["customer_id"] == customer for r in page["records"])
    # NDJSON export of the key's records
    status, body = env.console.request(
        "GET", f"/topics/orders/export.ndjson?partition={p}&key={order}"
    )
    assert status == 200
    lines = [orjson.loads(x) for x in str(body).splitlines()] if isinstance(body, str) else [body]
    assert [x["offset"] for x in lines] == [e[0] for e in events]


def test_aggregate_view_folds_the_orders_state(env: SimpleNamespace) -> None:
    b, url = env.b, env.console.url
    order = Workload(orders=30, seed=5, run=1).order_id(3)
    kinds = [e[2]["type"] for e in events_of(env.log, "orders", order)]
    expected = "placed"
    for kind in kinds:
        expected = {"OrderConfirmed": "confirmed", "OrderCancelled": "cancelled"}.get(
            kind, expected
        )
    b.get(url + "/aggregates")
    Select(b.find_element(By.ID, "a-type")).select_by_value("Order")
    b.find_element(By.ID, "a-id").send_keys(order)
    b.find_element(By.ID, "a-go").click()
    state = orjson.loads(wait_for(lambda: b.find_elements(By.ID, "a-state"))[0].text)
    assert state["status"] == expected
    assert texts(b, "#a-events tr td:first-child") == [str(v) for v in range(1, len(kinds) + 1)]
    shot(b, "aggregate")
    b.get(url + f"/aggregates?type=Order&id={order}&version=1")
    assert orjson.loads(b.find_element(By.ID, "a-state").text)["status"] == "placed"
    assert b.find_element(By.ID, "a-at").text == "1"


def test_aggregate_view_shows_the_state_as_of_a_moment(env: SimpleNamespace) -> None:
    """Time travel in the browser: the form's "as of" field folds the events recorded up to
    that moment (the oracle: the records' own timestamps, read straight from the log)."""
    b, url = env.b, env.console.url
    order = Workload(orders=30, seed=5, run=1).order_id(4)
    events = events_of(env.log, "orders", order)
    stamps = [ts for _, ts, _ in events]
    moments = sorted({stamps[0], stamps[-1] - 1, stamps[-1]} - {stamps[0] - 1})
    for moment in moments:
        expected = sum(1 for ts in stamps if ts <= moment)
        iso = datetime.fromtimestamp(moment / 1000, UTC).isoformat(timespec="milliseconds")
        b.get(url + "/aggregates")
        Select(b.find_element(By.ID, "a-type")).select_by_value("Order")
        b.find_element(By.ID, "a-id").send_keys(order)
        b.find_element(By.ID, "a-as-of").send_keys(iso)
        b.find_element(By.ID, "a-go").click()
        wait_for(lambda: b.find_elements(By.ID, "a-at"))
        assert b.find_element(By.ID, "a-at").text == str(expected), (moment, stamps)
        assert iso in b.find_element(By.ID, "a-moment").text
        folded = texts(b, "#a-events tr.folded td:first-child")
        assert folded == [str(v) for v in range(1, expected + 1)]
    # before the first event the aggregate did not exist yet: a clear 404, not a traceback
    status, body = env.console.request(
        "GET", f"/api/aggregates?type=Order&id={order}&as_of={stamps[0] - 1}"
    )
    assert status == 404 and "had no events as of" in str(body)


def test_values_keys_and_headers_render_as_text_not_markup(env: SimpleNamespace) -> None:
    b = env.b
    b.get(env.console.url + "/topics/notes/records")
    value = b.find_element(By.CSS_SELECTOR, "#records tr.record td.value").text
    assert value == XSS.decode()
    assert b.execute_script("return window.__xss === undefined") is True
    assert not b.find_elements(By.CSS_SELECTOR, "#records b.bold, #records i, #records u")
    assert "<i>key</i>" in texts(b, "#records td.key")
    assert "<u>Note</u>" in b.find_element(By.CSS_SELECTOR, "#records td.headers").text


def _tail_body(b: Any) -> str:
    return str(b.find_element(By.ID, "tail-body").text)


def test_live_tail_shows_a_new_record_within_a_second_and_pauses(env: SimpleNamespace) -> None:
    b = env.b
    b.get(env.console.url + "/topics/notes/tail")
    wait_for(lambda: b.find_element(By.ID, "tail").get_attribute("data-open") == "1")
    marker = f"tail-{uuid.uuid4()}"
    started = time.monotonic()
    env.producer.send("notes", marker.encode(), key=b"k").result(timeout=10)
    wait_for(lambda: marker in _tail_body(b), timeout=10, interval=0.02)
    elapsed = time.monotonic() - started
    assert elapsed < 1.0, f"the live tail showed the record after {elapsed:.2f}s"
    shot(b, "tail")
    # pause: new records are held, not shown; resume shows them in order
    b.find_element(By.ID, "pause").click()
    held = f"held-{uuid.uuid4()}"
    env.producer.send("notes", held.encode(), key=b"k").result(timeout=10)
    wait_for(lambda: b.find_element(By.ID, "buffered").text == "1", timeout=10)
    assert held not in _tail_body(b)
    b.find_element(By.ID, "pause").click()
    wait_for(lambda: held in _tail_body(b), timeout=5)
    # a filtered tail skips what does not match
    b.get(env.console.url + "/topics/notes/tail?text=wanted")
    wait_for(lambda: b.find_element(By.ID, "tail").get_attribute("data-open") == "1")
    env.producer.send("notes", b"something else", key=b"k").result(timeout=10)
    env.producer.send("notes", b"this is wanted", key=b"k").result(timeout=10)
    wait_for(lambda: "this is wanted" in _tail_body(b), timeout=10)
    assert "something else" not in _tail_body(b)


def test_groups_view_shows_lag_falling_to_zero_while_a_worker_runs(env: SimpleNamespace) -> None:
    b = env.b
    seed(env.data, orders=10, run=2)  # new orders: the projector's group falls behind
    assert projector_lag(env.data) > 0
    b.get(env.console.url + "/groups?sort=lag")

    def shown_lag() -> int | None:
        cells = b.find_elements(By.CSS_SELECTOR, f"#groups tr[data-group='{PROJECTOR}'] td.lag")
        return int(cells[0].text) if cells else None

    assert wait_for(lambda: (shown_lag() or 0) > 0, timeout=10)
    shot(b, "groups")

    def sampled_lags() -> list[int]:
        return [lag for _t, lag in env.console.get(f"/api/groups/{PROJECTOR}")["lag_history"]]

    # the chart must have a lag above zero to fall from: the console samples every few
    # seconds, and a worker started before that sample can catch up between two samples
    assert wait_for(lambda: max(sampled_lags(), default=0) > 0, timeout=30), sampled_lags()
    runner = Runner(APP, PROJECTOR, env.data, workers=1, session_timeout_ms=2000)
    runner.start()
    try:
        wait_for(lambda: shown_lag() == 0, timeout=90, interval=0.3)
        # the page reads the lag live; the history has it at its next sample
        wait_for(lambda: sampled_lags()[-1:] == [0], timeout=30, interval=0.3)
        b.get(env.console.url + f"/groups/{PROJECTOR}")
        wait_for(lambda: b.find_elements(By.CSS_SELECTOR, "#lag-chart canvas"), timeout=10)
        lags = sampled_lags()
        assert max(lags) > 0 and lags[-1] == 0, lags  # sampled by the console: it fell to 0
        shot(b, "group")
        b.get(env.console.url + f"/projectors/{PROJECTOR}")
        wait_for(lambda: b.find_element(By.ID, "p-status").text == "running", timeout=30)
        shot(b, "projector")
    finally:
        runner.stop()


def test_read_only_refuses_every_state_change(env: SimpleNamespace) -> None:
    console = env.console
    before = console.get(f"/api/groups/{PROJECTOR}")["offsets"]
    body = orjson.dumps({"topic": "orders", "mode": "to-earliest", "execute": True})
    for method, path in (
        ("POST", f"/api/groups/{PROJECTOR}/reset-offsets"),
        ("POST", f"/api/projectors/{PROJECTOR}/dead-letters/retry"),
        ("POST", f"/api/projectors/{PROJECTOR}/rebuild"),
        ("POST", f"/readmodels/{PROJECTOR}/orders"),
        ("PUT", "/api/topics/orders"),
        ("DELETE", f"/api/groups/{PROJECTOR}"),
    ):
        status, doc = console.request(method, path, body)
        assert status == 403, (method, path, status, doc)
        assert "read-only" in doc["error"]
    assert console.get(f"/api/groups/{PROJECTOR}")["offsets"] == before
    assert not (env.data / "readmodels" / f"{PROJECTOR}.rebuild.sqlite").exists()
    status, _ = console.request("GET", f"/readmodels/{PROJECTOR}?sql=select+1")
    assert status == 403  # no arbitrary SQL in read-only mode
    env.b.get(console.url + f"/groups/{PROJECTOR}")
    assert env.b.find_elements(By.ID, "reset-disabled")
    assert not env.b.find_elements(By.ID, "reset-form")


@pytest.mark.parametrize(
    "path",
    [
        "/api/topics/..",
        "/api/topics/..%2F..%2Fetc",
        "/api/topics/a%2Fb/records",
        "/api/groups/..",
        "/api/projectors/..%2Fcustomers",
        "/api/projectors/invoices.sqlite",
        "/readmodels/..%2F..%2Fetc%2Fpasswd",
        "/static/..%2F..%2Fdata.py",
    ],
)
def test_no_path_traversal_through_names(env: SimpleNamespace, path: str) -> None:
    status, body = env.console.request("GET", path)
    assert status in (400, 404), (path, status)
    assert "root:" not in str(body) and "ConsoleData" not in str(body)


def test_binds_loopback_by_default(env: SimpleNamespace) -> None:
    log = Path(env.console.log_path).read_text()
    assert f"http://127.0.0.1:{env.console.port}/ (read-only)" in log
    assert "warning" not in log.lower()


def test_warns_before_listening_on_a_non_loopback_address(env: SimpleNamespace) -> None:
    # 203.0.113.1 (TEST-NET-3) is not this machine's: the warning is printed, then binding
    # fails, so nothing ever listens beyond loopback.
    cli = [sys.executable, "-c", "from eventlane.cli import main; main()", "console"]
    out = subprocess.run(
        [*cli, "--data", str(env.data), "--host", "203.0.113.1", "--port", "0"],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode != 0
    assert "warning: listening on 203.0.113.1" in out.stderr
    assert "access token" in out.stderr


def raw_get(console: Any, path: str) -> tuple[int, str | None, bytes]:
    """``(status, Location, first bytes of the body)`` of one GET, redirects not followed; a
    stream answered 200 is closed after its headers."""
    conn = http.client.HTTPConnection("127.0.0.1", console.port, timeout=30)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        body = b"" if resp.status == 200 and "stream" in path else resp.read(4096)
        return resp.status, resp.getheader("location"), body
    finally:
        conn.close()


@pytest.mark.parametrize(
    "path",
    [
        f"/api/projectors/{PROJECTOR}/dead-letters/99999999999999999999999",
        f"/projectors/{PROJECTOR}/dead-letters/99999999999999999999999",
        "/api/rebuilds/99999999999999999999999",
        "/readmodels//evil.example",
        "/topics/orders/tail/stream?from=999:0",
        "/topics/orders/tail/stream?from=0:-5",
        "/topics/orders/tail/stream?from=-1:0",
        "/topics/orders/tail/stream?partition=-2",
    ],
)
def test_bad_parameters_are_answered_4xx(env: SimpleNamespace, path: str) -> None:
    status, location, body = raw_get(env.console, path)
    assert 400 <= status < 500, (path, status, body[:300])
    assert location is None


def test_a_read_models_trailing_slash_stays_under_readmodels(env: SimpleNamespace) -> None:
    status, location, body = raw_get(env.console, f"/readmodels/{PROJECTOR}/?_sort=x")
    if 300 <= status < 400:
        assert location is not None and location.startswith(f"/readmodels/{PROJECTOR}"), location
        status, location, body = raw_get(env.console, location)
    assert status == 200, (status, location, body[:300])
    assert b"orders" in body  # Datasette's page of the read model's database


JUNK = [
    "99999999999999999999999",
    "-99999999999999999999999",
    "-1",
    "0",
    "",
    "..",
    "%2e%2e",
    "a%2Fb",
    "%00",
    "%ff",
    "x" * 300,
    "%C3%A9",
    "1e3",
    "%201",
    "//evil.example",
    "null",
    "0:-5",
    "999:0",
    "-1:0",
    "0:99999999999999999999999",
    "1,2",
    "2024-13-45T99:99",
]
SHAPES = [
    "/api/topics/{}",
    "/api/topics/orders/records?partition={}",
    "/api/topics/orders/records?start=offset&value={}",
    "/api/topics/orders/records?start=timestamp&value={}",
    "/api/topics/orders/records?limit={}",
    "/api/topics/orders/records?key={}",
    "/api/topics/orders/records?jpath={}",
    "/api/topics/orders/tail?partition={}",
    "/api/aggregates?type=Order&id={}",
    "/api/aggregates?type=Order&id=x&version={}",
    "/api/aggregates?type=Order&id=x&as_of={}",
    "/api/aggregates?type={}&id=x",
    "/api/groups/{}",
    "/api/groups?min_lag={}",
    "/api/groups?sort={}",
    "/groups/{}/body",
    "/api/projectors/{}",
    "/api/projectors/{}/dead-letters",
    f"/api/projectors/{PROJECTOR}/dead-letters?status={{}}",
    f"/api/projectors/{PROJECTOR}/dead-letters/{{}}",
    "/api/rebuilds/{}",
    "/rebuilds/{}/stream",
    "/topics/orders/tail/stream?from={}",
    "/topics/orders/tail/stream?partition={}",
    "/topics/orders/export.ndjson?partition={}",
    "/readmodels/{}",
    f"/readmodels/{PROJECTOR}/{{}}",
    "/static/{}",
]


def test_generated_bad_parameters_never_get_a_5xx(env: SimpleNamespace) -> None:
    """A seeded generator over every view's parameters: junk in any one of them is answered
    (2xx, 3xx or 4xx), never with a 5xx or a dropped connection."""
    rng = random.Random(2026)
    cases = [shape.format(junk) for shape in SHAPES for junk in JUNK]
    failures = []
    for path in rng.sample(cases, 160):
        try:
            status, _, body = raw_get(env.console, path)
        except (OSError, http.client.HTTPException) as exc:
            failures.append((path, repr(exc)))
            continue
        if status >= 500:
            failures.append((path, status, body[:200]))
    assert not failures, failures


def test_wait_for_counts_a_node_gone_from_the_document_as_not_yet() -> None:
    """Chromedriver's "unknown error" for a node a page load replaced (CI, stop 50) is a
    retry for wait_for; any other driver error still fails the test at once."""
    gone = WebDriverException(
        'unknown error: unhandled inspector error: {"code":-32000,'
        '"message":"Node with given id does not belong to the document"}'
    )
    calls = iter([gone, gone, "ready"])

    def predicate() -> str:
        value = next(calls)
        if isinstance(value, Exception):
            raise value
        return value

    assert wait_for(predicate, timeout=5) == "ready"

    def broken() -> str:
        raise WebDriverException("unknown error: session deleted")

    with pytest.raises(WebDriverException, match="session deleted"):
        wait_for(broken, timeout=5)
