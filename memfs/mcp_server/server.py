"""The MCP server (SPEC §13) on the official SDK's low-level :class:`mcp.server.lowlevel.Server`:
tools and resources over a :mod:`memfs.mcp_server.sources` source, served over stdio or
streamable HTTP.

Decisions recorded here:

* Every failure of a tool call — an unknown tool, arguments that fail the tool's schema or
  carry an unknown name, an unknown session, a refused note, an unexpected error — is a
  ``CallToolResult`` with ``isError`` and a one-line reason, never a protocol error: the
  client's call completes, the model reads why, and the server keeps serving. Reasons are the
  library's (the filesystem's) own. An unexpected error's text is logged on stderr with its
  traceback and the client reads ``internal error (<type>)``.
* Resource reads cannot carry ``isError`` (the protocol has no such field): an unknown
  session or file is the ``-32602`` error the SDK uses for "no such resource", with the same
  reason.
* Tool results are JSON text (one object), also given as ``structuredContent``; ``get_context``
  is the brief's Markdown as text. ``append_note`` is listed only with ``--allow-write``.
* The library's calls run on worker threads: a slow search or a large session's first fold
  never stalls the transport.
* Over stdio a line that is not a JSON-RPC message is answered with JSON-RPC's parse error
  (``-32700``, id null) and serving goes on (:func:`serve_stdio`); HTTP is guarded by
  :mod:`memfs.mcp_server.http` (the bearer token, the Unix socket, the session bound).
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from typing import Any
from urllib.parse import unquote

import anyio
import mcp_types as types
import orjson
from mcp.server.lowlevel import Server
from mcp.shared.exceptions import MCPError
from mcp.shared.message import SessionMessage
from pydantic import BaseModel, ValidationError

from memfs.errors import MemfsError
from memfs.mcp_server import args as A
from memfs.mcp_server.sources import check_session, note_line, turn_events

log = logging.getLogger("memfs.mcp")

URI_PREFIX = "memfs://sessions/"
PAGE_SESSIONS = 100  # sessions per page of resources/list


class Tool:
    def __init__(self, name: str, model: type[BaseModel], run: Callable[[Any, Any], Any], description: str):
        self.name, self.model, self.run, self.description = name, model, run, description

    def spec(self) -> types.Tool:
        schema = self.model.model_json_schema(by_alias=True)
        schema.pop("title", None)
        for prop in schema.get("properties", {}).values():
            prop.pop("title", None)
        return types.Tool(name=self.name, description=self.description, input_schema=schema)


def _search(source, a: A.SearchArgs):
    return {"results": source.search(a)}


def _list_sessions(source, a: A.ListSessionsArgs):
    return {"sessions": source.sessions(a)}


def _get_context(source, a: A.GetContextArgs):
    return source.context(a.session, a.budget)


def _read_turn(source, a: A.ReadTurnArgs):
    return {"session": a.session, "turn": a.turn, "events": turn_events(source.turn(a.session, a.turn))}


def _get_usage(source, a: A.GetUsageArgs):
    return source.usage(a)


def _append_note(source, a: A.AppendNoteArgs):
    line = note_line(a)
    size = source.append(a.session, line)
    return {"session": a.session, "appended": 1, "log_bytes": size, "line": orjson.loads(line)}


TOOLS = [
    Tool("search", A.SearchArgs, _search,
         "BM25 search over the grounded facts of the agents' sessions (what was done, run, changed, failed). "
         "Each result names its session, turn and score; options narrow or stem the search."),
    Tool("list_sessions", A.ListSessionsArgs, _list_sessions,
         "The sessions of the memory, most recently updated first, with their agent, project, title, status "
         "and turn count; filter by agent, project, status and since."),
    Tool("get_context", A.GetContextArgs, _get_context,
         "A session's brief for continuing its work (goal, progress, open todos, last summary, failures, files "
         "touched, facts), newest first, cut to a token budget."),
    Tool("read_turn", A.ReadTurnArgs, _read_turn, "The events of one turn of a session, in order."),
    Tool("get_usage", A.GetUsageArgs, _get_usage,
         "Token usage and cost: of one session, or the whole memory's report by day, model, project, agent or "
         "session."),
]
APPEND_NOTE = Tool("append_note", A.AppendNoteArgs, _append_note,
                   "Append a note to an existing session: an agent_message or plan item (text), or one goal.* event. "
                   "Validated like any line of the log; a refused note is not stored.")


def _error(reason: str) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(text=" ".join(reason.split()))], is_error=True)


def _reason(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror + (f": {exc.filename}" if exc.filename else "")
    return str(exc) or type(exc).__name__


def call(source, tools: dict[str, Tool], name: str, arguments: dict[str, Any] | None) -> types.CallToolResult:
    """One tool call, synchronously: the result, or ``isError`` with a one-line reason."""
    tool = tools.get(name)
    if tool is None:
        return _error(f"unknown tool {name[:64]!r} (tools: {', '.join(tools)})")
    try:
        parsed = tool.model.model_validate(arguments or {})
    except ValidationError as exc:
        return _error(A.reason(exc))
    try:
        value = tool.run(source, parsed)
    except (MemfsError, OSError, ValueError) as exc:
        return _error(_reason(exc))
    except Exception as exc:  # never a crash of the server nor a protocol error
        log.exception("tool %s failed", name)
        return _error(f"internal error ({type(exc).__name__}); see the server's log")
    if isinstance(value, str):
        return types.CallToolResult(content=[types.TextContent(text=value)])
    text = orjson.dumps(value).decode()
    return types.CallToolResult(content=[types.TextContent(text=text)], structured_content=value)


def _split_uri(uri: str) -> tuple[str, str]:
    if not uri.startswith(URI_PREFIX):
        raise MCPError(code=types.INVALID_PARAMS, message=f"no resource {uri[:120]!r} (memfs://sessions/<name>/<file>)")
    name, _, file = unquote(uri[len(URI_PREFIX):]).partition("/")
    return name, file


def build_server(source, allow_write: bool = False) -> Server:
    """The low-level server answering tools and resources from ``source``."""
    tools = {t.name: t for t in TOOLS + ([APPEND_NOTE] if allow_write else [])}
    limiter = anyio.CapacityLimiter(4)

    async def in_thread(fn, *args):
        return await anyio.to_thread.run_sync(fn, *args, limiter=limiter)

    async def list_tools(ctx, params) -> types.ListToolsResult:
        return types.ListToolsResult(tools=[t.spec() for t in tools.values()])

    async def call_tool(ctx, params: types.CallToolRequestParams) -> types.CallToolResult:
        return await in_thread(call, source, tools, params.name, params.arguments)

    def resources_page(cursor: str | None) -> types.ListResourcesResult:
        names = source.names()
        start = int(cursor) if cursor and cursor.isdigit() else 0
        page = names[start:start + PAGE_SESSIONS]
        found = []
        for name in page:
            try:
                files = source.files(name)
            except (MemfsError, OSError):
                continue
            found += [types.Resource(uri=f"{URI_PREFIX}{name}/{f}", name=f"{name}/{f}",
                                     mime_type="text/markdown" if f.endswith(".md") else "application/json")
                      for f in files]
        more = start + PAGE_SESSIONS < len(names)
        return types.ListResourcesResult(resources=found, next_cursor=str(start + PAGE_SESSIONS) if more else None)

    async def list_resources(ctx, params) -> types.ListResourcesResult:
        return await in_thread(resources_page, getattr(params, "cursor", None))

    async def list_templates(ctx, params) -> types.ListResourceTemplatesResult:
        return types.ListResourceTemplatesResult(resource_templates=[types.ResourceTemplate(
            uri_template=URI_PREFIX + "{name}/{+file}", name="session file",
            description="a file of a session as the mount shows it: events.jsonl, manifest.json, rejected.jsonl, "
                        "index/turns.json, derived/<view>, derived/turns/<n>.jsonl")])

    def read(uri: str) -> types.ReadResourceResult:
        name, file = _split_uri(uri)
        try:
            data = source.read(check_session(name), file)
        except (MemfsError, OSError) as exc:
            raise MCPError(code=types.INVALID_PARAMS, message=_reason(exc), data={"uri": uri}) from None
        mime = "text/markdown" if file.endswith(".md") else "application/json"
        try:
            return types.ReadResourceResult(contents=[types.TextResourceContents(uri=uri, text=data.decode(),
                                                                                 mime_type=mime)])
        except UnicodeDecodeError:
            import base64

            return types.ReadResourceResult(contents=[types.BlobResourceContents(
                uri=uri, blob=base64.b64encode(data).decode(), mime_type="application/octet-stream")])

    async def read_resource(ctx, params: types.ReadResourceRequestParams) -> types.ReadResourceResult:
        return await in_thread(read, str(params.uri))

    from memfs import __version__

    return Server("memfs", version=__version__,
                  instructions="memfs: the session memory of AI coding agents. Use search to find what was done or "
                               "what failed, list_sessions to see the sessions, get_context for a session's brief.",
                  on_list_tools=list_tools, on_call_tool=call_tool, on_list_resources=list_resources,
                  on_list_resource_templates=list_templates, on_read_resource=read_resource)


def serve(source, *, allow_write: bool = False, http_port: int | None = None, unix: str | None = None,
          **http) -> None:
    """Serve ``source`` over stdio (the default), streamable HTTP at
    ``http://127.0.0.1:<port>/mcp`` or on the Unix socket ``unix``
    (:func:`memfs.mcp_server.http.serve_http` takes ``http``: the token and the session bound),
    until the client goes away or a signal stops it."""
    server = build_server(source, allow_write)
    if http_port is None and unix is None:
        anyio.run(serve_stdio, server)
        return
    from memfs.mcp_server.http import serve_http

    serve_http(server, port=http_port, unix=unix, **http)


def _parse_error(exc: Exception) -> SessionMessage:
    """The answer to a line that is not a JSON-RPC message (JSON-RPC's parse error, id null)."""
    errors = exc.errors() if isinstance(exc, ValidationError) else []
    what = "not JSON" if any(e["type"] == "json_invalid" for e in errors) else "not a JSON-RPC message"
    return SessionMessage(types.JSONRPCError(jsonrpc="2.0", id=None, error=types.ErrorData(
        code=types.PARSE_ERROR, message=f"Parse error: the line is {what}")))


async def serve_stdio(server: Server) -> None:
    """The SDK's stdio transport, with a malformed line answered by a parse error (the SDK
    passes it on as an exception, which its server only logs) instead of silence."""
    from mcp.server.stdio import stdio_server

    async with stdio_server() as (read_stream, write_stream):
        to_server, from_relay = anyio.create_memory_object_stream[SessionMessage | Exception](0)

        async def relay() -> None:
            async with to_server:
                async for item in read_stream:
                    if isinstance(item, Exception):
                        log.info("a malformed line on stdin: answered with a parse error")
                        await write_stream.send(_parse_error(item))
                    else:
                        await to_server.send(item)

        async with anyio.create_task_group() as tg:
            tg.start_soon(relay)
            await server.run(from_relay, write_stream, server.create_initialization_options())
            tg.cancel_scope.cancel()


def stderr_logging(level: str = "INFO") -> None:
    logging.basicConfig(stream=sys.stderr, level=getattr(logging, level.upper(), logging.INFO),
                        format="memfs mcp: %(levelname)s %(name)s: %(message)s")
