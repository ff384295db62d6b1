"""Refusing a request seen before: one nonce per request, within a window.

Every request carries a fresh nonce and the time it was made. The guard
accepts it only if the time is within ``window_s`` of now and not before
the guard started (so a restart cannot reopen the window for requests
made earlier), and the nonce was not seen under the same capability
inside the window. Memory is bounded: past ``max_entries`` live nonces
new requests are refused (fail closed) until old ones age out.
"""

from __future__ import annotations

import heapq
import re

from scopefs.catalog.errors import BadInput, Denied
from scopefs.catalog.reasons import Reason

NONCE = re.compile(r"[A-Za-z0-9_-]{16,64}")
WINDOW_S = 120.0
MAX_ENTRIES = 200_000


class ReplayGuard:
    """The nonces of one server, for the length of the window."""

    def __init__(self, started_us: int, *, window_s: float = WINDOW_S, max_entries: int = MAX_ENTRIES) -> None:
        self._started_us = started_us
        self._window_us = int(window_s * 1_000_000)
        self._max = max_entries
        self._seen: set[tuple[str, str]] = set()
        self._expiry: list[tuple[int, str, str]] = []  # (expires, grant, nonce), a heap

    def check(self, grant_id: str, nonce: object, at_us: object, now_us: int) -> None:
        """Accept a request once (BadInput for a malformed nonce or time, Denied for a replay)."""
        if not isinstance(nonce, str) or NONCE.fullmatch(nonce) is None:
            raise BadInput("nonce must be 16 to 64 characters of [A-Za-z0-9_-]")
        if not isinstance(at_us, int) or isinstance(at_us, bool):
            raise BadInput("ts must be an integer (microseconds since the epoch)")
        self._prune(now_us)
        if abs(now_us - at_us) > self._window_us or at_us < self._started_us:
            raise Denied(Reason.INVALID_CONTEXT, "denied: the request is too old or from the future")
        key = (grant_id, nonce)
        if key in self._seen:
            raise Denied(Reason.INVALID_CONTEXT, "denied: the request was replayed")
        if len(self._seen) >= self._max:
            raise Denied(Reason.INVALID_CONTEXT, "denied: too many requests in flight; try again")
        self._seen.add(key)
        heapq.heappush(self._expiry, (at_us + self._window_us, grant_id, nonce))

    def _prune(self, now_us: int) -> None:
        while self._expiry and self._expiry[0][0] < now_us:
            _, grant_id, nonce = heapq.heappop(self._expiry)
            self._seen.discard((grant_id, nonce))
