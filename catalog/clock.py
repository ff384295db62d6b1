"""Time as integer microseconds since the epoch.

Integers compare exactly and cheaply in SQL and in the pure evaluator; the
command line formats them for people.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime


def now_us() -> int:
    return time.time_ns() // 1000


def iso(us: int | None) -> str | None:
    if us is None:
        return None
    return datetime.fromtimestamp(us / 1_000_000, tz=UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
