#!/usr/bin/env bash
# test.sh — set up the machine/venv (scripts/setup.sh), then run pytest; arguments go to pytest.
# Exits with pytest's status, except "no tests collected" (pytest's 5), which is a failure (1).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/setup.sh
rc=0
.venv/bin/python -m pytest "$@" || rc=$?
if ((rc == 5)); then
  echo "test.sh: no tests were collected" >&2
  exit 1
fi
exit "$rc"
