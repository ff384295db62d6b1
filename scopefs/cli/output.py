"""What the command line prints: people get lines, ``--json`` gets one object."""

from __future__ import annotations

import json
import sys
from typing import Any


def emit(as_json: bool, payload: dict[str, Any], lines: list[str] | None = None) -> None:
    if as_json:
        sys.stdout.write(json.dumps(payload, sort_keys=True) + "\n")
    else:
        for line in lines if lines is not None else [f"{k}: {v}" for k, v in payload.items()]:
            sys.stdout.write(line + "\n")
    sys.stdout.flush()


def fail(as_json: bool, exit_code: int, message: str, reason: str | None = None) -> int:
    """One line on stderr (and one JSON object on stdout with --json)."""
    line = " ".join(str(message).split())  # exactly one line, whatever the message held
    sys.stderr.write(f"scopefs: {line}\n")
    if as_json:
        body: dict[str, Any] = {"error": line, "exit_code": exit_code}
        if reason is not None:
            body["reason"] = reason
        sys.stdout.write(json.dumps(body, sort_keys=True) + "\n")
    return exit_code
