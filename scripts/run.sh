#!/usr/bin/env bash
# run.sh — set up, then mount memfs (default store: $XDG_DATA_HOME/memfs/sessions) at
# $MOUNTPOINT (default ~/memfs) in the foreground. Ctrl-C unmounts. Extra args go to `memfs mount`.
#   e.g.  scripts/run.sh --read-only      MOUNTPOINT=/tmp/m scripts/run.sh --session abc
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/setup.sh"
mnt="${MOUNTPOINT:-$HOME/memfs}"
mkdir -p "$mnt"
echo "run: mounting memfs at $mnt (Ctrl-C to unmount)"
exec "$root/.venv/bin/memfs" mount "$mnt" "$@"
