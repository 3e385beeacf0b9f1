"""The console attacked from a browser page, in a real headless Chromium whose resolver maps
``evil.example`` to 127.0.0.1 (so a page on ``http://evil.example:PORT`` is what DNS
rebinding gives an attacker): a form POST from a sandboxed iframe (``Origin: null``), a plain
cross-site form, script on a rebound name reading data and resetting offsets, framing; and
the per-session CSRF token that API clients and the console's own pages send.

The oracle of every write attack is the group's committed offsets, read back through the
console's API over 127.0.0.1: an attack that got through changes them.
"""

from __future__ import annotations

import contextlib
import html
import http.server
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import orjson
import pytest
from console_helpers import (
    APP,
    Console,
    chromium,
    console_process,
    consume_all_and_commit,
    free_port,
    seed,
    wait_for,
)
from selenium.webdriver.common.by import By

from eventlane.log import LogStore

AUDIT = "audit"
EVIL = "evil.example"


class AttackerSite:
    """The attacker's web server: the pages in ``pages`` at ``http://evil.example:PORT``
    (127.0.0.1 through the browser's resolver rule)."""

    def __init__(self) -> None:
        self.pages: dict[str, str] = {}
        pages = self.pages

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = pages.get(self.path, "not here").encode()
                self.send_response(200 if self.path in pages else 404)
                self.send_header("content-type", "text/html; charset=utf-8")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *_args: Any) -> None:
                return

        self.port = free_port()
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def url(self, path: str) -> str:
        return f"http://{EVIL}:{self.port}{path}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimpleNamespace]:
    data = tmp_path_factory.mktemp("console-sec") / "data"
    seed(data, orders=10)
    log = LogStore(data)
    total = consume_all_and_commit(log, AUDIT)
    site = AttackerSite()
    with contextlib.ExitStack() as stack:
        rw = stack.enter_context(console_process(data, APP, "--read-write"))
        ro = stack.enter_context(console_process(data, APP))
        driver = stack.enter_context(chromium(f"--host-resolver-rules=MAP {EVIL} 127.0.0.1"))
        yield SimpleNamespace(data=data, log=log, rw=rw, ro=ro, b=driver, site=site, total=total)
    site.close()
    log.close()


def committed(console: Console) -> dict[int, int | None]:
    doc = console.get(f"/api/groups/{AUDIT}")
    return {r["partition"]: r["committed"] for r in doc["offsets"] if r["topic"] == "orders"}


def caught_up(env: SimpleNamespace) -> dict[int, int | None]:
    before = committed(env.rw)
    assert sum(v or 0 for v in before.values()) == env.total  # lag 0: a reset would show
    return before


def reset_form(action: str) -> str:
    return (
        f'<form method="post" action="{action}">'
        '<input name="topic" value="orders"><input name="mode" value="to-earliest">'
        '<input name="execute" value="true"></form>'
        # submitted once the frame has loaded, so the frame's load events count the answer
        "<script>onload = () => setTimeout(() => document.forms[0].submit(), 50)</script>"
    )


def load_and_wait_for_frame_loads(env: SimpleNamespace, path: str, loads: int) -> None:
    """Open the attacker's page and wait until its iframe fired ``loads`` load events (the
    srcdoc, then the form's answer, whatever it was)."""
    env.b.get(env.site.url(path))
    wait_for(lambda: env.b.execute_script("return window.loads || 0") >= loads, timeout=30)
    time.sleep(0.3)  # the console's answer is in; nothing else is coming


def test_a_form_in_a_sandboxed_iframe_cannot_reset_offsets(env: SimpleNamespace) -> None:
    """``Origin: null``: the iframe's document has an opaque origin."""
    before = caught_up(env)
    target = f"{env.rw.url}/api/groups/{AUDIT}/reset-offsets"
    env.site.pages["/sandboxed"] = (
        "<script>window.loads = 0</script>"
        '<iframe sandbox="allow-forms allow-scripts" onload="window.loads++" '
        f'srcdoc="{html.escape(reset_form(target))}"></iframe>'
    )
    load_and_wait_for_frame_loads(env, "/sandboxed", 2)
    assert committed(env.rw) == before


def test_a_cross_site_form_cannot_reset_offsets(env: SimpleNamespace) -> None:
    before = caught_up(env)
    target = f"{env.rw.url}/api/groups/{AUDIT}/reset-offsets"
    env.site.pages["/form"] = (
        "<script>window.loads = 0</script>"
        f'<iframe onload="window.loads++" srcdoc="{html.escape(reset_form(target))}"></iframe>'
    )
    load_and_wait_for_frame_loads(env, "/form", 2)
    assert committed(env.rw) == before


def fetch(b: Any, path: str, method: str = "GET", body: str | None = None) -> list[Any]:
    """``[status, text]`` of a ``fetch`` from the page now open in ``b`` (same origin)."""
    return list(
        b.execute_async_script(
            """
            const [path, method, body, done] = arguments;
            const init = {method, headers: {"content-type": "application/json"}};
            if (body !== null) init.body = body;
            fetch(path, init).then(async r => done([r.status, await r.text()]))
                             .catch(e => done([0, String(e)]));
            """,
            path,
            method,
            body,
        )
    )


@pytest.mark.parametrize("mode", ["read-only", "read-write"])
def test_dns_rebinding_cannot_read_records(env: SimpleNamespace, mode: str) -> None:
    """A page on ``evil.example:PORT`` that resolves to the console's address: the browser
    sends ``Host: evil.example:PORT``; same-origin script could read every answer."""
    console = env.ro if mode == "read-only" else env.rw
    env.b.get(f"http://{EVIL}:{console.port}/topics/orders/records")
    assert not env.b.find_elements(By.CSS_SELECTOR, "#records tr.record")
    status, text = fetch(env.b, "/api/topics/orders/records?partition=0")
    assert 400 <= status < 500, (status, text[:200])
    assert "OrderPlaced" not in text and "customer_id" not in text
    assert console.get("/api/topics/orders/records?partition=0")["records"]  # 127.0.0.1: fine


def test_dns_rebinding_cannot_reset_offsets(env: SimpleNamespace) -> None:
    before = caught_up(env)
    env.b.get(f"http://{EVIL}:{env.rw.port}/groups/{AUDIT}")
    body = orjson.dumps({"topic": "orders", "mode": "to-earliest", "execute": True}).decode()
    status, text = fetch(env.b, f"/api/groups/{AUDIT}/reset-offsets", "POST", body)
    assert 400 <= status < 500, (status, text[:200])
    assert committed(env.rw) == before


def test_the_console_cannot_be_framed(env: SimpleNamespace) -> None:
    b = env.b
    env.site.pages["/frame"] = (
        "<script>window.loads = 0</script>"
        f'<iframe id="victim" onload="window.loads++" src="{env.rw.url}/groups/{AUDIT}"'
        ' width="800" height="600"></iframe>'
    )
    load_and_wait_for_frame_loads(env, "/frame", 1)
    b.switch_to.frame(b.find_element(By.ID, "victim"))
    try:
        shown = b.execute_script("return [document.URL, document.body.innerText]")
        assert not b.find_elements(By.ID, "mode"), f"the console rendered in a frame: {shown}"
        assert not b.find_elements(By.ID, "reset-form")
        assert "Consumer group" not in shown[1], shown
    finally:
        b.switch_to.default_content()
    for path in ("/", "/api/overview", f"/groups/{AUDIT}"):
        with urllib.request.urlopen(env.rw.url + path, timeout=30) as resp:
            assert resp.headers["x-frame-options"] == "DENY", path
            assert "frame-ancestors 'none'" in resp.headers["content-security-policy"], path


def test_the_consoles_own_page_posts_with_its_session_token(env: SimpleNamespace) -> None:
    """The legitimate path still works in the browser: the group page's reset form (htmx)
    sends the session's CSRF token; here a dry run, which changes nothing."""
    b = env.b
    before = caught_up(env)
    b.get(env.rw.url + f"/groups/{AUDIT}")
    b.find_element(By.ID, "r-preview").click()
    plan = wait_for(lambda: b.find_elements(By.ID, "reset-plan"), timeout=15)[0]
    assert "dry run" in plan.text
    assert committed(env.rw) == before


def post(console: Console, path: str, headers: dict[str, str], *, execute: bool = True) -> int:
    """A reset sent by a bare client (no cookie jar; only the headers given)."""
    body = orjson.dumps({"topic": "orders", "mode": "to-earliest", "execute": execute})
    req = urllib.request.Request(console.url + path, data=body, method="POST")
    req.add_header("content-type", "application/json")
    for name, value in headers.items():
        req.add_header(name, value)
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as err:
        return err.code


def test_state_changes_need_the_sessions_csrf_token(env: SimpleNamespace) -> None:
    before = caught_up(env)
    path = f"/api/groups/{AUDIT}/reset-offsets"
    client = env.rw.client()
    token = client.get("/api/session")["csrf_token"]
    cookie = "; ".join(f"{c.name}={c.value}" for c in client.cookies)
    assert cookie, "no session cookie"
    other_token = env.rw.client().get("/api/session")["csrf_token"]
    assert token and other_token != token
    own = f"http://127.0.0.1:{env.rw.port}"
    refused = [
        {},  # no Origin, no token: a missing Origin is no exemption
        {"origin": own},  # same origin, but no token
        {"origin": "null"},
        {"origin": "null", "x-csrf-token": token, "cookie": cookie},
        {"origin": f"http://{EVIL}:{env.rw.port}", "x-csrf-token": token, "cookie": cookie},
        {"sec-fetch-site": "cross-site", "x-csrf-token": token, "cookie": cookie},
        {"x-csrf-token": token},  # a token without its session
        {"cookie": cookie},  # a session without its token
        {"x-csrf-token": other_token, "cookie": cookie},  # another session's token
        {"x-csrf-token": "", "cookie": cookie},
    ]
    for headers in refused:
        assert post(env.rw, path, headers) == 403, headers
    assert committed(env.rw) == before
    # the session's token with its cookie: an API client (no Origin) or a same-origin page
    for headers in (
        {"x-csrf-token": token, "cookie": cookie},
        {"origin": own, "x-csrf-token": token, "cookie": cookie},
    ):
        assert post(env.rw, path, headers, execute=False) == 200, headers
    assert committed(env.rw) == before  # dry runs
