#!/usr/bin/env bash
# Checks that the workspace's declared `rust-version` is the one its lock file really
# needs: the highest `rust-version` any locked dependency declares (every feature, dev-
# and build-dependencies included, as the tests build them). Only one toolchain can be
# installed here, so our own code's minimum is not checked by compiling with an older
# one; the dependencies set the floor.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo metadata --format-version 1 --locked --all-features | python3 -c '
import json, sys
meta = json.load(sys.stdin)
def version(v):
    parts = [int(x) for x in v.split(".")]
    return tuple(parts + [0] * (3 - len(parts)))
locked = {n["id"] for n in meta["resolve"]["nodes"]}
ours = {p["id"] for p in meta["packages"] if p["id"] in meta["workspace_members"]}
declared = {p["rust_version"] for p in meta["packages"] if p["id"] in ours}
if len(declared) != 1 or None in declared:
    sys.exit(f"rust-version: the workspace members declare {sorted(map(str, declared))}, not one version")
declared = declared.pop()
needs = max(
    ((p["rust_version"], p["name"], p["version"]) for p in meta["packages"]
     if p["id"] in locked and p["id"] not in ours and p.get("rust_version")),
    key=lambda t: version(t[0]),
)
if version(declared) != version(needs[0]):
    sys.exit(f"rust-version: declared {declared}, but the lock file needs {needs[0]} ({needs[1]} {needs[2]}): set workspace.package.rust-version to it")
print(f"rust-version: {declared}, as the lock file needs ({needs[1]} {needs[2]})")
'
