#!/usr/bin/env bash
# setup.sh — idempotent set-up of a Debian machine for memfs:
#   1. FUSE userland + build deps via apt (fuse3, libfuse3-dev, pkg-config, bubblewrap, and attr
#      for getfattr), only if something is missing;
#   2. a virtualenv at .venv (system python3 >= 3.11, or $PYTHON) with `pip install -e '.[test,cluster,lint,mcp]'`
#      (pyfuse3 is built from source against the libfuse3 headers; memfs itself is pure Python,
#      docs/design.md says why);
#   3. memfs byte-compiled (compileall), as a user's pip install leaves it.
# Re-runs are fast: pip runs only when pyproject.toml changed since the last successful install.
# Usage: scripts/setup.sh [--bench]     (--bench also installs the '.[bench]' extras)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

extras=(test cluster lint mcp)  # cluster: nats-py + nats-server for the cluster tests (SPEC §9); lint: ruff, mypy; mcp: memfs mcp
for arg in "$@"; do
  case "$arg" in
    --bench) extras+=(bench) ;;
    *) echo "usage: scripts/setup.sh [--bench]" >&2; exit 2 ;;
  esac
done
say() { echo "setup: $*"; }

# --- 1. system packages ----------------------------------------------------
PY="${PYTHON:-python3}"
missing=()
command -v fusermount3 >/dev/null || missing+=(fuse3)
command -v pkg-config >/dev/null || missing+=(pkg-config)
pkg-config --exists fuse3 2>/dev/null || missing+=(libfuse3-dev)
command -v bwrap >/dev/null || missing+=(bubblewrap)
command -v jq >/dev/null || missing+=(jq)                          # the tests use jq as a user would
command -v rsync >/dev/null || missing+=(rsync)                    # the tests check a second rsync -a copies nothing
command -v getfattr >/dev/null || missing+=(attr)                  # getfattr: user.memfs.* (a refusal's reason)
command -v cc >/dev/null || missing+=(gcc libc6-dev)              # to compile pyfuse3
if [[ "$(command -v "$PY" || true)" == /usr/bin/* ]]; then        # Debian's own python
  "$PY" -c 'import ensurepip' 2>/dev/null || missing+=(python3-venv)
  "$PY" -c 'import sysconfig, os, sys; sys.exit(not os.path.exists(sysconfig.get_paths()["include"] + "/Python.h"))' \
    || missing+=(python3-dev)
fi
if ((${#missing[@]})); then
  sudo=(); [[ $(id -u) == 0 ]] || sudo=(sudo)
  say "installing system packages (missing: ${missing[*]})"
  "${sudo[@]}" apt-get update -qq
  "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive \
    apt-get install -y -qq fuse3 libfuse3-dev pkg-config bubblewrap "${missing[@]}" >/dev/null
fi
say "system packages ok (fuse3 $(pkg-config --modversion fuse3))"

# --- 2. virtualenv ---------------------------------------------------------
if ! .venv/bin/python -c '' 2>/dev/null; then
  "$PY" -c 'import sys; sys.exit(sys.version_info < (3, 11))' \
    || { echo "setup: $PY is $("$PY" -V 2>&1); memfs needs Python >= 3.11 (set PYTHON=...)" >&2; exit 1; }
  say "creating .venv with $("$PY" -V 2>&1)"
  rm -rf .venv
  "$PY" -m venv .venv
  .venv/bin/python -m pip install -q --upgrade pip
fi

# --- 3. Python packages (skipped when the stamp matches the build inputs) --
hash=$(sha256sum pyproject.toml | cut -d' ' -f1)
todo=()
for e in "${extras[@]}"; do
  [[ "$(cat ".venv/.stamp-$e" 2>/dev/null)" == "$hash" ]] || todo+=("$e")
done
if ((${#todo[@]})); then
  spec=".[$(IFS=,; echo "${extras[*]}")]"
  say "pip install -e '$spec' (builds pyfuse3 the first time; may take a minute)"
  .venv/bin/python -m pip install -q -e "$spec"
  for e in "${extras[@]}"; do echo "$hash" > ".venv/.stamp-$e"; done
fi
.venv/bin/python -m compileall -q memfs >/dev/null  # memfs's bytecode, as pip writes it at a user's install
say "ready: $(.venv/bin/python -V), .venv extras: ${extras[*]}"
say "the command line is .venv/bin/memfs; to call it as memfs: export PATH=\"$PWD/.venv/bin:\$PATH\""
