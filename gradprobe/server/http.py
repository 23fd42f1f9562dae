"""Streamable HTTP for a team: one shared server, authenticated, confined to allowed roots.

Both protocol eras are served by the SDK's transport (the 2026-07-28 per-request
era and the legacy initialize handshake). Host/Origin protection is always set
explicitly, since the SDK switches it off for non-localhost binds when left unset.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import sys

from pydantic import AnyHttpUrl

from gradprobe.server.app import build_server, make_nondumpable
from gradprobe.server.auth import StaticTokenVerifier, load_tokens
from gradprobe.server.events import RETRY_MS, BoundedEventStore
from gradprobe.server.runtime import Runtime

log = logging.getLogger("gradprobe.http")


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def transport_security(host: str, port: int, allowed_hosts: list[str], allowed_origins: list[str]):
    from mcp.server.transport_security import TransportSecuritySettings

    hosts = list(allowed_hosts) or ([f"127.0.0.1:{port}", f"localhost:{port}", f"[::1]:{port}"] if is_loopback(host) else [f"{host}:{port}"])
    origins = list(allowed_origins) or [f"http://{h}" for h in hosts]
    return TransportSecuritySettings(enable_dns_rebinding_protection=True, allowed_hosts=hosts, allowed_origins=origins)


def serve_http(args) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s", stream=sys.stderr)
    try:
        tokens = load_tokens(args.token_file)
    except (OSError, ValueError) as exc:
        print(f"gradprobe: cannot read tokens: {exc}", file=sys.stderr)
        return 2
    if not tokens and not is_loopback(args.host) and not args.insecure_no_auth:
        print(f"gradprobe: refusing to serve {args.host} without authentication: give --token-file or GRADPROBE_TOKENS "
              "(or --insecure-no-auth if something in front of it authenticates)", file=sys.stderr)
        return 2
    make_nondumpable()
    roots = args.allow_root or [os.getcwd()]
    from gradprobe.cli import _executor, _limits

    runtime = Runtime(max_concurrent=args.max_concurrent, warm=not args.cold, allowed_roots=roots,
                      per_caller=args.per_caller, allowed_pythons=args.allow_python, limits=_limits(args),
                      executor=_executor(args))
    verifier = auth = None
    if tokens:
        from mcp.server.auth.settings import AuthSettings

        verifier = StaticTokenVerifier(tokens)
        public = args.public_url or f"http://{args.host}:{args.port}"
        auth = AuthSettings(issuer_url=AnyHttpUrl(args.issuer_url or public), resource_server_url=AnyHttpUrl(f"{public}/mcp"))
    server = build_server(runtime, token_verifier=verifier, auth=auth)
    log.info("serving http://%s:%s/mcp roots=%s auth=%s users=%d max_concurrent=%d per_caller=%d", args.host, args.port,
             ",".join(runtime.allowed_roots), "bearer" if tokens else "none", len(set(tokens.values())),
             runtime.max_concurrent, runtime.per_caller)
    server.run(
        "streamable-http", host=args.host, port=args.port, streamable_http_path="/mcp",
        max_request_body_size=args.max_body, transport_security=transport_security(args.host, args.port, args.allowed_host, args.allowed_origin),
        event_store=BoundedEventStore(), retry_interval=RETRY_MS,  # SSE: a priming event, `retry`, resumable streams
    )
    return 0
