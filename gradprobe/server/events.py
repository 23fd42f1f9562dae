"""A bounded in-memory event store: SSE streams over HTTP get a priming event, a `retry` hint and resumability.

With an event store, the SDK's Streamable HTTP transport opens every SSE stream with
a priming event (an id and empty data, plus `retry: <ms>`), so a client whose
connection drops reconnects with `Last-Event-ID` and gets what it missed. Memory
is bounded: the oldest events are dropped first, by count and by size.
"""

from __future__ import annotations

import itertools
import secrets
from collections import OrderedDict

from mcp.server.streamable_http import EventCallback, EventId, EventMessage, EventStore, StreamId
from mcp.types import JSONRPCMessage

RETRY_MS = 2000


class BoundedEventStore(EventStore):
    def __init__(self, max_events: int = 5000, max_bytes: int = 64 * 1024 * 1024) -> None:
        self.max_events = max_events
        self.max_bytes = max_bytes
        self._events: OrderedDict[EventId, tuple[StreamId, JSONRPCMessage | None, int]] = OrderedDict()
        self._bytes = 0
        self._prefix = secrets.token_hex(4)
        self._counter = itertools.count(1)

    async def store_event(self, stream_id: StreamId, message: JSONRPCMessage | None) -> EventId:
        event_id = f"{self._prefix}-{next(self._counter)}"
        size = len(message.model_dump_json(by_alias=True, exclude_none=True)) if message is not None else 0
        self._events[event_id] = (stream_id, message, size)
        self._bytes += size
        while len(self._events) > self.max_events or (self._bytes > self.max_bytes and len(self._events) > 1):
            _, (_, _, old) = self._events.popitem(last=False)
            self._bytes -= old
        return event_id

    async def replay_events_after(self, last_event_id: EventId, send_callback: EventCallback) -> StreamId | None:
        if last_event_id not in self._events:
            return None
        stream_id = self._events[last_event_id][0]
        after = False
        for event_id, (sid, message, _) in list(self._events.items()):
            if after and sid == stream_id and message is not None:
                await send_callback(EventMessage(message, event_id))
            after = after or event_id == last_event_id
        return stream_id
