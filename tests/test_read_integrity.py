"""Reads verify the artifact every time (DESIGN.md §5, invariant 4).

A tampered, truncated, missing or swapped artifact returns exit code 4 and
an audit row, never the bytes. Artifacts are opened beneath the store's
directory with openat2, so a planted symlink, hard link, FIFO, device or
directory at an artifact's name is refused, as is a store directory that
was replaced by a symlink.
"""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ALICE_FACT, Result, Scenario, artifact_path, table_dump

NOTE = "notes/allergy.md"


def _read(scenario: Scenario) -> Result:
    return scenario.cli("read", scenario.alice_session, f"private/{NOTE}", timeout=20)


def _integrity_audit_rows(scenario: Scenario) -> list[tuple[Any, ...]]:
    rows = table_dump(scenario.cli.home / "state.sqlite")["audit"]
    return [r for r in rows if r[4] == scenario.alice_session and r[10] == "error" and r[11] == "revision-stale"]


def _expect_integrity_failure(scenario: Scenario) -> None:
    before = len(_integrity_audit_rows(scenario))
    result = _read(scenario)
    assert result.code == 4, (result.code, result.err)
    assert result.out == b""
    assert b"hazelnut" not in result.out and "hazelnut" not in result.err
    assert len(_integrity_audit_rows(scenario)) == before + 1


def _artifact(scenario: Scenario) -> Path:
    return artifact_path(scenario.cli.home, scenario.alice, NOTE)


def test_clean_read_then_tamper_then_restore(scenario: Scenario) -> None:
    """Verification is per read: no cached verdict survives a change."""
    assert _read(scenario).out == ALICE_FACT
    artifact = _artifact(scenario)
    tampered = bytearray(ALICE_FACT)
    tampered[0] ^= 0x20  # same size, one bit different
    artifact.write_bytes(bytes(tampered))
    _expect_integrity_failure(scenario)
    artifact.write_bytes(ALICE_FACT)
    assert _read(scenario).out == ALICE_FACT


@pytest.mark.parametrize("content", [b"", ALICE_FACT[:-1], ALICE_FACT + b"appended secret\n"])
def test_size_changes_are_refused(scenario: Scenario, content: bytes) -> None:
    _artifact(scenario).write_bytes(content)
    _expect_integrity_failure(scenario)


def test_missing_artifact(scenario: Scenario) -> None:
    _artifact(scenario).unlink()
    _expect_integrity_failure(scenario)


def test_symlink_to_identical_bytes_is_refused(scenario: Scenario, tmp_path: Path) -> None:
    """Even a symlink to the right bytes is refused: no symlink is followed."""
    artifact = _artifact(scenario)
    outside = tmp_path / "outside.md"
    outside.write_bytes(ALICE_FACT)
    artifact.unlink()
    artifact.symlink_to(outside)
    _expect_integrity_failure(scenario)


def test_relative_symlink_inside_the_store_is_refused(scenario: Scenario) -> None:
    artifact = _artifact(scenario)
    twin = artifact.with_name("twin")
    shutil.copyfile(artifact, twin)
    artifact.unlink()
    artifact.symlink_to("twin")
    _expect_integrity_failure(scenario)


def test_hard_link_is_refused(scenario: Scenario) -> None:
    """A second name for the artifact means someone else can change it."""
    artifact = _artifact(scenario)
    os.link(artifact, artifact.with_name("second-name"))
    _expect_integrity_failure(scenario)


def test_fifo_is_refused_without_blocking(scenario: Scenario) -> None:
    artifact = _artifact(scenario)
    artifact.unlink()
    os.mkfifo(artifact, 0o600)
    _expect_integrity_failure(scenario)  # the 20 s timeout would fire if open blocked


def test_directory_is_refused(scenario: Scenario) -> None:
    artifact = _artifact(scenario)
    artifact.unlink()
    artifact.mkdir()
    _expect_integrity_failure(scenario)


def test_device_node_is_refused(scenario: Scenario) -> None:
    artifact = _artifact(scenario)
    artifact.unlink()
    os.mknod(artifact, 0o600 | stat.S_IFCHR, os.makedev(1, 3))  # /dev/null
    _expect_integrity_failure(scenario)


def test_store_directory_swapped_for_a_symlink_is_refused(scenario: Scenario, tmp_path: Path) -> None:
    store_dir = _artifact(scenario).parent
    copy = tmp_path / "copied-store"
    shutil.copytree(store_dir, copy)
    shutil.rmtree(store_dir)
    store_dir.symlink_to(copy)
    _expect_integrity_failure(scenario)


def test_artifact_area_swapped_for_a_symlink_is_refused(scenario: Scenario, tmp_path: Path) -> None:
    """Even the memory-scopes/v1 level is opened without following links."""
    v1 = _artifact(scenario).parent.parent
    copy = tmp_path / "v1"
    shutil.copytree(v1, copy)
    shutil.rmtree(v1)
    v1.symlink_to(copy)
    _expect_integrity_failure(scenario)


def test_locators_are_broker_generated(scenario: Scenario) -> None:
    """The caller's path never becomes a file name in the artifact area."""
    cli = scenario.cli
    cli.j("write", scenario.alice_session, "private/evil-name-canary.md", stdin=b"x\n")
    names = [p.name for p in (cli.home / "agents").rglob("*")]
    assert not any("canary" in n or n.endswith(".md") for n in names)
    artifact = artifact_path(cli.home, scenario.alice, "evil-name-canary.md")
    assert len(artifact.name) == 26 and artifact.name.isalnum()
    assert stat.S_IMODE(artifact.stat().st_mode) == 0o600
    assert stat.S_IMODE(artifact.parent.stat().st_mode) == 0o700
