#!/usr/bin/env bash
# test_min.sh — run the store, filesystem, search and usage tests against the *declared minimum*
# versions of memfs's dependencies (pyproject.toml's ">=" floors, installed exactly), in a second
# virtualenv, .venv-min. A floor that the suite does not pass on is a bug in pyproject.toml.
# Re-runs are fast: the venv is rebuilt only when pyproject.toml changed. Arguments go to pytest.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PY="${PYTHON:-python3}"
pins=$("$PY" - <<'PY'
import re, tomllib
project = tomllib.load(open("pyproject.toml", "rb"))["project"]
deps = project["dependencies"] + project["optional-dependencies"]["test"]
for dep in deps:
    m = re.fullmatch(r"([A-Za-z0-9_.-]+)>=([0-9][^,;\s]*)(,<[0-9][^,;\s]*)?", dep.strip())
    if not m:
        raise SystemExit(f"test_min.sh: cannot pin {dep!r}: declare a plain '>=' floor (and at most a '<' bound)")
    print(f"{m[1]}=={m[2]}")
PY
)
stamp=$(echo "$pins" | sha256sum | cut -d' ' -f1)
if [[ "$(cat .venv-min/.stamp 2>/dev/null)" != "$stamp" ]] || ! .venv-min/bin/python -c '' 2>/dev/null; then
  echo "test_min: creating .venv-min with the declared minimums:" $pins
  rm -rf .venv-min
  "$PY" -m venv .venv-min
  .venv-min/bin/python -m pip install -q --upgrade pip
  # shellcheck disable=SC2086
  .venv-min/bin/python -m pip install -q $pins
  .venv-min/bin/python -m pip install -q --no-deps -e .
  echo "$stamp" > .venv-min/.stamp
fi
rc=0
.venv-min/bin/python -m pytest -p no:cacheprovider "$@" tests/test_store*.py tests/test_fs*.py tests/test_search_mount.py tests/test_search_options.py tests/test_usage.py \
  || rc=$?
if ((rc == 5)); then
  echo "test_min.sh: no tests were collected" >&2
  exit 1
fi
exit "$rc"
