"""The console started with ``--read-write``, in a real headless Chromium: an offset reset
with its dry-run preview (refused while the group has a live member), a rebuild whose
progress streams over SSE and ends identical to the live read model, dead-letter retry and
read-only SQL on the read models.
"""

from __future__ import annotations

import urllib.request
from collections.abc import Iterator
from types import SimpleNamespace

import orjson
import pytest
from console_helpers import (
    APP,
    PROJECTOR,
    chromium,
    console_process,
    consume_all_and_commit,
    run_projector_until_caught_up,
    seed,
    shot,
    wait_for,
)
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import Select

from eventlane.consumer.group import GroupConsumer
from eventlane.log import LogStore

AUDIT = "audit"


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimpleNamespace]:
    data = tmp_path_factory.mktemp("console-rw") / "data"
    seed(data, orders=20)
    run_projector_until_caught_up(data)
    log = LogStore(data)
    # an inactive group that consumed every order and committed
    total = consume_all_and_commit(log, AUDIT)
    with console_process(data, APP, "--read-write") as console, chromium() as driver:
        yield SimpleNamespace(data=data, log=log, console=console, b=driver, total=total)
    log.close()


def committed(env: SimpleNamespace) -> dict[int, int | None]:
    doc = env.console.get(f"/api/groups/{AUDIT}")
    return {r["partition"]: r["committed"] for r in doc["offsets"] if r["topic"] == "orders"}


def test_reset_offsets_previews_then_executes_in_the_browser(env: SimpleNamespace) -> None:
    b = env.b
    before = committed(env)
    assert sum(before.values()) == env.total  # caught up: lag 0
    b.get(env.console.url + f"/groups/{AUDIT}")
    assert b.find_element(By.ID, "mode").text == "read-write"
    Select(b.find_element(By.ID, "r-topic")).select_by_visible_text("orders")
    Select(b.find_element(By.ID, "r-mode")).select_by_visible_text("to-earliest")
    b.find_element(By.ID, "r-preview").click()
    plan = wait_for(lambda: b.find_elements(By.ID, "reset-plan"), timeout=15)[0]
    assert "dry run" in plan.text
    rows = plan.find_elements(By.CSS_SELECTOR, "tr")[1:]
    assert [int(r.find_elements(By.TAG_NAME, "td")[3].text) for r in rows] == [0] * len(rows)
    assert committed(env) == before  # a preview changes nothing
    shot(b, "reset")
    b.find_element(By.ID, "r-execute").click()
    wait_for(lambda: b.find_elements(By.ID, "reset-done"), timeout=15)
    assert set(committed(env).values()) == {0}
    assert env.console.get(f"/api/groups/{AUDIT}")["lag"] == env.total
    # shift-by through the JSON API: +2 from 0 on every partition (clamped to the HWM)
    status, doc = env.console.request(
        "POST",
        f"/api/groups/{AUDIT}/reset-offsets",
        orjson.dumps({"topic": "orders", "mode": "shift-by", "value": "2", "execute": True}),
    )
    assert status == 200 and doc["executed"]
    marks = {p: env.log.offsets("orders", p).hwm for p in range(env.log.partition_count("orders"))}
    assert committed(env) == {p: min(2, hwm) for p, hwm in marks.items()}


def test_reset_is_refused_while_the_group_has_a_live_member(env: SimpleNamespace) -> None:
    member = GroupConsumer(env.log, group_id=AUDIT, topics=["orders"], session_timeout_ms=10_000)
    try:
        wait_for(lambda: member.poll(timeout=0.1) is not None and member.assignment(), timeout=20)
        before = committed(env)
        status, doc = env.console.request(
            "POST",
            f"/api/groups/{AUDIT}/reset-offsets",
            orjson.dumps({"topic": "orders", "mode": "to-latest", "execute": True}),
        )
        assert status == 400 and "live member" in doc["error"], doc
        assert committed(env) == before
    finally:
        member.close(autocommit=False)


def test_rebuild_streams_progress_and_ends_identical(env: SimpleNamespace) -> None:
    b = env.b
    b.get(env.console.url + f"/projectors/{PROJECTOR}")
    Select(b.find_element(By.ID, "rb-engine")).select_by_visible_text("local")
    b.find_element(By.ID, "rb-start").click()
    wait_for(lambda: b.find_elements(By.CSS_SELECTOR, "#rebuild progress"), timeout=15)
    wait_for(lambda: b.find_element(By.ID, "rb-state").text != "running", timeout=120)
    assert b.find_element(By.ID, "rb-state").text == "done"
    assert b.find_element(By.ID, "rb-percent").text == "100%"
    verdicts = [e.text for e in b.find_elements(By.CSS_SELECTOR, "#rebuild p.verify")]
    assert any(v.startswith("live") and "identical" in v for v in verdicts), verdicts
    shot(b, "rebuild")
    job = env.console.get("/api/rebuilds/1")
    assert job["state"] == "done" and job["result"]["records"] > 0
    live = [v for v in job["verify"] if v["what"].startswith("live")]
    assert live and live[0]["ok"] and not live[0]["skipped"] and live[0]["tables"] > 0
    # the progress stream of a second rebuild, read as a plain SSE client
    status, started = env.console.request(
        "POST", f"/api/projectors/{PROJECTOR}/rebuild", orjson.dumps({"engine": "local"})
    )
    assert status == 202, started
    with urllib.request.urlopen(
        env.console.url + f"/rebuilds/{started['id']}/stream", timeout=120
    ) as stream:
        events = [line.decode().strip() for line in stream if line.startswith(b"event:")]
    assert events[0] == "event: progress" and events[-1] == "event: done", events
    assert env.console.get(f"/api/rebuilds/{started['id']}")["state"] == "done"


def test_dead_letter_retry_and_sql_are_allowed_in_read_write_mode(env: SimpleNamespace) -> None:
    status, doc = env.console.request(
        "POST", f"/api/projectors/{PROJECTOR}/dead-letters/retry", orjson.dumps({})
    )
    assert status == 200 and doc == {"succeeded": [], "failed": {}}
    doc = env.console.get(
        f"/readmodels/{PROJECTOR}.json?sql=select+count(*)+as+n+from+orders&_shape=array"
    )
    assert doc[0]["n"] == 20


def test_cross_origin_posts_are_refused(env: SimpleNamespace) -> None:
    req = urllib.request.Request(
        env.console.url + f"/api/groups/{AUDIT}/reset-offsets",
        data=orjson.dumps({"topic": "orders", "mode": "to-earliest"}),
        method="POST",
        headers={"origin": "http://evil.example", "content-type": "application/json"},
    )
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(req, timeout=30)
    assert err.value.code == 403


def test_dead_letters_list_show_traceback_and_retry(env: SimpleNamespace) -> None:
    """Runs last: it adds a poison record to the projector's topic."""
    env.log.append(
        "orders", 0, [(b"poison-1", b"{not json", [("event-type", b"OrderPlaced")], None)]
    )
    run_projector_until_caught_up(env.data)
    b = env.b
    b.get(env.console.url + f"/projectors/{PROJECTOR}")
    assert b.find_element(By.ID, "p-status").text == "error"
    rows = b.find_elements(By.CSS_SELECTOR, "#letters tr")[1:]
    assert len(rows) == 1 and "poison-1" in rows[0].text
    rows[0].find_element(By.TAG_NAME, "a").click()
    traceback = wait_for(lambda: b.find_elements(By.ID, "traceback"), timeout=15)[0].text
    assert "JSON" in traceback
    assert "{not json" in b.page_source  # the raw value, as stored (escaped)
    b.get(env.console.url + f"/projectors/{PROJECTOR}")
    b.find_element(By.ID, "retry-all").click()
    report = wait_for(lambda: b.find_elements(By.ID, "retry-report"), timeout=30)[0].text
    assert report == "succeeded: 0 · failed: 1"  # still poison with today's code
    letters = env.console.get(f"/api/projectors/{PROJECTOR}/dead-letters")
    assert [d["key"] for d in letters] == ["poison-1"] and letters[0]["attempts"] >= 2
