#!/usr/bin/env bash
# test.sh — set up the machine/venv (scripts/setup.sh), then run pytest; arguments go to pytest.
# Then the store and filesystem tests again against the declared minimum versions of the
# dependencies (scripts/test_min.sh; MEMFS_SKIP_MIN=1 skips it, e.g. while iterating).
# Exits non-zero when a run fails; "no tests collected" (pytest's 5) is a failure (1).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/setup.sh
rc=0
.venv/bin/python -m pytest "$@" || rc=$?
if ((rc == 5)); then
  echo "test.sh: no tests were collected" >&2
  exit 1
fi
((rc == 0)) || exit "$rc"
if [[ "${MEMFS_SKIP_MIN:-}" != 1 ]]; then
  echo "test.sh: the store and filesystem tests against the declared minimum versions"
  bash scripts/test_min.sh -q
fi
