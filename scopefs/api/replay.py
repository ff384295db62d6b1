"""Refusing a request seen before: one nonce per request, within a window.

Every request carries a fresh nonce and the time it was made. The guard
accepts it only if the time is at most ``window_s`` old, at most
``FUTURE_S`` ahead, and not before the guard started, and the nonce was
not seen under the same capability inside the window. Capabilities are
bound to the server process that issued them (``capabilities``), so no
other process, and no later start of this one, can be replayed into.
"Now" never moves back (a wall clock stepped back would otherwise
revive nonces already forgotten). Memory is bounded: past
``max_entries`` live nonces, or ``per_grant`` of one capability, new
requests are refused (fail closed) until old ones age out.

One guard serves every worker of a server (``service``): a check is one
step under the guard's lock, so a nonce sent twice at once, on two
threads, is accepted exactly once, and the counts behind the bounds
never lose an update.
"""

from __future__ import annotations

import heapq
import re
import threading

from scopefs.catalog.errors import BadInput, Denied
from scopefs.catalog.reasons import Reason

NONCE = re.compile(r"[A-Za-z0-9_-]{16,64}")
WINDOW_S = 120.0
FUTURE_S = 5.0  # clocks of one machine: a request from further ahead is refused
MAX_ENTRIES = 200_000
PER_GRANT = 20_000  # one capability cannot take every slot


class ReplayGuard:
    """The nonces of one server, for the length of the window."""

    def __init__(self, started_us: int, *, window_s: float = WINDOW_S, max_entries: int = MAX_ENTRIES,
                 per_grant: int = PER_GRANT) -> None:
        self._started_us = started_us
        self._latest_us = started_us  # the latest "now" seen: it never moves back
        self._window_us = int(window_s * 1_000_000)
        self._max = max_entries
        self._per_grant = per_grant
        self._seen: set[tuple[str, str]] = set()
        self._by_grant: dict[str, int] = {}
        self._expiry: list[tuple[int, str, str]] = []  # (expires, grant, nonce), a heap
        self._lock = threading.Lock()  # the guard is the process's: every worker thread checks here

    def check(self, grant_id: str, nonce: object, at_us: object, now_us: int) -> None:
        """Accept a request once (BadInput for a malformed nonce or time, Denied for a replay)."""
        if not isinstance(nonce, str) or NONCE.fullmatch(nonce) is None:
            raise BadInput("nonce must be 16 to 64 characters of [A-Za-z0-9_-]")
        if not isinstance(at_us, int) or isinstance(at_us, bool):
            raise BadInput("ts must be an integer (microseconds since the epoch)")
        with self._lock:
            self._admit(grant_id, nonce, at_us, now_us)

    def _admit(self, grant_id: str, nonce: str, at_us: int, now_us: int) -> None:
        now_us = self._latest_us = max(now_us, self._latest_us)
        self._prune(now_us)
        if now_us - at_us > self._window_us or at_us - now_us > FUTURE_S * 1_000_000 or at_us < self._started_us:
            raise Denied(Reason.INVALID_CONTEXT, "denied: the request is too old or from the future")
        key = (grant_id, nonce)
        if key in self._seen:
            raise Denied(Reason.INVALID_CONTEXT, "denied: the request was replayed")
        if len(self._seen) >= self._max or self._by_grant.get(grant_id, 0) >= self._per_grant:
            raise Denied(Reason.INVALID_CONTEXT, "denied: too many requests in flight; try again")
        self._seen.add(key)
        self._by_grant[grant_id] = self._by_grant.get(grant_id, 0) + 1
        heapq.heappush(self._expiry, (max(at_us, now_us) + self._window_us, grant_id, nonce))

    def _prune(self, now_us: int) -> None:
        while self._expiry and self._expiry[0][0] < now_us:
            _, grant_id, nonce = heapq.heappop(self._expiry)
            self._seen.discard((grant_id, nonce))
            left = self._by_grant.get(grant_id, 1) - 1
            if left > 0:
                self._by_grant[grant_id] = left
            else:
                self._by_grant.pop(grant_id, None)
