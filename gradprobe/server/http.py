"""Streamable HTTP for a team: one shared server, authenticated, confined to allowed roots.

Both protocol eras are served by the SDK's transport (the 2026-07-28 per-request
era and the legacy initialize handshake). Host/Origin protection is always set
explicitly, since the SDK switches it off for non-localhost binds when left unset.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import logging
import re
import sys
import time
from typing import Any

from pydantic import AnyHttpUrl

from gradprobe.server.app import build_server, make_nondumpable
from gradprobe.sandbox.roots import resolved_inside
from gradprobe.server.auth import StaticTokenVerifier, load_tokens, load_user_roots
from gradprobe.server.events import RETRY_MS, BoundedEventStore
from gradprobe.server.options import HttpOptions, ServeOptions
from gradprobe.server.runtime import Runtime
from gradprobe.server.sessions import IDLE_TIMEOUT_S, MAX_SESSIONS, cap_sessions_per_caller

log = logging.getLogger("gradprobe.http")


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def transport_security(host: str, port: int, allowed_hosts: list[str], allowed_origins: list[str]) -> Any:
    from mcp.server.transport_security import TransportSecuritySettings

    local = [f"127.0.0.1:{port}", f"localhost:{port}", f"[::1]:{port}"]
    hosts = list(allowed_hosts) or (local if is_loopback(host) else [f"{host}:{port}"])
    origins = list(allowed_origins) or [f"http://{h}" for h in hosts]
    return TransportSecuritySettings(enable_dns_rebinding_protection=True, allowed_hosts=hosts, allowed_origins=origins)


def serve_http(options: ServeOptions) -> int:
    http = options.http or HttpOptions()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s", stream=sys.stderr)
    try:
        tokens = load_tokens(http.token_file)
        user_roots = load_user_roots(http.token_file)
    except (OSError, ValueError) as exc:
        print(f"gradprobe: cannot read tokens: {exc}", file=sys.stderr)
        return 2
    options = dataclasses.replace(options, user_roots=tuple(sorted(user_roots.items())))
    exposed = _token_file_exposed(http.token_file, options)
    if exposed:
        print(f"gradprobe: {exposed}", file=sys.stderr)
        return 2
    if not tokens and not is_loopback(http.host) and not http.insecure_no_auth:
        print(f"gradprobe: refusing to serve {http.host} without authentication: give --token-file or GRADPROBE_TOKENS "
              "(or --insecure-no-auth if something in front of it authenticates)", file=sys.stderr)
        return 2
    make_nondumpable()
    runtime = Runtime(options)
    verifier = auth = None
    if tokens:
        from mcp.server.auth.settings import AuthSettings

        verifier = StaticTokenVerifier(tokens)
        public = http.public_url or f"http://{http.host}:{http.port}"
        auth = AuthSettings(issuer_url=AnyHttpUrl(http.issuer_url or public), resource_server_url=AnyHttpUrl(f"{public}/mcp"))
    server = build_server(runtime, token_verifier=verifier, auth=auth)
    log.info("serving http://%s:%s/mcp roots=%s auth=%s users=%d max_concurrent=%d per_caller=%d", http.host, http.port,
             ",".join(runtime.allowed_roots), "bearer" if tokens else "none", len(set(tokens.values())),
             runtime.max_concurrent, runtime.per_caller)
    app = server.streamable_http_app(
        streamable_http_path="/mcp", max_request_body_size=http.max_body, host=http.host,
        transport_security=transport_security(http.host, http.port, list(http.allowed_hosts), list(http.allowed_origins)),
        event_store=BoundedEventStore(), retry_interval=RETRY_MS,  # SSE: a priming event, `retry`, resumable streams
        max_sessions=MAX_SESSIONS, session_idle_timeout=IDLE_TIMEOUT_S,
    )
    cap_sessions_per_caller(server._lowlevel_server._session_manager)
    import uvicorn

    logging.getLogger("uvicorn.access").addFilter(RedactingFilter())
    config = uvicorn.Config(
        app, host=http.host, port=http.port, log_level="info",
        limit_concurrency=http.max_connections,  # beyond it: 503 at once, not a stalled server
        timeout_keep_alive=max(1, int(http.header_timeout_s)),  # idle connections are closed
        h11_max_incomplete_event_size=64 * 1024,  # a request head larger than this is refused
        http=request_timeout_protocol(http.header_timeout_s, http.body_timeout_s, http.max_connections),
    )
    limit, escape = RateLimitFilter(), EscapingFilter()  # one budget for every line the HTTP server can write
    for name in ("", "uvicorn", "uvicorn.access"):  # the handlers uvicorn's logging config and basicConfig made
        for handler in logging.getLogger(name).handlers:
            handler.addFilter(escape)
            handler.addFilter(limit)
    uvicorn.Server(config).run()
    return 0


def _token_file_exposed(token_file: str | None, options: ServeOptions) -> str | None:
    """Why the token file must not be served from where it is: inside a root a caller may name (a caller's read_paths
    or project could then show it to the call), or None."""
    if not token_file:
        return None
    every = set(options.roots) | {r for _, roots in options.user_roots for r in roots}
    if resolved_inside(token_file, every):
        return (f"the token file {token_file} is inside a root callers may read ({', '.join(sorted(every))}; over HTTP "
                "the working directory is the default root): keep it outside every root")
    return None


def connection_caps(max_connections: int) -> tuple[int, int]:
    """(connections one source address may hold, connections in all) before the oldest idle one is dropped: below
    uvicorn's own cap (`limit_concurrency`, where every request gets 503), so idle connections never reach it."""
    total = max(2, max_connections - max(1, max_connections // 8))
    return max(2, min(total, max(8, max_connections // 4))), total


def _idle(conn: Any) -> bool:
    """No request in progress: none sent yet, a head still trickling in, or between keep-alive requests."""
    cycle = conn.cycle
    return cycle is None or cycle.response_complete


def make_room(others: list, host: str, per_address: int, total: int) -> bool:
    """Close the oldest idle connections until one more from `host` fits; False when only busy ones are left."""
    same = [c for c in others if c._host == host]
    for pool, cap in ((same, per_address), (others, total)):
        while len(pool) + 1 > cap:
            idle = [c for c in pool if _idle(c)]
            if not idle:
                return False
            victim = min(idle, key=lambda c: c._since)
            victim.transport.close()
            for group in (same, others):
                if victim in group:
                    group.remove(victim)
    return True


def request_timeout_protocol(head_s: float, body_s: float, max_connections: int = 256) -> type:
    """uvicorn's h11 protocol, closing a connection whose request head has not arrived `head_s` after it opened (or
    after its previous response), or whose body has not arrived `body_s` after its head: half-finished requests,
    sent slowly or never finished, cannot pile up. A new connection over its source address's share or over the
    total (`connection_caps`) makes room by closing the oldest *idle* connection (no request in progress: none
    sent yet, a head still trickling in, or between keep-alive requests) of that address, or of all; a request
    being served (a running check, an open stream) is never dropped; with nothing idle to drop, the newcomer is."""
    from uvicorn.protocols.http.h11_impl import H11Protocol

    per_address, total = connection_caps(max_connections)

    class RequestTimeoutProtocol(H11Protocol):
        _timer = None
        _timed_cycle = None  # the request whose body the timer is counting
        _host = ""
        _since = 0.0  # when it last became idle (opened, or finished a response)

        def _make_room(self) -> None:
            others = [c for c in self.connections if c is not self and isinstance(c, RequestTimeoutProtocol)
                      and not c.transport.is_closing()]
            if not make_room(others, self._host, per_address, total):
                self.transport.close()  # everything there is working: the newcomer waits for none of it

        def _arm(self, seconds: float) -> None:
            self._disarm()
            self._timer = self.loop.call_later(seconds, self._expire)

        def _disarm(self) -> None:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None

        def _expire(self) -> None:
            cycle = self.cycle
            if cycle is None or cycle.response_complete or cycle.more_body:  # no head yet, or a body still missing
                self.transport.close()

        def connection_made(self, transport: Any) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._host = str((self.client or ("",))[0])
            self._since = self.loop.time()
            self._arm(head_s)
            self._make_room()

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            cycle = self.cycle
            if cycle is None or cycle.response_complete:
                return  # still waiting for a head: its timer runs on
            if cycle.more_body:
                if self._timed_cycle is not cycle:  # the head just came: the body has its own bounded time
                    self._timed_cycle = cycle
                    self._arm(body_s)
            else:
                self._disarm()  # the whole request is in: the app's own timeouts apply from here

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._since = self.loop.time()
            self._arm(head_s)

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

    return RequestTimeoutProtocol


class RedactingFilter(logging.Filter):
    """Access-log lines without query strings (a token sent as ?access_token=... is refused, and not logged)."""

    _QUERY = re.compile(r"\?[^ \"]*")

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple) and len(record.args) >= 3:
            args = list(record.args)
            args[2] = self._QUERY.sub("?[redacted]", str(args[2]))
            record.args = tuple(args)
        record.msg = self._QUERY.sub("?[redacted]", str(record.msg)) if not record.args else record.msg
        return True


_UNPRINTABLE = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def _escape(value: Any) -> Any:
    return _UNPRINTABLE.sub(lambda m: f"\\x{ord(m.group()):02x}", value) if isinstance(value, str) else value


class EscapingFilter(logging.Filter):
    """A log line is one line: newlines and terminal control characters in what a request brought (a header, a
    path, a field the SDK logs) are written as \\xNN escapes, so no line can forge another or drive the terminal."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not record.args:  # a message formatted by its caller (an f-string of the SDK's)
            record.msg = _escape(record.msg)
        elif isinstance(record.args, tuple):
            record.args = tuple(_escape(a) for a in record.args)
        elif isinstance(record.args, dict):
            record.args = {k: _escape(v) for k, v in record.args.items()}
        return True


class RateLimitFilter(logging.Filter):
    """At most `per_second` log records a second from the HTTP server (its handlers share one budget); the rest are
    counted and reported on the next line that gets through. Audit records are always written."""

    def __init__(self, per_second: int = 20):
        super().__init__()
        self.per_second, self.window, self.count, self.dropped = per_second, 0, 0, 0

    def filter(self, record: logging.LogRecord) -> bool:
        if record.name == "gradprobe.audit":
            return True
        now = int(time.monotonic())
        if now != self.window:
            if self.dropped:
                record.msg = f"[{self.dropped} log lines dropped] " + str(record.msg)
            self.window, self.count, self.dropped = now, 0, 0
        self.count += 1
        if self.count > self.per_second:
            self.dropped += 1
            return False
        return True
