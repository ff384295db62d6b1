"""What a write's content itself decides: forgotten claims, validity time.

Computed once from the staged bytes, before the first transaction (bad
content changes nothing), and used inside the activation transaction: the
claims are checked against the cell's rejection list there, so a forget
committing while the content was being written still wins; the validity
row is written there, so it exists exactly when the revision does.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import apsw

from scopefs.catalog import claims
from scopefs.catalog.clock import now_us
from scopefs.catalog.home import Home
from scopefs.catalog.policy import Decision
from scopefs.catalog.reasons import Reason
from scopefs.catalog.validity import Validity, read_validity

ALLOWED = Decision(True, Reason.ALLOWED)


@dataclass
class ContentFacts:
    head: bytes  # the bytes claims are read from (``claims.MAX_SCAN_BYTES``)
    secret: bytes  # the home's key, for the claims' keyed hashes
    validity: Validity
    _keys: list[str] | None = None

    def claim_keys(self) -> list[str]:
        """The content's claims, keyed; computed once, and only for a cell that has rejected any."""
        if self._keys is None:
            self._keys = claims.keys(self.secret, self.head, checking=True)
        return self._keys

    def check(self, catalog: apsw.Connection, agent_id: str) -> Decision:
        """Inside a commit: ``forgotten`` if the content carries a claim this cell rejects.

        A cell that never forgot anything costs one indexed lookup, not a
        scan of the content: most writes pay nothing for forgetting.
        """
        if not claims.any_forgotten(catalog, agent_id):
            return ALLOWED
        if claims.any_rejected(catalog, agent_id, self.claim_keys()):
            return Decision(False, Reason.FORGOTTEN)
        return ALLOWED

    def record(self, catalog: apsw.Connection, agent_id: str, revision_id: str,
               inherited: int | None = None) -> None:
        """Inside the activation: the revision's validity, if its front matter gives one.

        ``superseded-by`` denies the revision from its activation on: the
        note says itself that another one replaces it. ``inherited``: the
        time the sources it was made from stop being valid, if sooner.
        """
        until = self.validity.valid_until_us
        if self.validity.superseded_by is not None:
            until = now_us() if until is None else min(until, now_us())
        if inherited is not None:  # what it was made from runs out then (``writer.derive``)
            until = inherited if until is None else min(until, inherited)
        if until is None:
            return
        catalog.execute("INSERT INTO revision_validity (revision_id, agent_id, valid_until, superseded_by)"
                        " VALUES (?, ?, ?, ?)", (revision_id, agent_id, until, self.validity.superseded_by))


def read_head(fd: int, size: int) -> bytes:
    """The first ``claims.MAX_SCAN_BYTES`` of a staged file (positional reads: the offset is not ours)."""
    want = min(size, claims.MAX_SCAN_BYTES)
    parts: list[bytes] = []
    got = 0
    while got < want:
        chunk = os.pread(fd, want - got, got)
        if not chunk:
            break
        parts.append(chunk)
        got += len(chunk)
    return b"".join(parts)


def content_facts(home: Home, data: bytes) -> ContentFacts:
    """Facts of ``data`` (BadInput for a malformed front matter value, before anything is written)."""
    return ContentFacts(data, home.hmac_key(), read_validity(data))
