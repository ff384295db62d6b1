"""Quick wake-ups while requests stream: a CPU latency bound held only while the mount is busy.

Every request is a round trip between two processes: the tool sleeps in
the kernel until the server answers, and the server sleeps until the next
request. On a virtual machine a CPU with nothing to run halts, and waking
it again takes an interrupt through the hypervisor, which costs more than
most requests take to answer. A warm ``grep -r`` over 10,000 notes is one
close (a FLUSH, answered in C) per file, so the wake-ups are most of its
time: 0.23 s, against 0.076 s with the bound below held and 0.034 s
native (``bench/RESULTS.md``, issue 14 ninth step).

Linux lets a process bound how long idle CPUs take to wake (PM QoS:
``/dev/cpu_dma_latency``). While a bound of 0 is held, a cpuidle driver
with a polling state (``haltpoll`` on these machines) keeps idle CPUs
polling instead of halting, so a wake-up is a store to memory rather than
an interrupt. Polling burns the CPUs' time on the host for as long as the
bound is held, so a mount holds it only while requests stream (at least
``BURST_REQUESTS`` within ``BURST_WINDOW_S``) and for ``HOLD_S`` after
the last such stream: a tool that looks at one file now and then, or an
idle mount, holds nothing.

What a bound does is system-wide, so it is the operator's choice:
``SCOPEFS_CPU_LATENCY`` in the mount server's environment is ``off``, or
the bound in microseconds (default ``0``). Only root may open the device;
a server that cannot serves as before (and says so once if the variable
asked for a bound explicitly).
"""

from __future__ import annotations

import contextlib
import logging
import os
import struct

import trio

from scopefs.catalog.errors import BadInput

DEVICE = "/dev/cpu_dma_latency"
ENVIRONMENT = "SCOPEFS_CPU_LATENCY"
HOLD_S = 0.5  # how long after the last stream of requests the bound stays
BURST_REQUESTS = 16  # requests within BURST_WINDOW_S that make a stream
BURST_WINDOW_S = 0.05
NO_BOUND_US = 2_000_000_000  # the kernel's own default request (PM_QOS_CPU_LATENCY_DEFAULT_VALUE): no bound
MAX_BOUND_US = 1_000_000  # a bound above a second bounds nothing a request would notice

log = logging.getLogger(__name__)


def bound_from(value: str | None) -> int | None:
    """The bound ``SCOPEFS_CPU_LATENCY`` asks for, in microseconds, or None for ``off``.

    Unset or empty means the default, 0. Anything else than ``off`` or a
    whole number from 0 to ``MAX_BOUND_US`` is refused, so that a typo does
    not silently leave the machine polling (or not).
    """
    if value is None or value == "":
        return 0
    if value == "off":
        return None
    if len(value) <= 8 and value.isascii() and value.isdigit() and int(value) <= MAX_BOUND_US:
        return int(value)
    raise BadInput(f"{ENVIRONMENT} must be 'off' or a whole number of microseconds from 0 to {MAX_BOUND_US}")


class CpuLatency:
    """The mount server's latency request: opened once, bounded while requests stream.

    ``touch`` is pyfuse3's ``on_wait`` (``vfs.server``): the session loop
    calls it with the requests received so far each time it goes back to
    waiting, closes answered in C included, so it is cheap and never
    raises. ``hold_while_busy`` is the task that lets the bound go
    ``HOLD_S`` after the last stream. Closing the descriptor, which the
    kernel does for a killed server too, withdraws the request.
    """

    def __init__(self, bound_us: int | None, *, device: str = DEVICE, explicit: bool = False) -> None:
        if bound_us is not None and not 0 <= bound_us <= MAX_BOUND_US:
            raise BadInput(f"a CPU latency bound is from 0 to {MAX_BOUND_US} µs")
        self.bound_us = bound_us
        self.held = False
        self._fd = -1
        self._last = 0.0  # when requests last streamed
        self._window_start = float("-inf")  # the window the rate is measured over: from a touch...
        self._window_received = 0  # ...and the requests received by then
        self._previous = (float("-inf"), 0)  # the last touch: when, and the requests received by then
        self._busy = trio.Event()
        if bound_us is None:
            return
        try:
            # Opening adds a request without a bound; writing a value bounds it.
            self._fd = os.open(device, os.O_WRONLY | os.O_CLOEXEC)
        except OSError as exc:
            (log.warning if explicit else log.info)(
                "%s: no CPU latency bound (%s): requests are answered as before", ENVIRONMENT, exc.strerror)

    def touch(self, received: int) -> None:
        """Requests stream when at least ``BURST_REQUESTS`` came per ``BURST_WINDOW_S`` since the window
        began. A window older than that starts again at the previous touch, so that requests the loop
        reports in a lump (it tells once per run answered in C) still count after a short gap, and a
        lump after a long idle (``received`` counts the requests that woke it too) is spread over it."""
        if self._fd < 0:
            return
        now = trio.current_time()
        if now - self._window_start > BURST_WINDOW_S:
            self._window_start, self._window_received = self._previous
        self._previous = (now, received)
        span = max(BURST_WINDOW_S, now - self._window_start)
        if (received - self._window_received) * BURST_WINDOW_S < BURST_REQUESTS * span:
            return
        self._last = now
        if not self.held and self.bound_us is not None and self._ask(self.bound_us):
            self.held = True
            self._busy.set()

    async def hold_while_busy(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        try:
            task_status.started()
            if self._fd < 0:
                return
            while True:
                await self._busy.wait()
                await self._quiet()
                self._busy = trio.Event()
                self.held = False
                self._ask(NO_BOUND_US)
        finally:
            self.close()

    async def _quiet(self) -> None:
        """Return once ``HOLD_S`` passed without a stream (``touch`` only moves ``_last``: cheap)."""
        while True:
            await trio.sleep_until(self._last + HOLD_S)
            if trio.current_time() >= self._last + HOLD_S:
                return

    def close(self) -> None:
        if self._fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = -1
            self.held = False

    def _ask(self, bound_us: int) -> bool:
        try:
            os.write(self._fd, struct.pack("=i", bound_us))
        except OSError as exc:  # the device went away: serve on without a bound
            log.warning("%s: the CPU latency request failed (%s): requests are answered as before",
                        ENVIRONMENT, exc.strerror)
            self.close()
            return False
        return True
