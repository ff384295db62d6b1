"""A busy mount bounds the CPUs' wake-up latency, and only while busy (``vfs.latency``).

Seen from outside, through the kernel's own answer: reading
``/dev/cpu_dma_latency`` gives the lowest bound any process holds. The
mount is told a bound no other process here asks for (7 µs), so the
aggregate shows whether it is the mount's: held once requests come, let go
within ``HOLD_S`` of the last one.
"""

from __future__ import annotations

import contextlib
import os
import struct
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio
import trio.testing

from scopefs.catalog.errors import BadInput
from scopefs.vfs.latency import (
    BURST_REQUESTS,
    BURST_WINDOW_S,
    DEVICE,
    ENVIRONMENT,
    HOLD_S,
    MAX_BOUND_US,
    NO_BOUND_US,
    CpuLatency,
    bound_from,
)
from tests.conftest import Scenario
from tests.mountkit import Mounts, mounts, view_servers, wait_until  # noqa: F401

# The bound is the lowest any process on the host holds: another test's mount would hide this one's.
pytestmark = pytest.mark.serial

MOUNT_BOUND_US = 7


def current_bound() -> int:
    """The bound the kernel applies now: the lowest of every process's request."""
    fd = os.open(DEVICE, os.O_RDONLY)
    try:
        return int(struct.unpack("=i", os.read(fd, 4))[0])
    finally:
        os.close(fd)


def descriptors_of(pid: int, target: str) -> int:
    count = 0
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(OSError):  # a descriptor closed meanwhile
            count += os.readlink(fd) == target
    return count


def one_server(where: Path) -> int:
    (pid,) = view_servers(where)
    return pid


def holds_the_device(pid: int) -> bool:
    return descriptors_of(pid, DEVICE) > 0


@pytest.fixture
def bound_env(scenario: Scenario) -> Iterator[dict[str, str]]:
    env = scenario.cli.env
    yield env
    env.pop(ENVIRONMENT, None)


def test_the_bound_is_held_while_requests_come_and_let_go_after(scenario: Scenario, mounts: Mounts,  # noqa: F811
                                                                bound_env: dict[str, str]) -> None:
    bound_env[ENVIRONMENT] = str(MOUNT_BOUND_US)
    assert current_bound() > MOUNT_BOUND_US, "another process holds a stricter bound: the mount's would not show"
    where = mounts.mount(scenario.alice_session, "alice")
    assert holds_the_device(one_server(where))
    note = where / "private" / "notes" / "busy.md"
    note.write_bytes(b"a note to close again and again\n")
    time.sleep(2 * HOLD_S)  # the mount's and the write's requests (releases come after the reply) are over
    wait_until(lambda: current_bound() != MOUNT_BOUND_US)

    def request_then_look() -> bool:
        for _ in range(4 * BURST_REQUESTS):  # a stream of closes (FLUSH), answered in C: Python never sees them
            note.read_bytes()
        return current_bound() == MOUNT_BOUND_US

    for _ in range(50):  # a tool that looks now and then holds nothing
        note.read_bytes()
        assert current_bound() != MOUNT_BOUND_US
        time.sleep(BURST_WINDOW_S * 2)

    wait_until(request_then_look)
    assert wait_until(lambda: current_bound() != MOUNT_BOUND_US, timeout=5)  # idle again: nothing held


def test_off_opens_nothing(scenario: Scenario, mounts: Mounts, bound_env: dict[str, str]) -> None:  # noqa: F811
    bound_env[ENVIRONMENT] = "off"
    where = mounts.mount(scenario.alice_session, "alice")
    pid = one_server(where)
    for _ in range(20):
        (where / "private" / "notes").is_dir()
    assert not holds_the_device(pid)


def test_a_bad_value_refuses_the_mount(scenario: Scenario, tmp_path: Path, bound_env: dict[str, str]) -> None:
    bound_env[ENVIRONMENT] = "fast"
    where = tmp_path / "refused"
    where.mkdir()
    result = scenario.cli("mount", scenario.alice_session, str(where))
    assert result.code == 2
    assert ENVIRONMENT in result.err
    with open("/proc/self/mountinfo", encoding="utf-8") as info:
        assert not any(line.split()[4] == str(where) for line in info)


@pytest.mark.parametrize(("value", "bound"), [(None, 0), ("", 0), ("off", None), ("0", 0), ("25", 25),
                                              (str(MAX_BOUND_US), MAX_BOUND_US)])
def test_values(value: str | None, bound: int | None) -> None:
    assert bound_from(value) == bound


@pytest.mark.parametrize("value", ["-1", "1e3", "ten", "OFF", " 5", str(MAX_BOUND_US + 1), "٣", "9" * 400,
                                   str(NO_BOUND_US)])
def test_bad_values(value: str) -> None:
    with pytest.raises(BadInput):
        bound_from(value)



def is_held(latency: CpuLatency) -> bool:
    """``latency.held`` read afresh: mypy would keep an ``assert`` on it narrowed across an ``await``."""
    return latency.held


def written_bounds(path: Path) -> list[int]:
    data = path.read_bytes()
    return [int(v) for (v,) in struct.iter_unpack("=i", data)]


def test_the_bound_follows_streams_of_requests(tmp_path: Path) -> None:
    """The timing of ``CpuLatency`` on trio's mock clock, a plain file standing in for the device."""
    device = Path(os.path.realpath(tmp_path)) / "cpu_dma_latency"
    device.touch()
    clock = trio.testing.MockClock()
    latency = CpuLatency(3, device=str(device))
    seen: list[list[int]] = []
    received = 0

    async def touch(requests: int, after_s: float) -> None:
        nonlocal received
        clock.jump(after_s)
        received += requests
        latency.touch(received)
        await trio.testing.wait_all_tasks_blocked()

    async def scenario() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(latency.hold_while_busy)
            assert descriptors_of(os.getpid(), str(device)) == 1
            for _ in range(100):  # one request every 10 ms: a trickle, never a stream
                await touch(1, 0.010)
            await touch(1, 0.2)
            await touch(BURST_REQUESTS - 2, 0.001)  # 15 requests in a window: just short of a stream
            seen.append(written_bounds(device))
            await touch(64, 10.0)  # a lump after a long idle: the requests that woke the loop, spread over it
            seen.append(written_bounds(device))
            await touch(64, 0.030)  # a run of closes answered in C, reported in one lump after a short gap
            assert latency.held
            for _ in range(1000):  # a stream: one touch a millisecond (a request handled in Python each)
                await touch(1, 0.001)
            assert latency.held
            seen.append(written_bounds(device))
            await touch(1, HOLD_S / 2)  # a trickle after the stream does not keep the bound
            assert latency.held
            clock.jump(HOLD_S / 2 + 0.01)
            await trio.testing.wait_all_tasks_blocked()
            assert not is_held(latency)
            seen.append(written_bounds(device))
            await touch(1, 0.5)
            await touch(BURST_REQUESTS, 0.002)  # a short burst holds it again
            seen.append(written_bounds(device))
            nursery.cancel_scope.cancel()

    trio.run(scenario, clock=clock)
    assert seen == [[], [], [3], [3, NO_BOUND_US], [3, NO_BOUND_US, 3]]
    assert descriptors_of(os.getpid(), str(device)) == 0  # the end of the task withdrew the request
    assert not latency.held


def test_a_bound_out_of_range_is_refused() -> None:
    with pytest.raises(BadInput):
        CpuLatency(MAX_BOUND_US + 1, device="/nonexistent")
    assert not CpuLatency(0, device="/nonexistent").held  # no device: nothing held, nothing raised
