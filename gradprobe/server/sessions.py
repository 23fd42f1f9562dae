"""Stateful MCP sessions over HTTP, bounded per caller: one caller cannot use up the server's sessions.

The SDK's session manager caps sessions server-wide only, so one token could open
them all and lock every other user out. Here each caller (the credential that opened
the session; unauthenticated callers share one) holds at most `per_caller` sessions:
opening one more closes that caller's own oldest idle session (no request in flight),
or, when all of theirs are busy, refuses that caller alone with 503. Other callers
never pay for it. The server-wide cap and the idle timeout are lower than the SDK's.
"""

from __future__ import annotations

from typing import Any

PER_CALLER = 32
MAX_SESSIONS = 1000
IDLE_TIMEOUT_S = 600.0


def cap_sessions_per_caller(manager: Any, per_caller: int = PER_CALLER) -> None:
    """Wrap `manager` (mcp's StreamableHTTPSessionManager) so that admitting a session respects `per_caller`."""
    admit = manager._admit_session

    def admit_capped(requestor: Any) -> Any:
        owners = manager._session_owners
        theirs = [sid for sid in manager._server_instances if owners.get(sid) == requestor]
        while len(theirs) >= per_caller:
            idle = [sid for sid in theirs if getattr(manager._server_instances[sid], "_requests_in_flight", 0) == 0]
            if not idle:
                return None  # every one of theirs is busy: this caller waits, nobody else does
            _forget(manager, idle[0])  # the oldest idle (sessions are kept in the order they opened)
            theirs.remove(idle[0])
        return admit(requestor)

    manager._admit_session = admit_capped


def _forget(manager: Any, session_id: str) -> None:
    """What the manager's own discard does: forget the session at once (its id answers 404), end its transport."""
    transport = manager._server_instances.pop(session_id, None)
    manager._session_owners.pop(session_id, None)
    if transport is not None and not transport.is_terminated and manager._task_group is not None:
        manager._task_group.start_soon(transport.terminate)
