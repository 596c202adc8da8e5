"""``memfs config path|show``: which configuration file the commands read, and what it sets.

Every command and the mount read ``--config FILE``, else ``$XDG_CONFIG_HOME/memfs/config.toml``
(``~/.config/memfs/config.toml``) when it exists (SPEC §12, :func:`memfs.config.config_path`).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys

from memfs.cli.common import Commands, _config, _json, _out


def cmd_config_path(args: argparse.Namespace) -> int:
    from memfs.store.paths import config_path, default_config_path

    path = config_path(args.config)
    if args.json:
        _json({"path": str(path) if path is not None else None, "default": str(default_config_path()),
               "exists": path is not None and path.exists()})
    elif path is None:
        _out(f"{default_config_path()} (absent: the built-in defaults apply)")
    else:
        _out(str(path))
    return 0


def cmd_config_show(args: argparse.Namespace) -> int:
    from memfs.store.paths import config_path

    config = _config(args)
    path = config_path(args.config)
    doc = {"file": str(path) if path is not None else None, **dataclasses.asdict(config),
           "sessions_root": str(config.sessions_root())}
    if args.json:
        _json(doc)
        return 0
    for key, value in doc.items():
        if isinstance(value, dict):
            for sub, subvalue in value.items():
                _out(f"{key}.{sub} = {subvalue!r}")
        else:
            _out(f"{key} = {value!r}")
    return 0


def _config_usage(args: argparse.Namespace) -> int:
    args.parser.print_usage(sys.stderr)
    print("memfs config: choose an action: path or show", file=sys.stderr)
    return 2


def register(c: Commands) -> None:
    p = c.add("config", _config_usage,
              parents=())
    p.set_defaults(parser=p)
    sub = p.add_subparsers(dest="config_command", metavar="ACTION")
    q = sub.add_parser("path", parents=[c.common, c.as_json], help="the file read: --config, else "
                       "$XDG_CONFIG_HOME/memfs/config.toml when it exists")
    q.set_defaults(func=cmd_config_path)
    q = sub.add_parser("show", parents=[c.common, c.as_json], help="the settings in force (the file and the flags)")
    q.set_defaults(func=cmd_config_show)
