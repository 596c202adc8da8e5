"""Floor 4: the MCP server (SPEC §13) — the memory served to any MCP client over stdio or
streamable HTTP, on the official ``mcp`` SDK (the ``memfs[mcp]`` extra).

* :mod:`~memfs.mcp_server.args` — each tool's arguments (the input schemas; validation).
* :mod:`~memfs.mcp_server.sources` — a store through the library, or a mount through its files.
* :mod:`~memfs.mcp_server.server` — tools, resources ``memfs://sessions/<name>/<file>``, transports.
* :mod:`~memfs.mcp_server.http` — streamable HTTP guarded: the bearer token, the Unix socket, the
  bounded session table.

Named ``mcp_server`` (not ``mcp``) so that ``import mcp`` always means the SDK.
"""

DEFAULT_MAX_SESSIONS = 32  # open HTTP sessions; a new one beyond ends the longest idle
DEFAULT_IDLE_TIMEOUT = 600.0  # seconds without a request before an HTTP session is ended
