"""The console's front door: one ASGI middleware in front of every route, Datasette's included.

Each request passes these checks in order; the first that fails answers it, before any
route runs:

1. **Host** (DNS rebinding): the ``Host`` header must name this console: an IP address
   literal (a rebinding attack needs a name the attacker's DNS answers for), ``localhost``,
   the ``--host`` it was started with, or a name given with ``--allow-host``. Else 400, in
   read-only mode too. The port is not compared (a reverse proxy may serve another).
2. **Access token**, when the console has one (``--token``, ``$EVENTLANE_CONSOLE_TOKEN``, or
   made up at start whenever it binds beyond loopback): ``Authorization: Bearer TOKEN``, the
   token cookie, or ``?token=TOKEN`` (a ``GET`` with it is answered 303 to the same URL
   without it, setting the cookie: ``HttpOnly; SameSite=Strict``). Else 401. Compared in
   constant time.
3. **State changes** (any method but ``GET``/``HEAD``/``OPTIONS``): 403 in a read-only
   console; in a ``--read-write`` one 403 unless the request carries the session's CSRF
   token in ``X-CSRF-Token`` together with that session's cookie, and neither ``Origin``
   (when sent: ``null`` is refused) nor ``Sec-Fetch-Site`` says it comes from elsewhere. A
   missing ``Origin`` exempts nothing: the token is always needed. A form on another page
   (sandboxed or not) cannot read the token (same-origin policy) nor send the header
   (cross-origin custom headers need a CORS preflight, which the console never grants).

Every answer, refusals included, says ``X-Frame-Options: DENY`` and
``Content-Security-Policy: frame-ancestors 'none'`` (the console is never framed), plus
``X-Content-Type-Options: nosniff`` and ``Referrer-Policy: same-origin``.

Sessions: a random id in a cookie (``HttpOnly; SameSite=Lax``, named with the port so two
consoles on one host keep theirs apart); the CSRF token is an HMAC of the id under a key
made at start, so nothing is stored and a restart ends every session. The session's token
is in ``scope["state"]["csrf_token"]`` for the pages (``<body hx-headers>``) and
``/api/session`` (API clients).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import ipaddress
import secrets
from collections.abc import Collection
from http.cookies import CookieError, SimpleCookie
from urllib.parse import parse_qsl, urlencode, urlsplit

import orjson
from starlette.datastructures import MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = ["SAFE_METHODS", "Guard", "csrf_of"]

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
CSRF_HEADER = "x-csrf-token"
FRAMING = [
    (b"x-frame-options", b"DENY"),
    (b"content-security-policy", b"frame-ancestors 'none'"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"same-origin"),
]
SESSION_BYTES = 24


def csrf_of(key: bytes, session: str) -> str:
    """The CSRF token of ``session`` under ``key``."""
    mac = hmac.new(key, session.encode(), hashlib.sha256).digest()
    return base64.urlsafe_b64encode(mac).rstrip(b"=").decode()


def split_host(header: str) -> str:
    """The host name of a ``Host`` header value, lower case, without port or trailing dot.

    >>> split_host("[::1]:8070"), split_host("Evil.Example.:80"), split_host("127.0.0.1")
    ('::1', 'evil.example', '127.0.0.1')
    """
    text = header.strip().lower()
    if text.startswith("["):
        return text[1 : text.find("]")] if "]" in text else ""
    return text.rpartition(":")[0].rstrip(".") if ":" in text else text.rstrip(".")


def is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


class Guard:
    """ASGI middleware: the host check, the access token, read-only and CSRF refusals, and
    the anti-framing headers (module docstring)."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        read_write: bool,
        token: str | None = None,
        hosts: Collection[str] = (),
    ) -> None:
        self.app = app
        self.read_write = read_write
        self.token = token
        self.hosts = frozenset({"localhost", *(split_host(h) for h in hosts)})
        self.key = secrets.token_bytes(32)

    # ------------------------------------------------------------------ checks
    def host_allowed(self, header: str) -> bool:
        name = split_host(header)
        return bool(name) and (name in self.hosts or is_ip(name))

    def token_ok(self, given: str | None) -> bool:
        return (
            self.token is not None
            and given is not None
            and hmac.compare_digest(given.encode(), self.token.encode())
        )

    def origin_refusal(self, headers: dict[str, str]) -> str | None:
        origin = headers.get("origin")
        if origin is not None and (origin == "null" or urlsplit(origin).netloc != headers["host"]):
            return f"cross-origin request from {origin} refused"
        site = headers.get("sec-fetch-site")
        if site is not None and site not in ("same-origin", "none"):
            return f"request from another site refused (Sec-Fetch-Site: {site})"
        return None

    # ------------------------------------------------------------------ ASGI
    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        port = scope["server"][1] if scope.get("server") else 0
        session_cookie = f"eventlane-console-{port}"
        token_cookie = f"eventlane-console-token-{port}"
        cookies = _cookies(headers.get("cookie", ""))
        set_cookies: list[str] = []

        async def send_guarded(message: Message) -> None:
            if message["type"] == "http.response.start":
                out = MutableHeaders(scope=message)
                for name, value in FRAMING:
                    out.raw.append((name, value))
                for cookie in set_cookies:
                    out.append("set-cookie", cookie)
            await send(message)

        async def refuse(status: int, error: str, extra: dict[str, str] | None = None) -> None:
            body = orjson.dumps({"error": error})
            start: Message = {
                "type": "http.response.start",
                "status": status,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                    *((k.encode(), v.encode()) for k, v in (extra or {}).items()),
                ],
            }
            if scope["type"] == "websocket":
                await send({"type": "websocket.close", "code": 1008})
                return
            await send_guarded(start)
            await send_guarded({"type": "http.response.body", "body": body})

        # 1. the Host header
        if not self.host_allowed(headers.get("host", "")):
            shown = headers.get("host", "")[:100]
            await refuse(400, f"this console does not serve the host {shown!r}")
            return
        # 2. the access token
        query = scope.get("query_string", b"").decode("latin-1")
        if self.token is not None:
            bearer = headers.get("authorization", "")
            from_url = dict(parse_qsl(query)).get("token")
            if self.token_ok(from_url):
                set_cookies.append(
                    f"{token_cookie}={self.token}; Path=/; HttpOnly; SameSite=Strict"
                )
                if scope["method"] in ("GET", "HEAD"):
                    rest = urlencode([(k, v) for k, v in parse_qsl(query) if k != "token"])
                    path = scope.get("raw_path") or scope["path"].encode()  # %-encoded
                    where = path.decode("latin-1") + ("?" + rest if rest else "")
                    await refuse(303, "token accepted", {"location": where})
                    return
            elif not (
                (bearer.startswith("Bearer ") and self.token_ok(bearer.removeprefix("Bearer ")))
                or self.token_ok(cookies.get(token_cookie))
            ):
                await refuse(
                    401,
                    "this console needs its access token: open the URL it printed at start"
                    " (…/?token=…) or send 'Authorization: Bearer TOKEN'",
                    {"www-authenticate": "Bearer"},
                )
                return
        # the session and its CSRF token
        session = cookies.get(session_cookie, "")
        known = len(session) >= SESSION_BYTES
        if not known:
            session = secrets.token_urlsafe(SESSION_BYTES)
            set_cookies.append(f"{session_cookie}={session}; Path=/; HttpOnly; SameSite=Lax")
        csrf = csrf_of(self.key, session)
        scope.setdefault("state", {})["csrf_token"] = csrf
        # 3. state changes
        if scope["type"] == "http" and scope["method"] not in SAFE_METHODS:
            refusal = None
            if not self.read_write:
                refusal = "read-only console: start it with --read-write to change anything"
            else:
                refusal = self.origin_refusal(headers)
                sent = headers.get(CSRF_HEADER, "").encode()
                if refusal is None and not (known and hmac.compare_digest(sent, csrf.encode())):
                    refusal = (
                        "missing or wrong CSRF token: send this session's token"
                        " (GET /api/session) as X-CSRF-Token, with the session cookie"
                    )
            if refusal is not None:
                await refuse(403, refusal)
                return
        await self.app(scope, receive, send_guarded)


def _cookies(header: str) -> dict[str, str]:
    jar: SimpleCookie = SimpleCookie()
    try:
        jar.load(header)
    except CookieError:
        return {}
    return {name: morsel.value for name, morsel in jar.items()}
