#!/usr/bin/env bash
# test.sh — set up the machine/venv (scripts/setup.sh), then run pytest; arguments go to pytest.
# Then, unless the arguments name test files, the store tests run again against the Python
# twin of the commit (pytest --impl=py; memfs/store/writer.py): the two must behave alike; and
# the store and filesystem tests against the declared minimum versions of the dependencies
# (scripts/test_min.sh; MEMFS_SKIP_MIN=1 skips it, e.g. while iterating).
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

run "test suite" "$@"

paths=0
for arg in "$@"; do [[ $arg != -* && -e $arg ]] && paths=1; done
if ((paths)); then
  echo "test.sh: test paths given: the --impl=py run of the store tests is skipped" >&2
else
  store_tests=(tests/test_store*.py tests/test_reliability_crash.py tests/test_reliability_enospc.py
               tests/test_fsck.py tests/test_cli.py::test_append_from_a_file
               tests/test_cli.py::test_append_stops_at_the_first_bad_line
               tests/test_cli.py::test_append_json_output_and_a_last_line_without_newline
               tests/test_cli.py::test_append_to_a_session_held_by_another_process_fails)
  run "store tests with --impl=py" "$@" --impl=py "${store_tests[@]}"
fi
if ((!paths)) && [[ "${MEMFS_SKIP_MIN:-}" != 1 ]]; then
  echo "test.sh: the store and filesystem tests against the declared minimum versions"
  bash scripts/test_min.sh -q || failed=1
fi
exit "$failed"
