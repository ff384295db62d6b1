"""Shared fixtures: a real home on disk, the real CLI, the seed's scenario.

Nothing here mocks the catalog, the writer or the filesystem: tests run the
installed ``scopefs`` command (or the same library functions it calls) on
real SQLite files in a temporary directory.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

SCOPEFS = str(Path(sys.executable).with_name("scopefs"))


@dataclass
class Result:
    code: int
    out: bytes
    err: str

    @property
    def text(self) -> str:
        return self.out.decode("utf-8", errors="replace")

    def json(self) -> dict:
        return json.loads(self.out)


@dataclass
class Cli:
    """Runs the installed ``scopefs`` against one home."""

    home: Path
    env: dict[str, str] = field(default_factory=dict)

    def __call__(self, *args: str, stdin: bytes | None = None, check: bool = False,
                 timeout: float = 60) -> Result:
        env = {**os.environ, "SCOPEFS_HOME": str(self.home), **self.env}
        proc = subprocess.run([SCOPEFS, *args], input=stdin if stdin is not None else b"", capture_output=True,
                              env=env, timeout=timeout)
        result = Result(proc.returncode, proc.stdout, proc.stderr.decode("utf-8", errors="replace"))
        if check and result.code != 0:
            raise AssertionError(f"scopefs {' '.join(args)} exited {result.code}: {result.err}")
        return result

    def j(self, *args: str, stdin: bytes | None = None) -> dict:
        """Run with --json, require success, return the object."""
        result = self("--json", *args, stdin=stdin, check=True)
        return result.json()


@pytest.fixture
def cli(tmp_path: Path) -> Cli:
    home = tmp_path / "home"
    runner = Cli(home)
    runner("init", check=True)
    return runner


# Raw provider identifiers and labels used by the scenario. Tests search the
# whole home for these bytes, so they are distinctive on purpose.
ALICE_SENDER = "tg-sender-alice-8410023317"
BOB_SENDER = "tg-sender-bob-5529100442"
MIKE1_SENDER = "tg-sender-mike-1111907733"
MIKE2_SENDER = "tg-sender-mike-2222801166"
ACCOUNT = "tg-bot-account-77810"
CHANNEL = "telegram"
GROUP_CONVERSATION = "tg-chat-group-9917700123"
ALICE_FACT = b"Alice's private fact: allergic to hazelnuts (canary A1c3)\n"
BOB_FACT = b"Bob's private fact: allergic to peanuts (canary B0b7)\n"
CHANNEL_FACT = b"Channel fact: the team offsite is in Lisbon (canary C4an)\n"


@dataclass
class Scenario:
    cli: Cli
    agent: str
    alice: str
    bob: str
    mike1: str
    mike2: str
    conversation: str
    alice_binding: str
    bob_binding: str
    alice_session: str
    bob_session: str
    group_session: str


def build_scenario(cli: Cli, agent: str = "main") -> Scenario:
    """The seed's end-to-end proof, up to the first reads, via the CLI."""
    cli.j("agent", "add", agent)
    alice = cli.j("principal", "add", "Alice", "--kind", "human")["principal_id"]
    bob = cli.j("principal", "add", "Bob", "--kind", "human")["principal_id"]
    mike1 = cli.j("principal", "add", "Mike", "--kind", "human")["principal_id"]
    mike2 = cli.j("principal", "add", "Mike", "--kind", "human")["principal_id"]
    alice_binding = cli.j("bind", alice, "--channel", CHANNEL, "--account", ACCOUNT, "--sender", ALICE_SENDER)["binding_id"]
    bob_binding = cli.j("bind", bob, "--channel", CHANNEL, "--account", ACCOUNT, "--sender", BOB_SENDER)["binding_id"]
    cli.j("bind", mike1, "--channel", CHANNEL, "--account", ACCOUNT, "--sender", MIKE1_SENDER)
    cli.j("bind", mike2, "--channel", CHANNEL, "--account", ACCOUNT, "--sender", MIKE2_SENDER)
    conversation = cli.j("conversation", "add", "--agent", agent, "--channel", CHANNEL, "--account", ACCOUNT,
                         "--conversation", GROUP_CONVERSATION)["conversation_id"]
    for member in (alice, bob):
        cli.j("member", "add", conversation, member, "--expires", "7d")

    def dm(sender: str) -> str:
        return cli.j("session", "open", "--agent", agent, "--dm", "--channel", CHANNEL, "--account", ACCOUNT,
                     "--sender", sender)["session_id"]

    alice_session, bob_session = dm(ALICE_SENDER), dm(BOB_SENDER)
    group_session = cli.j("session", "open", "--agent", agent, "--group", "--conversation", conversation)["session_id"]
    cli.j("write", alice_session, "private/notes/allergy.md", stdin=ALICE_FACT)
    cli.j("write", bob_session, "private/notes/allergy.md", stdin=BOB_FACT)
    cli.j("write", group_session, "channel/offsite.md", stdin=CHANNEL_FACT)
    return Scenario(cli, agent, alice, bob, mike1, mike2, conversation, alice_binding, bob_binding,
                    alice_session, bob_session, group_session)


@pytest.fixture
def scenario(cli: Cli) -> Scenario:
    return build_scenario(cli)
