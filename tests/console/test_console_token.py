"""The console's access token: required on every request where one is set, and set (made
up and printed once on standard error) whenever the console binds beyond loopback.

Beyond loopback is tested for real: in a network namespace this test creates (``unshare
-n``) with a veth interface at 10.77.0.1, a console bound to ``0.0.0.0`` is reached over
that interface and over the namespace's loopback, and the token is required on both (the
console cannot tell a proxied request from a local one, so it never exempts loopback
clients). 127.0.0.0/8 is loopback to the kernel, so the console treats every address in it
as loopback: binding 127.0.0.2 proves nothing about a reachable address, a namespace does.
"""

from __future__ import annotations

import http.client
import json
import os
import random
import subprocess
import sys
import textwrap
import urllib.parse
from pathlib import Path

import pytest
import structlog
from click.testing import CliRunner
from console_helpers import Console, console_process

from eventlane.cli import main
from eventlane.log import LogStore, Producer, ProducerRecord

TOKEN = "s3cret-token-for-tests-0123456789"


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("console-token") / "data"
    log = LogStore(path)
    log.create_topic("notes", 1)
    with Producer(log) as producer:
        producer.send_batch("notes", [ProducerRecord(b"k", b"hello")])
    log.close()
    return path


def send(
    port: int, method: str, path: str, headers: dict[str, str] | None = None
) -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request(method, path, headers=headers or {})
        resp = conn.getresponse()
        body = b"" if resp.status == 200 and path.endswith("/stream") else resp.read()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, body
    finally:
        conn.close()


PATHS = ["/", "/api/topics", "/topics/notes/records", "/static/console.css", "/api/session"]


def assert_token_required(console: Console) -> None:
    port = console.port
    for path in [*PATHS, "/topics/notes/tail/stream"]:
        for headers in ({}, {"authorization": "Bearer wrong"}, {"cookie": "x=" + TOKEN}):
            status, _, body = send(port, "GET", path, headers)
            assert status == 401, (path, headers, status)
            assert b"hello" not in body and b"notes" not in body
        status, _, _ = send(port, "GET", path, {"authorization": f"Bearer {TOKEN}"})
        assert status == 200, path
    status, _, _ = send(port, "POST", "/api/projectors/p/rebuild")
    assert status == 401
    # a first visit with ?token=: a cookie, and a redirect that drops the token from the URL
    status, headers, _ = send(port, "GET", "/topics/notes/records?partition=0&token=" + TOKEN)
    assert status == 303, status
    assert headers["location"] == "/topics/notes/records?partition=0"
    cookie = headers["set-cookie"]
    assert "httponly" in cookie.lower() and "samesite=strict" in cookie.lower(), cookie
    jar = cookie.split(";", 1)[0]
    for path in PATHS:
        status, _, _ = send(port, "GET", path, {"cookie": jar})
        assert status == 200, path
    status, _, _ = send(port, "GET", "/api/topics?token=wrong")
    assert status == 401


def test_a_given_token_is_required_on_every_request(data: Path) -> None:
    with console_process(data, "--token", TOKEN, token=TOKEN) as console:
        assert_token_required(console)
        assert TOKEN not in console.log_path.read_text()  # given, so never printed


NAMESPACE_SCRIPT = textwrap.dedent(
    """
    import http.client, json, os, re, signal, socket, subprocess, sys, time

    data = sys.argv[1]
    for cmd in ("ip link set lo up", "ip link add el0 type veth peer name el1",
                "ip addr add 10.77.0.1/24 dev el0", "ip link set el0 up", "ip link set el1 up"):
        subprocess.run(cmd.split(), check=True)
    with socket.socket() as s:
        s.bind(("0.0.0.0", 0))
        port = s.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if k != "EVENTLANE_CONSOLE_TOKEN"}
    proc = subprocess.Popen(
        [sys.executable, "-c", "from eventlane.cli import main; main()", "console",
         "--data", data, "--host", "0.0.0.0", "--port", str(port)],
        stderr=subprocess.PIPE, text=True, env=env)

    def get(host, path, headers=None):
        conn = http.client.HTTPConnection(host, port, timeout=30)
        try:
            conn.request("GET", path, headers=headers or {})
            resp = conn.getresponse()
            body = resp.read().decode("utf-8", "replace")
            return resp.status, resp.getheader("set-cookie"), body
        finally:
            conn.close()

    out = {}
    try:
        lines = []  # standard error up to the line that says where the console listens
        while not lines or "eventlane console: http" not in lines[-1]:
            lines.append(proc.stderr.readline())
            assert lines[-1], "the console stopped: " + "".join(lines)
        for host in ("10.77.0.1", "127.0.0.1"):
            status, _, body = get(host, "/api/topics")
            out[host + " bare"] = [status, "notes" in body]
        found = re.search(r"token=([A-Za-z0-9_-]+)", "".join(lines))
        token = found.group(1) if found else ""
        out["token"] = token
        for host in ("10.77.0.1", "127.0.0.1"):
            status, _, body = get(host, "/api/topics", {"authorization": "Bearer " + token})
            out[host + " bearer"] = [status, "notes" in body]
            status, cookie, _ = get(host, "/api/topics?token=" + token)
            out[host + " first visit"] = [status, cookie is not None]
            status, _, body = get(host, "/api/topics", {"cookie": (cookie or "").split(";")[0]})
            out[host + " cookie"] = [status, "notes" in body]
        proc.send_signal(signal.SIGTERM)
        _, rest = proc.communicate(timeout=30)
        out["stderr"] = "".join(lines) + rest
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    print(json.dumps(out))
    """
)
"""Run under ``unshare -n``: a console on 0.0.0.0 probed over the veth address and over
loopback, without the token, then with the one it printed; what was seen, as JSON."""


def run_in_namespace(script: str, data: Path, tmp_path: Path) -> dict[str, object]:
    try:
        probe = subprocess.run(
            ["unshare", "-n", "ip", "link", "add", "p0", "type", "veth", "peer", "name", "p1"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        made, why = probe.returncode == 0, probe.stderr.strip()
    except FileNotFoundError as exc:  # no unshare (util-linux) or no ip (iproute2)
        made, why = False, str(exc)
    if not made:
        pytest.skip(f"network namespaces cannot be made here (unshare -n, ip): {why}")
    path = tmp_path / "in_namespace.py"
    path.write_text(script)
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(root)}
    out = subprocess.run(
        ["unshare", "-n", sys.executable, str(path), str(data)],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
        cwd=root,
        env=env,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    result: dict[str, object] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def test_binding_beyond_loopback_requires_a_token_printed_once(data: Path, tmp_path: Path) -> None:
    seen = run_in_namespace(NAMESPACE_SCRIPT, data, tmp_path)
    stderr = str(seen.get("stderr", ""))
    for host in ("10.77.0.1", "127.0.0.1"):
        assert seen[host + " bare"] == [401, False], seen  # no token: nothing readable
    token = str(seen["token"])
    assert len(token) >= 32, stderr
    assert stderr.count(token) == 1, stderr  # printed once
    assert "warning: listening on 0.0.0.0" in stderr
    for host in ("10.77.0.1", "127.0.0.1"):
        assert seen[host + " bearer"] == [200, True], seen
        assert seen[host + " first visit"] == [303, True], seen
        assert seen[host + " cookie"] == [200, True], seen
    assert urllib.parse.quote(token) == token  # fits a URL as it is


@pytest.mark.parametrize("bad", ["short-token", "has spaces in it, and; a semicolon"])
def test_a_token_that_cannot_go_into_a_url_or_cookie_is_refused(data: Path, bad: str) -> None:
    saved = structlog.get_config()  # the CLI configures logging for its process
    try:
        out = CliRunner().invoke(main, ["console", "--data", str(data), "--token", bad])
    finally:
        structlog.configure(**saved)
    assert out.exit_code == 2, out.output
    assert "--token" in out.output and "at least 16 characters" in out.output


def test_the_guard_answers_as_its_model_says(data: Path) -> None:
    """A seeded generator of requests (Host, credentials, method, Origin, Sec-Fetch-Site,
    session cookie, CSRF header) against a real read-write console with a token, each
    answer compared with a small model of the guard written from docs/console.md: 400 for a
    host it does not serve, else 401 without the token, else for a state change 403 unless
    same-origin (when it says) with its own session's CSRF token; what passes reaches the
    route (GET /api/topics: 200; POST .../rebuild on a console without an app: 400)."""
    rng = random.Random(2811)
    env = {"EVENTLANE_CONSOLE_TOKEN": TOKEN}  # the token from the environment, this time
    with console_process(data, "--read-write", token=TOKEN, env=env) as console:
        port = console.port
        cookie_name = f"eventlane-console-{port}"
        sessions = []
        for _ in range(2):
            client = console.client()
            csrf = client.get("/api/session")["csrf_token"]
            (sid,) = [c.value for c in client.cookies if c.name == cookie_name]
            sessions.append((sid, csrf))
        (a_sid, a_csrf), (b_sid, b_csrf) = sessions
        hosts = {
            f"127.0.0.1:{port}": True,
            f"localhost:{port}": True,
            f"LOCALHOST.:{port}": True,
            f"[::1]:{port}": True,
            "127.0.0.1": True,
            f"evil.example:{port}": False,
            f"127.0.0.1.evil.example:{port}": False,
            f"localhost.evil.example:{port}": False,
        }
        credentials = {
            "none": ({}, False),
            "bearer": ({"authorization": f"Bearer {TOKEN}"}, True),
            "wrong bearer": ({"authorization": "Bearer " + TOKEN[::-1]}, False),
            "basic": ({"authorization": f"Basic {TOKEN}"}, False),
            "cookie": ({"cookie": f"eventlane-console-token-{port}={TOKEN}"}, True),
            "other port's cookie": ({"cookie": f"eventlane-console-token-1={TOKEN}"}, False),
        }
        origins = [None, "same", "null", "http://evil.example", f"http://localhost:{port}"]
        sites = [None, "same-origin", "none", "same-site", "cross-site"]
        cookies = [None, a_sid, b_sid, "short"]
        csrfs = [None, "", a_csrf, b_csrf]
        mismatches = []
        for _ in range(200):
            host, host_ok = rng.choice(list(hosts.items()))
            cred_name = rng.choice(list(credentials))
            cred, token_ok = credentials[cred_name]
            method = rng.choice(["GET", "POST"])
            origin = rng.choice(origins)
            origin = f"http://{host}" if origin == "same" else origin
            site, sid, csrf = rng.choice(sites), rng.choice(cookies), rng.choice(csrfs)
            headers = dict(cred)
            if sid is not None:
                headers["cookie"] = "; ".join(
                    x for x in (headers.get("cookie"), f"{cookie_name}={sid}") if x
                )
            for name, value in (("origin", origin), ("sec-fetch-site", site)):
                if value is not None:
                    headers[name] = value
            if csrf is not None:
                headers["x-csrf-token"] = csrf
            # the model
            if not host_ok:
                want = 400
            elif not token_ok:
                want = 401
            elif method == "GET":
                want = 200
            else:
                same_origin = origin is None or origin == f"http://{host}"
                own_token = (sid, csrf) in ((a_sid, a_csrf), (b_sid, b_csrf))
                from_here = site in (None, "same-origin", "none")
                want = 400 if same_origin and from_here and own_token else 403
            path = "/api/topics" if method == "GET" else "/api/projectors/p/rebuild"
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            try:
                conn.putrequest(method, path, skip_host=True)
                conn.putheader("host", host)
                for name, value in headers.items():
                    conn.putheader(name, value)
                conn.putheader("content-length", "0")
                conn.endheaders()
                resp = conn.getresponse()
                got, body = resp.status, resp.read()
                framed = resp.getheader("x-frame-options") == "DENY"
            finally:
                conn.close()
            if got != want or not framed:
                mismatches.append((host, cred_name, method, origin, site, sid, csrf, got, want))
            if want != 200:
                assert b"notes" not in body
        assert not mismatches, mismatches[:5]
