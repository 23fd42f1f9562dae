"""Bearer tokens for a team's shared server, through the SDK's TokenVerifier.

Tokens come from `--token-file FILE` (one `user:token` per line, `#` comments) or the
environment variable GRADPROBE_TOKENS (`user:token,user2:token2`). An entry may name that user's own
roots after the token (`alice:TOKEN /srv/code/alice /data/shared`): that user's calls may then read only
there (instead of the server's --allow-root), so two users' roots on one server stay apart. Every check
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


def parse_entries(text: str, sep: str = "\n") -> list[tuple[str, str, tuple[str, ...]]]:
    """`user:token [ROOT ...]` entries -> (user, token, that user's roots); raises ValueError on a malformed entry.
    Roots are absolute directories (symlinks resolved), never `/`."""
    out = []
    for n, raw in enumerate(text.split(sep), 1):
        entry = raw.strip()
        if not entry or entry.startswith("#"):
            continue
        user, colon, rest = entry.partition(":")
        token, *roots = rest.split() or [""]
        if not colon or not user.strip() or len(token.strip()) < 8:
            raise ValueError(f"token entry {n} must be 'user:token' with a token of at least 8 characters")
        for root in roots:
            if not os.path.isabs(root) or os.path.realpath(root) == "/":
                raise ValueError(f"token entry {n}: a root must be an absolute directory other than '/', got {root!r}")
        out.append((user.strip(), token.strip(), tuple(os.path.realpath(r) for r in roots)))
    return out


def parse_tokens(text: str, sep: str = "\n") -> dict[str, str]:
    """`user:token` entries -> {token: user}; raises ValueError on a malformed entry."""
    return {token: user for user, token, _ in parse_entries(text, sep)}


def parse_user_roots(text: str, sep: str = "\n") -> dict[str, tuple[str, ...]]:
    """{user: the roots their entries name} for users whose entries name any (the others get the server's roots)."""
    roots: dict[str, tuple[str, ...]] = {}
    for user, _, given in parse_entries(text, sep):
        if given:
            roots[user] = tuple(dict.fromkeys(roots.get(user, ()) + given))
    return roots


def _token_text(token_file: str | None) -> tuple[str, str]:
    if token_file:
        with open(token_file, encoding="utf-8") as f:
            return f.read(), "\n"
    return os.environ.get("GRADPROBE_TOKENS", ""), ","


def load_tokens(token_file: str | None) -> dict[str, str]:
    text, sep = _token_text(token_file)
    return parse_tokens(text, sep) if text else {}


def load_user_roots(token_file: str | None) -> dict[str, tuple[str, ...]]:
    """Each user's own roots from the token file (`alice:TOKEN /srv/code/alice /data/shared`)."""
    text, sep = _token_text(token_file)
    return parse_user_roots(text, sep) if text else {}


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
