#!/usr/bin/env bash
# The end-to-end demonstration: Alice, Bob and a group share one agent, and
# each session sees only what it may, through the command line and through a
# real FUSE mount of each session's view (ls -R, cat, grep -r, sed -i).
# Every expectation is checked, so the demo fails loudly if isolation does
# not hold.
set -euo pipefail
cd "$(dirname "$0")/.."
SCOPEFS="$PWD/.venv/bin/scopefs"
export SCOPEFS_HOME="$(mktemp -d /tmp/scopefs-demo.XXXXXX)/home"
MNT="$(dirname "$SCOPEFS_HOME")/mnt"
cleanup() {
  for m in "$MNT"/*; do
    mountpoint -q "$m" 2>/dev/null && { "$SCOPEFS" umount "$m" >/dev/null 2>&1 || fusermount3 -uz "$m"; }
  done
  rm -rf "$(dirname "$SCOPEFS_HOME")"
}
trap cleanup EXIT

bold() { printf '\n\033[1m%s\033[0m\n' "$*"; }
run() { printf '$ scopefs %s\n' "$*"; "$SCOPEFS" "$@"; }
expect_refused() {  # expect_refused CODE ARGS...: the command must fail with CODE
  local want=$1; shift
  printf '$ scopefs %s\n' "$*"
  set +e; "$SCOPEFS" "$@" </dev/null; local got=$?; set -e
  if [ "$got" != "$want" ]; then echo "DEMO FAILED: expected exit $want, got $got" >&2; exit 1; fi
  echo "  -> refused (exit $got), as it must be"
}
id_of() { "$SCOPEFS" --json "$@" | python3 -c 'import json,sys; d=json.load(sys.stdin); print(next(v for k,v in d.items() if k.endswith("_id")))'; }

bold "1. A fresh home and one agent"
run init
run agent add main

bold "2. Two people with verified DMs, and two different people both named Mike"
ALICE=$(id_of principal add Alice --kind human)
BOB=$(id_of principal add Bob --kind human)
MIKE1=$(id_of principal add Mike --kind human)
MIKE2=$(id_of principal add Mike --kind human)
echo "Alice=$ALICE Bob=$BOB Mike=$MIKE1 Mike=$MIKE2 (same label, two principals)"
ALICE_BINDING=$(id_of bind "$ALICE" --channel telegram --account demo-bot --sender 100001)
run bind "$BOB" --channel telegram --account demo-bot --sender 100002 >/dev/null
ALICE_DM=$(id_of session open --agent main --dm --channel telegram --account demo-bot --sender 100001)
BOB_DM=$(id_of session open --agent main --dm --channel telegram --account demo-bot --sender 100002)
echo "Alice's DM session: $ALICE_DM"
echo "Bob's DM session:   $BOB_DM"

bold "3. One group with both of them"
GROUP=$(id_of conversation add --agent main --channel telegram --account demo-bot --conversation -100777)
run member add "$GROUP" "$ALICE" --expires 7d >/dev/null
run member add "$GROUP" "$BOB" --expires 7d >/dev/null
GROUP_S=$(id_of session open --agent main --group --conversation "$GROUP")
echo "Group session: $GROUP_S"

bold "4. Each remembers something: same noun, different people"
echo "prefers tea, never coffee" | run write "$ALICE_DM" private/profile/drinks.md
echo "prefers coffee, black" | run write "$BOB_DM" private/profile/drinks.md
echo "the team drinks list: water and juice" | run write "$GROUP_S" channel/drinks.md

bold "5. What each session sees"
for who in ALICE_DM BOB_DM GROUP_S; do
  echo "--- $who: roots"
  "$SCOPEFS" ls "${!who}"
done
run read "$ALICE_DM" private/profile/drinks.md
run read "$BOB_DM" private/profile/drinks.md
run read "$GROUP_S" channel/drinks.md

bold "5b. Each view as a filesystem: mount Alice's DM, Bob's DM and the group"
mkdir -p "$MNT/alice" "$MNT/bob" "$MNT/group"
run mount "$ALICE_DM" "$MNT/alice"
run mount "$BOB_DM" "$MNT/bob"
run mount "$GROUP_S" "$MNT/group"
for who in alice bob group; do
  echo "--- $who: ls -R"; (cd "$MNT/$who" && ls -R)
done
echo "--- cat"
cat "$MNT/alice/private/profile/drinks.md" "$MNT/bob/private/profile/drinks.md" "$MNT/group/channel/drinks.md"
must_see() {  # must_see WHO PATTERN WANT_LINES: grep -r inside one mount
  local got; got=$(cd "$MNT/$1" && grep -r "$2" . || true)
  echo "--- $1: grep -r '$2'"; [ -n "$got" ] && echo "$got"
  if [ "$(printf '%s' "$got" | grep -c .)" != "$3" ]; then echo "DEMO FAILED: $1 sees $2 the wrong number of times" >&2; exit 1; fi
}
must_see alice "prefers" 1
must_see bob "prefers" 1
must_see group "prefers" 0
must_see alice "black" 0
must_see group "water" 1
if [ -e "$MNT/group/private" ] || [ -e "$MNT/alice/channel" ]; then echo "DEMO FAILED: a root crossed views" >&2; exit 1; fi
echo "--- Alice edits her note with sed -i inside her mount: one new revision"
sed -i 's/tea/green tea/' "$MNT/alice/private/profile/drinks.md"
run read "$ALICE_DM" private/profile/drinks.md
echo "--- a read-only root refuses changes"
if touch "$MNT/alice/agent-shared/x.md" 2>/dev/null; then echo "DEMO FAILED: agent-shared was writable" >&2; exit 1; fi
echo "  -> touch agent-shared/x.md: refused (read-only file system)"

bold "5c. Each session in its own sandbox: the view at /memory is its whole world"
sandboxed() {  # sandboxed WHO SESSION: what a command inside that session's sandbox can reach
  echo "--- $1: scopefs run ... -- sh -c 'ls -R /memory; grep -r prefers /memory; ...'"
  "$SCOPEFS" run "$2" -- sh -c 'ls -R /memory; echo "grep -r prefers:"; grep -r prefers /memory || true;
    echo "state directory visible: $([ -e "'"$SCOPEFS_HOME"'" ] && echo yes || echo no)";
    echo "other processes: $(ls /proc | grep -c "^[0-9]") pids; uid $(id -u); network: $(cut -d: -f1 /proc/net/dev | tail -n +3 | tr -d " " | tr "\n" " ")"'
}
ALICE_BOX=$(sandboxed alice "$ALICE_DM"); echo "$ALICE_BOX"
BOB_BOX=$(sandboxed bob "$BOB_DM"); echo "$BOB_BOX"
GROUP_BOX=$(sandboxed group "$GROUP_S"); echo "$GROUP_BOX"
case "$ALICE_BOX$GROUP_BOX" in *black*) echo "DEMO FAILED: Bob's note reached another sandbox" >&2; exit 1;; esac
case "$BOB_BOX$GROUP_BOX" in *"green tea"*|*"prefers tea"*) echo "DEMO FAILED: Alice's note reached another sandbox" >&2; exit 1;; esac
case "$ALICE_BOX$BOB_BOX$GROUP_BOX" in *"visible: yes"*) echo "DEMO FAILED: a sandbox saw the state directory" >&2; exit 1;; esac
echo "--- inside Alice's sandbox, sed -i saves one new revision"
"$SCOPEFS" run "$ALICE_DM" -- sed -i 's/green tea/jasmine tea/' private/profile/drinks.md
run read "$ALICE_DM" private/profile/drinks.md

bold "5d. Search by words and meaning ranks only what each view may read"
ALICE_FOUND=$(run search "$ALICE_DM" "coffee drinks"); echo "$ALICE_FOUND"
BOB_FOUND=$(run search "$BOB_DM" "coffee drinks"); echo "$BOB_FOUND"
GROUP_FOUND=$(run search "$GROUP_S" "coffee drinks"); echo "$GROUP_FOUND"
case "$ALICE_FOUND$GROUP_FOUND" in *black*) echo "DEMO FAILED: a search reached Bob's note" >&2; exit 1;; esac
case "$BOB_FOUND$GROUP_FOUND" in *"jasmine"*) echo "DEMO FAILED: a search reached Alice's note" >&2; exit 1;; esac
case "$ALICE_FOUND" in *"private/profile/drinks.md#L1-L1"*) ;; *) echo "DEMO FAILED: Alice cannot find her own note" >&2; exit 1;; esac

echo "--- inside Alice's sandbox: cat '/memory/.search/coffee drinks' (a read-only query folder)"
ALICE_CAT=$("$SCOPEFS" run "$ALICE_DM" -- cat "/memory/.search/coffee drinks"); echo "$ALICE_CAT"
case "$ALICE_CAT" in *black*) echo "DEMO FAILED: a sandbox search reached Bob's note" >&2; exit 1;; esac
case "$ALICE_CAT" in *"private/profile/drinks.md#L1-L1"*) ;; *) echo "DEMO FAILED: Alice's sandbox cannot search" >&2; exit 1;; esac

bold "6. Nothing crosses: the group cannot name a private root, Alice cannot read the channel"
expect_refused 3 read "$GROUP_S" private/profile/drinks.md
expect_refused 3 read "$ALICE_DM" channel/drinks.md
expect_refused 3 write "$ALICE_DM" agent-shared/note.md
expect_refused 2 read "$ALICE_DM" ../../state.sqlite

bold "7. An unverified DM and the shared main DM are ambiguous: no private root, no writes"
STRANGER=$(id_of session open --agent main --dm --channel telegram --account demo-bot --sender 999999)
"$SCOPEFS" ls "$STRANGER"
expect_refused 3 read "$STRANGER" private/profile/drinks.md
expect_refused 3 write "$STRANGER" agent-shared/x.md

bold "7b. Sharing on purpose: a reviewed projection for the group, a deposit for Alice"
run project "$ALICE_DM" private/profile/drinks.md --to "conversation:$GROUP" --purpose "so the group orders her tea" --expires 1d
PROJECTION=$(id_of project "$ALICE_DM" private/profile/drinks.md --to "conversation:$GROUP" --purpose "so the group orders her tea" --expires 1d --yes)
echo "projection: $PROJECTION"
for _ in $(seq 50); do [ -e "$MNT/group/projections/channel/profile/drinks.md" ] && break; sleep 0.1; done
echo "\$ cat $MNT/group/projections/channel/profile/drinks.md"; cat "$MNT/group/projections/channel/profile/drinks.md"
must_see group "jasmine" 1
must_see bob "jasmine" 0
expect_refused 3 read "$GROUP_S" private/profile/drinks.md
run projection revoke "$PROJECTION"
for _ in $(seq 50); do [ ! -e "$MNT/group/projections/channel/profile/drinks.md" ] && break; sleep 0.1; done
must_see group "jasmine" 0
echo "--- Alice turns her postbox on; the group files a note for her through a message handle"
run postbox enable "$ALICE" >/dev/null
HANDLE=$("$SCOPEFS" --json message add "$GROUP_S" --channel telegram --account demo-bot --sender 100001 | python3 -c 'import json,sys; print(json.load(sys.stdin)["message_handle"])')
"$SCOPEFS" run "$GROUP_S" -- sh -c "echo 'Alice asked for oat milk' > /tmp/n.md && cp /tmp/n.md /memory/postbox/$HANDLE.md && echo '  -> filed'; echo \"  group's postbox/ lists: [\$(ls /memory/postbox)]\""
expect_refused 3 deposit "$GROUP_S" "$HANDLE"
run postbox list "$ALICE_DM"
must_see alice "oat milk" 1
must_see bob "oat milk" 0
must_see group "oat milk" 0

bold "7c. Derived memory: a digest follows its source; a forgotten claim stays out"
echo "Alice keeps a note about her commute and a digest built from it"
echo "Alice cycles to the office along the canal every morning" | run write "$ALICE_DM" private/profile/commute.md
echo "Digest: Alice bikes to work, so morning meetings start at 9:30" | run derive "$ALICE_DM" --from private/profile/commute.md --to private/digests/mornings.md --kind digest
echo "--- the group cannot pull the private digest into its channel by naming it"
printf '$ scopefs derive %s --from %s:private/profile/commute.md --to channel/leak.md\n' "$GROUP_S" "$ALICE_DM"
set +e; echo "A group digest of Alice's commute" | "$SCOPEFS" derive "$GROUP_S" --from "$ALICE_DM:private/profile/commute.md" --to channel/leak.md; got=$?; set -e
if [ "$got" != 3 ]; then echo "DEMO FAILED: a private note widened into the channel (exit $got)" >&2; exit 1; fi
echo "  -> refused (exit 3 mixed-audience), as it must be"
for _ in $(seq 50); do [ -e "$MNT/alice/private/digests/mornings.md" ] && break; sleep 0.1; done
must_see alice "meetings start at 9:30" 1
echo "--- Alice forgets the commute note: a preview first, the same report applied"
run forget "$ALICE_DM" private/profile/commute.md --dry-run
run forget "$ALICE_DM" private/profile/commute.md
for _ in $(seq 50); do [ ! -e "$MNT/alice/private/digests/mornings.md" ] && break; sleep 0.1; done
must_see alice "canal" 0
must_see alice "meetings start at 9:30" 0
echo "--- the same claim, written again through the group, is refused"
echo "alice cycles to the office along the canal every morning" > /tmp/scopefs-demo-claim.md
printf '$ scopefs write %s channel/commute.md < claim\n' "$GROUP_S"
set +e; "$SCOPEFS" write "$GROUP_S" channel/commute.md < /tmp/scopefs-demo-claim.md; got=$?; set -e
rm -f /tmp/scopefs-demo-claim.md
if [ "$got" != 3 ]; then echo "DEMO FAILED: a forgotten claim came back (exit $got)" >&2; exit 1; fi
echo "  -> refused (exit 3 forgotten), as it must be"

bold "8. Bob leaves the group, then Alice's binding is revoked"
run member remove "$GROUP" "$BOB"
expect_refused 3 write "$GROUP_S" channel/from-bob.md --actor "$BOB"
run binding revoke "$ALICE_BINDING"
expect_refused 3 read "$ALICE_DM" private/profile/drinks.md
run read "$BOB_DM" private/profile/drinks.md
echo "--- Alice's mounted view empties at once; Bob's is untouched"
for _ in $(seq 50); do [ -z "$(ls "$MNT/alice")" ] && break; sleep 0.1; done
echo "\$ ls $MNT/alice"; ls "$MNT/alice"
if [ -n "$(ls "$MNT/alice")" ]; then echo "DEMO FAILED: a revoked view still lists notes" >&2; exit 1; fi
echo "--- bob: ls -R"; (cd "$MNT/bob" && ls -R)
for who in alice bob group; do run umount "$MNT/$who"; done

bold "9. Integrity: the artifact area agrees with the catalog"
run doctor

bold "10. The audit records decisions, never content; no raw id is on disk"
python3 - "$SCOPEFS_HOME" <<'PY'
import collections, pathlib, sqlite3, sys
home = pathlib.Path(sys.argv[1])
rows = sqlite3.connect(home / "state.sqlite").execute("SELECT operation, decision, reason FROM audit").fetchall()
for (op, decision, reason), n in sorted(collections.Counter(rows).items()):
    print(f"  {n:3d} x {op:8s} {decision:5s} {reason}")
raw_ids = [b"100001", b"100002", b"-100777", b"demo-bot"]
content = [b"prefers tea", b"prefers coffee", b"drinks list"]
meta = [p for p in home.rglob("*") if p.is_file() and "memory-scopes" not in p.parts]
leaks = [(n, str(p.relative_to(home))) for p in meta for n in raw_ids if n in p.read_bytes()]
# Content may sit only in the search index, which lives in catalog.sqlite inside the broker
# boundary (README "Searching memory"); every other file and every other catalog table must hold none.
leaks += [(n, str(p.relative_to(home))) for p in meta if not p.name.startswith("catalog.sqlite")
          for n in content if n in p.read_bytes()]
for catalog in home.glob("agents/*/catalog.sqlite"):
    db = sqlite3.connect(catalog)
    tables = [t for (t,) in db.execute("SELECT name FROM sqlite_schema WHERE type = 'table'"
                                       " AND name NOT LIKE 'search_%' AND name NOT LIKE 'sqlite_%'")]
    dump = repr([db.execute(f'SELECT * FROM "{t}"').fetchall() for t in tables]).encode()
    leaks += [(n, f"{catalog.relative_to(home)} (outside the search index)") for n in content if n in dump]
if leaks:
    sys.exit(f"DEMO FAILED: raw ids or content in metadata: {leaks}")
print("  no raw sender, account or conversation id, and no note content outside the artifact area and the search index")
PY

bold "Demo passed: each session saw only its own view."
