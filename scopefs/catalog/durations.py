"""Durations as the command line reads them: ``30s``, ``15m``, ``12h``, ``7d``."""

from __future__ import annotations

import re

from scopefs.catalog.errors import BadInput

_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
# Bounded: at most 9 digits, so parsing cost and the result are both small.
_DURATION = re.compile(r"([1-9][0-9]{0,8})([smhd])")
MAX_SECONDS = 3650 * 86400  # ten years; longer is almost certainly a typo


def parse_duration_us(text: str) -> int:
    """Microseconds in ``text``, or BadInput with a one-line reason."""
    match = _DURATION.fullmatch(text) if isinstance(text, str) and len(text) <= 10 else None
    if match is None:
        raise BadInput("malformed duration: expected a positive number and a unit s, m, h or d"
                       " (e.g. 30s, 15m, 12h, 7d)")
    seconds = int(match.group(1)) * _UNIT_SECONDS[match.group(2)]
    if seconds > MAX_SECONDS:
        raise BadInput("duration too long: at most 3650d")
    return seconds * 1_000_000
