"""How current one mount's view is, and what a refresh that fails means for it.

``MountState`` refreshes its view on the catalog thread and applies it on
the trio thread (``MountState._refreshed``); this room keeps the record
those refreshes leave and the three rules that read it, so that each rule
is stated once, beside the clock it reads:

* **Fail closed.** A catalog unreadable for ``FAIL_CLOSED_S``, counted
  from when the first of the failing refreshes began, empties the view: a
  revocation the mount cannot see must not keep serving notes. Counted
  from the first failure, not from the last success: on a quiet mount the
  follower reads only every ``FOLLOW_S`` (``vfs.follow``), and one failed
  read after a quiet second would empty the view at once, detaching every
  open file for good.
* **Suspended.** A refresh that fails right after a write of the mount's
  own leaves a view that lacks that write (a note's replaced revision, no
  new note, a moved name where it was). Nothing is served, saved or made
  until a refresh succeeds; a commit meanwhile reads the view again, but
  not within ``RETRY_S`` of the last failure, so an unmount settling many
  writers against a busy catalog does not wait a timeout per writer.
* **Unmoved.** A refresh whose mark (``catalog.marks``) equals the one
  taken for the view applied need not read the view again, as long as no
  expiry of that view has passed and it was read whole less than
  ``FULL_REFRESH_S`` ago (a net, as the follower's).

Nothing here awaits or reads a database. The record is written on the
trio thread, by a refresh that holds ``MountState._sync_lock``; ``unmoved``
reads it on the catalog thread, inside such a refresh, so nothing writes
it meanwhile.
"""

from __future__ import annotations

import math
import time

from scopefs.catalog.clock import now_us
from scopefs.catalog.marks import Mark
from scopefs.catalog.visible import VisibleView

FAIL_CLOSED_S = 1.0  # a catalog unreadable for this long empties the view
RETRY_S = 0.1  # a suspended mount's commit reads the view again only this long after a refresh failed
FULL_REFRESH_S = 5.0  # the longest a view goes without being read whole, however quiet its databases


class Currency:
    """The record of one mount's refreshes: when the view applied was read, and what failed since."""

    def __init__(self) -> None:
        self.fresh_since = 0  # when the refresh behind the view applied began (``time.monotonic_ns``)
        self.read_whole_at = time.monotonic()  # the last refresh that read the view, not only the mark
        self.refreshes = [0, 0]  # [read whole, answered by the mark]: what following the catalog cost
        self._marked: tuple[Mark, VisibleView] | None = None  # the databases as the view applied was read
        self._failing_since: float | None = None  # when the first refresh failing since the last success began
        self._failed_at = -math.inf  # when the last refresh failed
        # Whether the view applied lacks a write of the mount's own (a refresh right after it failed):
        # nothing is served, saved or made until a refresh succeeds. A plain attribute: every READ asks.
        self.suspended = False

    def covers(self, asked_ns: int) -> bool:
        """Whether the view applied was read by a refresh that began after ``asked_ns``: such a refresh
        saw every commit that had returned by then (catalog calls run one at a time)."""
        return self.fresh_since > asked_ns

    def unmoved(self, taken: Mark, view: VisibleView) -> bool:
        """Whether ``view`` is still what a refresh would read: it is the view the last mark was taken
        for, no commit that can change a view came since ``taken``, no expiry of it has passed, and it
        was read whole less than ``FULL_REFRESH_S`` ago."""
        marked = self._marked
        if marked is None or marked[1] is not view or not taken.same_as(marked[0]):
            return False
        if time.monotonic() - self.read_whole_at >= FULL_REFRESH_S:
            return False
        now = now_us()
        return all(until is None or now < until for until in (view.valid_until, view.access.evidence_until))

    def failed(self, began_ns: int, *, wrote: bool) -> bool:
        """Record a refresh that began at ``began_ns`` and failed; ``wrote``: right after a write of the
        mount's own, which the view applied therefore lacks. Whether the view must now be emptied: the
        catalog has been unreadable for ``FAIL_CLOSED_S`` (a single slow failure counts whole).
        The caller has forgotten the mark (``forget_mark``)."""
        if wrote:
            self.suspended = True
        now = time.monotonic()
        self._failed_at = now
        if self._failing_since is None:
            self._failing_since = began_ns / 1e9
        return now - self._failing_since > FAIL_CLOSED_S

    def forget_mark(self) -> None:
        """Whatever a call on the catalog thread did before it failed (a commit, a refresh) may have
        changed the databases: the next refresh reads the view whole, not by the mark."""
        self._marked = None

    def read(self, *, whole: bool) -> None:
        """Record a refresh that succeeded, before its view is applied (``applied``). ``whole``: it
        read the view, rather than finding it ``unmoved``."""
        self._failing_since = None
        if whole:
            self.read_whole_at = time.monotonic()
        self.refreshes[0 if whole else 1] += 1
        self._marked = None  # until the view it was taken for is the one applied

    def applied(self, began_ns: int, taken: Mark | None, view: VisibleView) -> None:
        """Record that ``view``, read by the refresh that began at ``began_ns`` after ``taken`` was taken,
        is the view applied now: it shows every write of the mount's own that had returned by then."""
        self.suspended = False
        self.fresh_since = began_ns
        self._marked = (taken, view) if taken is not None else None

    @property
    def failing(self) -> bool:
        """Whether the last refresh failed."""
        return self._failing_since is not None

    @property
    def may_retry(self) -> bool:
        """Whether a suspended mount's commit should read the view again: ``RETRY_S`` has passed since
        the last refresh failed."""
        return time.monotonic() - self._failed_at >= RETRY_S
