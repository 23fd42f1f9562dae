"""Streamable HTTP for a team: one shared server, authenticated, confined to allowed roots.

Both protocol eras are served by the SDK's transport (the 2026-07-28 per-request
era and the legacy initialize handshake). Host/Origin protection is always set
explicitly, since the SDK switches it off for non-localhost binds when left unset.
"""

from __future__ import annotations

import ipaddress
import logging
import sys

from pydantic import AnyHttpUrl

from gradprobe.server.app import build_server, make_nondumpable
from gradprobe.server.auth import StaticTokenVerifier, load_tokens
from gradprobe.server.options import HttpOptions, ServeOptions
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


def serve_http(options: ServeOptions) -> int:
    http = options.http or HttpOptions()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s", stream=sys.stderr)
    try:
        tokens = load_tokens(http.token_file)
    except (OSError, ValueError) as exc:
        print(f"gradprobe: cannot read tokens: {exc}", file=sys.stderr)
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
    server.run(
        "streamable-http", host=http.host, port=http.port, streamable_http_path="/mcp",
        max_request_body_size=http.max_body,
        transport_security=transport_security(http.host, http.port, list(http.allowed_hosts), list(http.allowed_origins)),
    )
    return 0
