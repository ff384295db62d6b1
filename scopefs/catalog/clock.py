"""Time as integer microseconds since the epoch.

Integers compare exactly and cheaply in SQL and in the pure evaluator.
"""

from __future__ import annotations

import time


def now_us() -> int:
    return time.time_ns() // 1000
