"""The floors of the README's Layout: a floor imports only from the floors below it.

Each check runs in a fresh interpreter, so what an import loads is all that is loaded.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import memfs
import pytest

from mounting import mounted, needs_fuse

PROBE = "import importlib, json, sys; importlib.import_module(sys.argv[1]); " \
        "print(json.dumps(sorted(m for m in sys.modules if m == 'memfs' or m.startswith('memfs.'))))"


def loaded_by(module: str) -> list[str]:
    out = subprocess.run([sys.executable, "-c", PROBE, module], capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


@pytest.mark.parametrize("module, allowed", [
    ("memfs.events", {"memfs", "memfs._lazy", "memfs.errors", "memfs.events", "memfs.formats"}),
    ("memfs.facts", {"memfs", "memfs._lazy", "memfs.facts"}),
    ("memfs.text", {"memfs", "memfs._lazy", "memfs.text"}),
    ("memfs.search.bm25", {"memfs", "memfs._lazy", "memfs.pace", "memfs.search", "memfs.search.bm25",
                           "memfs.search.index", "memfs.search.sessions", "memfs.search.tokenize"}),
])
def test_a_lower_floor_loads_nothing_above_it(module, allowed):
    loaded = set(loaded_by(module))
    assert module in loaded
    assert loaded <= allowed, f"import {module} also loads {sorted(loaded - allowed)}"


def test_the_contract_loads_no_store_module():
    assert not [m for m in loaded_by("memfs.events") if m.startswith("memfs.store")]


def test_the_public_api_loads_the_store_on_first_use():
    probe = ("import sys, memfs; before = 'memfs.store.session' in sys.modules; memfs.open_session; "
             "print(before, 'memfs.store.session' in sys.modules, memfs.SessionHandle.__module__)")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["False", "True", "memfs.store.session"]


def test_the_store_does_not_import_the_filesystem_views_or_search():
    loaded = loaded_by("memfs.store.session") + loaded_by("memfs.store.retention") + loaded_by("memfs.store.fsck")
    above = sorted({m for m in loaded if m.startswith(("memfs.fs", "memfs.views", "memfs.search", "memfs.cli"))})
    assert above == []


def test_without_cluster_nothing_of_it_is_imported():
    """memfs without --cluster never loads the cluster node nor the NATS client (SPEC §9)."""
    probe = ("import sys, memfs.cli, memfs.fs.mount, memfs.fs.ops, memfs.config; "
             "print(sorted(m for m in sys.modules if m == 'nats' or m.startswith(('nats.', 'memfs.cluster.'))))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


@needs_fuse
def test_memfs_is_pure_python_even_in_a_mount_s_server(tmp_path):
    """No compiled module of memfs's own (docs/design.md says why they went): none in the
    package, and a mounted server, after an append and a read, maps no shared object from it
    (pyfuse3, orjson and numpy are compiled; they are dependencies)."""
    package = Path(memfs.__file__).parent
    assert not [p for p in package.rglob("*") if p.suffix in (".c", ".so", ".pyd")]
    with mounted(tmp_path / "store", tmp_path / "mnt") as m:
        (m.mnt / "sessions" / "s").mkdir()
        with open(m.mnt / "sessions" / "s" / "events.jsonl", "ab") as f:
            f.write(b'{"type":"turn.started"}\n')
        assert b"turn.started" in (m.mnt / "sessions" / "s" / "events.jsonl").read_bytes()
        maps = Path(f"/proc/{m.proc.pid}/maps").read_text().splitlines()
    mapped = {line.split()[-1] for line in maps if line.split()[-1].endswith(".so") or ".so." in line}
    assert any("pyfuse3" in path for path in mapped)  # (the probe sees the server's compiled modules)
    assert not [path for path in mapped if path.startswith(str(package))]


def test_a_command_loads_its_own_module_only(tmp_path):
    """``memfs sessions`` builds only its own parser: no other command's module, no search index
    (numpy), no views (the usages it shows are the catalog's), no lock library; ``memfs --help``
    still lists every command."""
    store = tmp_path / "store"
    subprocess.run([sys.executable, "-m", "memfs", "append", "--store", str(store), "s", "-"],
                   input=b'{"type":"turn.started"}\n', capture_output=True, check=True)
    # (the first listing computes the session's usage, which the catalog then keeps)
    subprocess.run([sys.executable, "-m", "memfs", "sessions", "--store", str(store)], capture_output=True, check=True)
    probe = ("import sys, io, contextlib; from memfs.cli import main\n"
             "with contextlib.redirect_stdout(io.StringIO()) as out: code = main(['sessions', '--store', sys.argv[1]])\n"
             "assert code == 0 and ' s' in out.getvalue(), out.getvalue()\n"
             "print(sorted(m for m in sys.modules if m.split('.')[0] in ('numpy', 'portalocker', 'pyfuse3', 'trio', "
             "'mcp') or m.startswith(('memfs.cli.', 'memfs.views', 'memfs.search', 'memfs.fs', 'memfs.mcp'))))")
    out = subprocess.run([sys.executable, "-c", probe, str(store)], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "['memfs.cli.common', 'memfs.cli.sessions']"
    listed = subprocess.run([sys.executable, "-m", "memfs", "--help"], capture_output=True, text=True, check=True).stdout
    from memfs.cli import COMMANDS

    assert all(f"    {name}" in listed for name in COMMANDS)
