"""``memfs mcp``: serve the memory to MCP clients (SPEC §13), a thin skin over
:mod:`memfs.mcp_server`."""

from __future__ import annotations

import argparse
import os
import sys

from memfs.cli.common import Commands, _config, _Usage
from memfs.mcp_server import DEFAULT_IDLE_TIMEOUT, DEFAULT_MAX_SESSIONS

INSTALL = "pip install 'memfs[mcp]'"


def cmd_mcp(args: argparse.Namespace) -> int:
    if args.mount and (args.store or args.workspace):
        raise _Usage("mcp: --mount and --store/--workspace do not go together")
    if args.http is not None and args.unix is not None:
        raise _Usage("mcp: --http and --unix do not go together")
    if args.token_file is not None and args.http is None:
        raise _Usage("mcp: --token-file goes with --http (a --unix socket is guarded by its mode, stdio by its pipe)")
    config = _config(args)
    if args.token_file is not None:  # refused before anything starts
        from memfs.mcp_server.http import load_token

        load_token(args.token_file)
    try:
        import mcp.server.lowlevel  # noqa: F401  (the SDK: the memfs[mcp] extra)
    except ImportError:
        raise _Usage(f"mcp: the MCP SDK is not installed: {INSTALL}") from None
    from memfs.mcp_server.server import serve, stderr_logging
    from memfs.mcp_server.sources import MountSource, StoreSource

    stderr_logging(config.log_level)
    source = MountSource(args.mount, config) if args.mount else StoreSource(config)
    token, setup = None, None
    if args.http is not None:  # made once the store is known to be there, so its setup is shown
        from memfs.mcp_server.http import client_setup, ensure_token

        token, token_file, made = ensure_token(args.token_file)
        if made:
            served = ["--mount", os.path.abspath(args.mount)] if args.mount else ["--store", str(config.sessions_root())]
            setup = client_setup(f"http://127.0.0.1:{args.http}/mcp", token, token_file, served)
    where = (f"http://127.0.0.1:{args.http}/mcp (bearer token required)" if args.http is not None
             else f"unix socket {args.unix} (mode 0600)" if args.unix is not None else "stdio")
    print(f"memfs mcp: serving {source.describe} over {where} "
          f"({'read-write' if args.allow_write else 'read-only'}; pid {os.getpid()})", file=sys.stderr, flush=True)
    if setup:
        print(setup, file=sys.stderr, flush=True)
    try:
        serve(source, allow_write=args.allow_write, http_port=args.http, unix=args.unix, token=token,
              max_sessions=args.max_sessions, idle_timeout=args.idle_timeout)
    finally:
        source.close()
    return 0


def _port(text: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= 65535:
        raise argparse.ArgumentTypeError(f"not a TCP port: {text!r}")
    return int(text)


def _positive(kind: type):
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            value = 0
        if not 0 < value < 10**9:
            raise argparse.ArgumentTypeError(f"not a positive number: {text!r}")
        return value

    return parse


def register(c: Commands) -> None:
    p = c.add("mcp", cmd_mcp,
              epilog="Tools: search, list_sessions, get_context, read_turn, get_usage, and append_note with "
                     "--allow-write; resources memfs://sessions/<name>/<file>. Needs the MCP SDK: " + INSTALL + ".")
    p.add_argument("--mount", metavar="MNT", help="serve a running store-wide mount through its files "
                                                  "(instead of --store)")
    p.add_argument("--http", type=_port, metavar="PORT",
                   help="streamable HTTP on http://127.0.0.1:PORT/mcp instead of stdio; every request needs the "
                        "bearer token (made on first use and printed with the clients' configuration)")
    p.add_argument("--token-file", metavar="FILE", help="with --http: the bearer token (a 0600 file of yours; "
                                                        "default: $XDG_STATE_HOME/memfs/mcp-token)")
    p.add_argument("--unix", metavar="PATH", help="streamable HTTP on a Unix socket (mode 0600: this user only; "
                                                  "no token) instead of stdio")
    p.add_argument("--max-sessions", type=_positive(int), default=DEFAULT_MAX_SESSIONS, metavar="N",
                   help=f"HTTP: at most N open sessions; a new one ends the longest idle (default {DEFAULT_MAX_SESSIONS})")
    p.add_argument("--idle-timeout", type=_positive(float), default=DEFAULT_IDLE_TIMEOUT, metavar="SECONDS",
                   help=f"HTTP: end a session unused this long (default {DEFAULT_IDLE_TIMEOUT:g})")
    p.add_argument("--allow-write", action="store_true", help="offer append_note (off by default)")
