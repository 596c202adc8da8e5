#!/usr/bin/env bash
# test.sh — set up the machine/venv (scripts/setup.sh), run the static checks (ruff, mypy: their
# settings are in pyproject.toml), then pytest; arguments go to pytest.
# Then, unless the arguments name test files, the store and filesystem tests run again against
# the declared minimum versions of the dependencies (scripts/test_min.sh; MEMFS_SKIP_MIN=1
# skips it, e.g. while iterating). memfs is pure Python: there is no second implementation to
# run the suite against (docs/design.md says why the compiled modules went).
# Exits 0 only when every run passed; "no tests collected" (pytest's 5) is a failure.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/setup.sh

failed=0
run() {  # run NAME PYTEST-ARGS...
  local name=$1 rc=0
  shift
  .venv/bin/python -m pytest "$@" || rc=$?
  if ((rc == 5)); then
    echo "test.sh: $name: no tests were collected" >&2
  fi
  if ((rc != 0)); then
    echo "test.sh: $name failed (pytest exit $rc)" >&2
    failed=1
  fi
}

check() {  # check NAME COMMAND...: a static check; its failure fails the run (the tests still run)
  local name=$1
  shift
  if ! "$@"; then
    echo "test.sh: $name failed: see above (\`$*\`)" >&2
    failed=1
  fi
}

check "ruff" .venv/bin/ruff check --no-cache memfs tests scripts
check "mypy" .venv/bin/mypy memfs
run "test suite" "$@"

paths=0
for arg in "$@"; do [[ $arg != -* && -e $arg ]] && paths=1; done
if ((!paths)) && [[ "${MEMFS_SKIP_MIN:-}" != 1 ]]; then
  echo "test.sh: the store and filesystem tests against the declared minimum versions"
  bash scripts/test_min.sh -q || failed=1
fi
exit "$failed"
