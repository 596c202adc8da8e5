"""A tiny stdio MCP server named ``notes`` with one tool, ``lookup``: the agents' MCP scenario
calls ``notes.lookup`` through it. Each call is appended as a JSON line to $NOTES_MCP_LOG when
that is set, so a test can check the call really reached the server."""

import json
import os

from mcp.server.mcpserver import MCPServer

NOTES = {"release": "v1.2 ships on Friday", "owner": "the storage team owns memfs/store"}

server = MCPServer("notes")


@server.tool()
def lookup(key: str) -> str:
    """Look up a note by its key (e.g. "release" or "owner")."""
    log = os.environ.get("NOTES_MCP_LOG")
    if log:
        with open(log, "a") as f:
            f.write(json.dumps({"tool": "lookup", "key": key}) + "\n")
    return NOTES.get(key, f"no note named {key!r}")


if __name__ == "__main__":
    server.run()
