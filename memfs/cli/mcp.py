"""``memfs mcp``: serve the memory to MCP clients (SPEC §13), a thin skin over
:mod:`memfs.mcp_server`."""

from __future__ import annotations

import argparse
import os
import sys

from memfs.cli.common import Commands, _config, _Usage

INSTALL = "pip install 'memfs[mcp]'"


def cmd_mcp(args: argparse.Namespace) -> int:
    try:
        import mcp.server.lowlevel  # noqa: F401  (the SDK: the memfs[mcp] extra)
    except ImportError:
        raise _Usage(f"mcp: the MCP SDK is not installed: {INSTALL}") from None
    from memfs.mcp_server.server import serve, stderr_logging
    from memfs.mcp_server.sources import MountSource, StoreSource

    if args.mount and (args.store or args.workspace):
        raise _Usage("mcp: --mount and --store/--workspace do not go together")
    config = _config(args)
    stderr_logging(config.log_level)
    source = MountSource(args.mount, config) if args.mount else StoreSource(config)
    where = f"http://127.0.0.1:{args.http}/mcp" if args.http is not None else "stdio"
    print(f"memfs mcp: serving {source.describe} over {where} "
          f"({'read-write' if args.allow_write else 'read-only'}; pid {os.getpid()})", file=sys.stderr, flush=True)
    try:
        serve(source, allow_write=args.allow_write, http_port=args.http)
    finally:
        source.close()
    return 0


def _port(text: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= 65535:
        raise argparse.ArgumentTypeError(f"not a TCP port: {text!r}")
    return int(text)


def register(c: Commands) -> None:
    p = c.add("mcp", cmd_mcp, "serve the memory to MCP clients (Claude Code, Codex, …) over stdio or HTTP",
              epilog="Tools: search, list_sessions, get_context, read_turn, get_usage, and append_note with "
                     "--allow-write; resources memfs://sessions/<name>/<file>. Needs the MCP SDK: " + INSTALL + ".")
    p.add_argument("--mount", metavar="MNT", help="serve a running store-wide mount through its files "
                                                  "(instead of --store)")
    p.add_argument("--http", type=_port, metavar="PORT",
                   help="streamable HTTP on http://127.0.0.1:PORT/mcp instead of stdio")
    p.add_argument("--allow-write", action="store_true", help="offer append_note (off by default)")
