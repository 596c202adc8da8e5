#!/usr/bin/env bash
# install_agents.sh — install the pinned real agent CLIs (Claude Code, Codex, Gemini CLI, OpenCode) into
# the project-local prefix .agents/ (gitignored) with npm. The tests in tests/test_agents_cli.py
# and scripts/capture_fixtures.py run them offline against tests/agents/model_server.py.
# Idempotent: a stamp file (.agents/.stamp) holding the pinned list makes a re-run a no-op.
# Needs node >= 20 and npm. Prints where the binaries are.
# Usage: scripts/install_agents.sh [--force]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

# The versions the fixtures in tests/fixtures/agents/ were captured with (docs/agents.md).
PINS=(
  @anthropic-ai/claude-code@2.1.332
  @openai/codex@0.171.0
  @google/gemini-cli@0.61.0
  opencode-ai@1.18.33
)
PREFIX="$PWD/.agents"
BIN="$PREFIX/node_modules/.bin"
say() { echo "install_agents: $*"; }

force=0
for arg in "$@"; do
  case "$arg" in
    --force) force=1 ;;
    *) echo "usage: scripts/install_agents.sh [--force]" >&2; exit 2 ;;
  esac
done

command -v node >/dev/null && command -v npm >/dev/null \
  || { echo "install_agents: node and npm are needed (node >= 20)" >&2; exit 1; }
node -e 'process.exit(+process.versions.node.split(".")[0] < 20 ? 1 : 0)' \
  || { echo "install_agents: node $(node --version) is too old; node >= 20 is needed" >&2; exit 1; }

want="$(printf '%s\n' "${PINS[@]}") $(uname -sm)"
working() {  # every CLI answers --version with its pinned version
  "$BIN/claude" --version 2>/dev/null | grep -q '^2\.1\.332 ' &&
  "$BIN/codex" --version 2>/dev/null | grep -q ' 0\.171\.0$' &&
  "$BIN/gemini" --version 2>/dev/null | grep -q '^0\.61\.0$' &&
  "$BIN/opencode" --version 2>/dev/null | grep -q '^1\.18\.33$'
}

present() { [[ -x "$BIN/claude" && -x "$BIN/codex" && -x "$BIN/gemini" && -x "$BIN/opencode" ]]; }
if ((force)) || [[ "$(cat "$PREFIX/.stamp" 2>/dev/null)" != "$want" ]] || ! present; then
  say "npm install ${PINS[*]} into .agents/ (about 1 GB, a minute the first time)"
  mkdir -p "$PREFIX"
  rm -f "$PREFIX/.stamp"
  [[ -f "$PREFIX/package.json" ]] || echo '{"private": true}' > "$PREFIX/package.json"
  npm install --prefix "$PREFIX" --no-audit --no-fund --loglevel=error --save-exact "${PINS[@]}"
  # Claude Code's postinstall copies the platform's native binary over a placeholder; an npm
  # that does not run install scripts leaves the placeholder: run it here.
  cc="$PREFIX/node_modules/@anthropic-ai/claude-code"
  if ! "$BIN/claude" --version >/dev/null 2>&1; then
    (cd "$cc" && node install.cjs)
  fi
  working || { echo "install_agents: the installed CLIs do not report the pinned versions:" >&2
               "$BIN/claude" --version >&2 || true; "$BIN/codex" --version >&2 || true
               "$BIN/gemini" --version >&2 || true; "$BIN/opencode" --version >&2 || true; exit 1; }
  echo "$want" > "$PREFIX/.stamp"
fi
for pin in "${PINS[@]}"; do  # claude, codex, gemini, opencode: the order of PINS
  name=$(basename "${pin%@*}"); name=${name%-cli}; name=${name%-code}; name=${name%-ai}
  say "$(printf '%-8s %-9s %s' "$name" "${pin##*@}" "$BIN/$name")"
done
