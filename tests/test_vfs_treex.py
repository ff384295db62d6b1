"""Trees of notes changed as tools change them, through mounts: what every view and the catalog end with.

``tests/treex.py`` does to a folder what tools do (create, overwrite,
append, write in the middle, save through a scratch name renamed over the
note, rename, remove, folders made and removed), checks every step against
a model, and hands the model over every 25 operations: then another
session's mount must show exactly those notes with those bytes, and the
catalog must hold them as the live notes of the folder, within the bound
of issue 14's point 3 (a removal becomes a tombstone after its grace).

Two sessions writing the same folder at once cannot be checked against a
model (the later writer wins), so what is checked is that they converge:
once both stop, both mounts and the catalog show the same notes, byte for
byte.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from tests.conftest import Scenario
from tests.mountkit import Mounts, live_notes, mounts, second_group_session, wait_until  # noqa: F401
from tests.treex import Model, TreeExerciser, interleaved_writes, tree_of


def _in_catalog(scenario: Scenario, folder: str) -> dict[str, str | None]:
    """The live notes of the group's store under ``folder``, by path below it: their active revision's hash."""
    prefix = folder + "/"
    return {path[len(prefix):]: note.active_sha256
            for path, note in live_notes(scenario.cli.home, scenario.conversation).items() if path.startswith(prefix)}


def _hashes(files: dict[str, bytes]) -> dict[str, str | None]:
    return {path: hashlib.sha256(data).hexdigest() for path, data in files.items()}


@pytest.mark.slow
@pytest.mark.parametrize("seed", [1, 2])
def test_one_writer_s_tree_is_what_another_session_and_the_catalog_show(
        scenario: Scenario, mounts: Mounts, seed: int) -> None:
    writer = mounts.mount(scenario.group_session) / "channel" / "tree"
    reader = mounts.mount(second_group_session(scenario)) / "channel" / "tree"
    checkpoints = 0

    def others_see(model: Model) -> None:
        nonlocal checkpoints
        checkpoints += 1
        wait_until(lambda: tree_of(reader) == model.files)
        wait_until(lambda: _in_catalog(scenario, "tree") == _hashes(model.files))

    done = TreeExerciser(writer, seed=seed, checkpoint_every=25, checkpoint=others_see).run(300)
    assert checkpoints == 300 // 25 + 1
    assert {"create", "overwrite", "append", "write_middle", "save_by_rename", "rename", "unlink"} <= done.keys()


@pytest.mark.slow
@pytest.mark.parametrize("seed", [1, 2])
def test_two_sessions_writing_one_folder_at_once_converge(scenario: Scenario, mounts: Mounts, seed: int) -> None:
    roots = [mounts.mount(scenario.group_session) / "channel" / "tree",
             mounts.mount(second_group_session(scenario)) / "channel" / "tree"]
    roots[0].mkdir()
    (roots[0] / "started.md").write_bytes(b"both writers see this folder\n")
    wait_until(lambda: (roots[1] / "started.md").exists())

    outcomes = interleaved_writes(roots, seed=seed, operations=400)
    changed = sum(count for what, count in outcomes.items()
                  if what.endswith(" ok") and not what.startswith(("read", "pause")))
    assert changed > 100  # most changes went through: the writers did not just refuse each other

    def converged() -> bool:
        first, second = tree_of(roots[0]), tree_of(roots[1])
        return first is not None and first == second and _in_catalog(scenario, "tree") == _hashes(first)

    wait_until(converged)


def test_the_tree_exerciser_finds_a_note_changed_behind_its_back(tmp_path: Path) -> None:
    root = tmp_path / "tree"

    def meddle(model: Model) -> None:
        if model.files:
            path = sorted(model.files)[0]
            (root / path).write_bytes(model.files[path] + b"meddled\n")

    with pytest.raises(AssertionError, match=r"holds other bytes than were written"):
        TreeExerciser(root, seed=1, checkpoint_every=10, checkpoint=meddle).run(100)


@pytest.mark.slow
def test_the_tree_exerciser_inside_scopefs_run_leaves_its_tree_in_the_catalog(scenario: Scenario) -> None:
    """The sandbox's own python3 runs the exerciser on ``/memory`` (each step checked inside); once the run
    and its mount end, the catalog holds exactly the tree it reported."""
    exerciser = Path(__file__).with_name("treex.py").read_bytes()
    result = scenario.cli("run", scenario.group_session, "--", "python3", "-", "channel/tree", "-N", "300",
                          "-S", "5", stdin=exerciser, timeout=240)
    assert result.code == 0, f"the tree exerciser failed in the sandbox: {result.err}"
    reported = json.loads(result.out)
    assert reported["by_operation"].get("touch", 0) > 0 and reported["by_operation"].get("save_by_rename", 0) > 0
    assert _in_catalog(scenario, "tree") == reported["files"]
