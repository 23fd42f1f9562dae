"""Bearer tokens for a team's shared server, through the SDK's TokenVerifier.

Tokens come from `--token-file FILE` (one `user:token` per line, `#` comments) or the
environment variable GRADPROBE_TOKENS (`user:token,user2:token2`). Every check
compares against every token with hmac.compare_digest, so timing says nothing
about which token nearly matched. Tokens are never logged.

A team with an OAuth/JWT issuer plugs in its own verifier instead: any object with
`async def verify_token(token) -> AccessToken | None` (mcp.server.auth.provider.TokenVerifier),
passed as `build_server(token_verifier=...)`; `AccessToken.client_id` is the caller
name used for fairness and audit lines.
"""

from __future__ import annotations

import hmac
import os

from mcp.server.auth.provider import AccessToken, TokenVerifier


def parse_tokens(text: str, sep: str = "\n") -> dict[str, str]:
    """`user:token` entries -> {token: user}; raises ValueError on a malformed entry."""
    tokens: dict[str, str] = {}
    for n, raw in enumerate(text.split(sep), 1):
        entry = raw.strip()
        if not entry or entry.startswith("#"):
            continue
        user, colon, token = entry.partition(":")
        if not colon or not user.strip() or len(token.strip()) < 8:
            raise ValueError(f"token entry {n} must be 'user:token' with a token of at least 8 characters")
        tokens[token.strip()] = user.strip()
    return tokens


def load_tokens(token_file: str | None) -> dict[str, str]:
    if token_file:
        with open(token_file, encoding="utf-8") as f:
            return parse_tokens(f.read())
    env = os.environ.get("GRADPROBE_TOKENS", "")
    return parse_tokens(env, sep=",") if env else {}


class StaticTokenVerifier(TokenVerifier):
    def __init__(self, tokens: dict[str, str]):
        self._tokens = [(t.encode(), user) for t, user in tokens.items()]

    async def verify_token(self, token: str) -> AccessToken | None:
        given = token.encode()
        found = None
        for candidate, user in self._tokens:  # no early exit: constant work whatever the token
            if hmac.compare_digest(candidate, given):
                found = user
        if found is None:
            return None
        return AccessToken(token=token, client_id=found, scopes=["gradprobe"])
