"""A scripted, offline model server for the real agent CLIs (Claude Code, Codex, Gemini CLI, OpenCode).

It answers the providers' APIs on 127.0.0.1 — Anthropic Messages (``POST /v1/messages``,
SSE when ``stream``; ``/v1/messages/count_tokens``), OpenAI Responses (``POST /v1/responses``,
SSE), OpenAI Chat Completions (``POST /v1/chat/completions``, SSE when ``stream``; OpenCode's
``@ai-sdk/openai-compatible`` provider) and Gemini (``POST /v1beta/models/<m>:streamGenerateContent?alt=sse``, ``:generateContent``,
``:countTokens``) — from a *script* (JSON)::

    {"steps": [STEP, ...],      # answer the model requests in order, one step each
     "side":  [STEP, ...],      # steps with "when": answer matching requests, not consumed
     "after": STEP}             # once the steps are used up (default: {"text": "Done."})

    STEP = {"text": "...",                                   # assistant text, and/or
            "tool": {"name": "Bash", "arguments": {...}},    # one tool call (or "tools": [...])
                   # Codex: {"name": "apply_patch", "input": "...", "custom": true} for a custom call
            "error": {"status": 500, "message": "...", "type": "api_error"},   # or instead: an error
            "usage": {"input": 100, "output": 20, "cached": 0},
            "when": {"api": "anthropic|openai|chat|gemini", "path": "...", "contains": "...",
                     "tools": true|false, "stream": true|false},  # optional matcher
            "repeat": N,                                     # answer N requests (errors, mostly)
            "hang": S}                                       # answer nothing for S seconds, then close (a run to interrupt)

Every request is recorded as one JSON line (method, path, headers without credentials, body,
and which step answered it). Run it as
``python model_server.py --script S.json --record R.jsonl --port 0 --port-file F``, or from
Python with ``with ModelServer(script, record) as srv: srv.url`` (a subprocess, stopped by pid).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qsl, urlencode, urlsplit

SECRET_HEADERS = {"authorization", "x-api-key", "x-goog-api-key", "cookie", "proxy-authorization"}
_ids = itertools.count(1)


def _id(prefix: str) -> str:
    return f"{prefix}_{os.getpid() % 10000:04d}{next(_ids):06d}"


def _sse(events, named: bool = True) -> bytes:
    """Server-sent events: ``event: TYPE`` (when named) and ``data: JSON`` per event."""
    out = []
    for ev in events:
        head = f"event: {ev['type']}\n" if named else ""
        out.append(f"{head}data: {json.dumps(ev)}\n\n")
    return "".join(out).encode()


def _calls(step: dict) -> list[dict]:
    return step.get("tools") or ([step["tool"]] if step.get("tool") else [])


def _usage(step: dict) -> tuple[int, int, int]:
    u = step.get("usage") or {}
    return u.get("input", 100), u.get("output", 20), u.get("cached", 0)


# --- Anthropic Messages ---------------------------------------------------------------------

def anthropic_error(status: int, err: dict) -> dict:
    kind = err.get("type") or {400: "invalid_request_error", 401: "authentication_error",
                               429: "rate_limit_error", 529: "overloaded_error"}.get(status, "api_error")
    return {"type": "error", "error": {"type": kind, "message": err.get("message", "Internal server error")},
            "request_id": _id("req")}


def anthropic_reply(step: dict, body: dict) -> tuple[str, bytes]:
    inp, out, cached = _usage(step)
    blocks = ([{"type": "text", "text": step["text"]}] if step.get("text") else []) + [
        {"type": "tool_use", "id": _id("toolu"), "name": c["name"], "input": c.get("arguments", {})}
        for c in _calls(step)]
    usage = {"input_tokens": inp, "cache_creation_input_tokens": 0, "cache_read_input_tokens": cached,
             "output_tokens": out}
    msg = {"id": _id("msg"), "type": "message", "role": "assistant", "model": body.get("model", "claude"),
           "content": blocks, "stop_reason": "tool_use" if _calls(step) else "end_turn",
           "stop_sequence": None, "usage": usage}
    if not body.get("stream"):
        return "application/json", json.dumps(msg).encode()
    events = [{"type": "message_start", "message": {**msg, "content": [], "stop_reason": None,
                                                    "usage": {**usage, "output_tokens": 1}}}]
    for i, b in enumerate(blocks):
        if b["type"] == "text":
            events += [{"type": "content_block_start", "index": i, "content_block": {"type": "text", "text": ""}},
                       {"type": "content_block_delta", "index": i,
                        "delta": {"type": "text_delta", "text": b["text"]}}]
        else:
            events += [{"type": "content_block_start", "index": i, "content_block": {**b, "input": {}}},
                       {"type": "content_block_delta", "index": i,
                        "delta": {"type": "input_json_delta", "partial_json": json.dumps(b["input"])}}]
        events.append({"type": "content_block_stop", "index": i})
    events += [{"type": "message_delta", "delta": {"stop_reason": msg["stop_reason"], "stop_sequence": None},
                "usage": {"output_tokens": out}},
               {"type": "message_stop"}]
    return "text/event-stream", _sse(events)


# --- OpenAI Responses -----------------------------------------------------------------------

def openai_error(status: int, err: dict) -> dict:
    kind = err.get("type") or {400: "invalid_request_error", 429: "rate_limit_exceeded"}.get(status, "server_error")
    return {"error": {"message": err.get("message", "The server had an error processing your request."),
                      "type": kind, "param": None, "code": err.get("code")}}


def openai_reply(step: dict, body: dict) -> tuple[str, bytes]:
    inp, out, cached = _usage(step)
    items = []
    if step.get("text"):
        items.append({"type": "message", "id": _id("msg"), "status": "completed", "role": "assistant",
                      "content": [{"type": "output_text", "text": step["text"], "annotations": []}]})
    for c in _calls(step):
        if "item" in c:  # any other output item, as given (e.g. a tool_search_call)
            items.append({"id": _id("item"), "call_id": _id("call"), "status": "completed", **c["item"]})
        elif c.get("custom"):
            items.append({"type": "custom_tool_call", "id": _id("ctc"), "status": "completed",
                          "call_id": _id("call"), "name": c["name"], "input": c["input"]})
        else:
            items.append({"type": "function_call", "id": _id("fc"), "status": "completed", "call_id": _id("call"),
                          "name": c["name"], "arguments": json.dumps(c.get("arguments", {})),
                          **({"namespace": c["namespace"]} if c.get("namespace") else {})})
    resp = {"id": _id("resp"), "object": "response", "created_at": int(time.time()), "status": "in_progress",
            "model": body.get("model", "gpt"), "output": []}
    usage = {"input_tokens": inp, "input_tokens_details": {"cached_tokens": cached}, "output_tokens": out,
             "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": inp + out}
    events = [{"type": "response.created", "response": resp}]
    for n, item in enumerate(items):
        events.append({"type": "response.output_item.added", "output_index": n,
                       "item": {**item, "status": "in_progress"}})
        if item["type"] == "message":
            events.append({"type": "response.output_text.delta", "item_id": item["id"], "output_index": n,
                           "content_index": 0, "delta": step["text"]})
        events.append({"type": "response.output_item.done", "output_index": n, "item": item})
    events.append({"type": "response.completed",
                   "response": {**resp, "status": "completed", "output": items, "usage": usage}})
    for seq, ev in enumerate(events):
        ev["sequence_number"] = seq
    if not body.get("stream"):
        return "application/json", json.dumps(events[-1]["response"]).encode()
    return "text/event-stream", _sse(events)


# --- OpenAI Chat Completions ------------------------------------------------------------------

def chat_reply(step: dict, body: dict) -> tuple[str, bytes]:
    """A chat completion: text, then each tool call (its arguments in one delta), then a last
    chunk with ``finish_reason`` and ``usage`` (sent whether or not ``stream_options`` asks)."""
    inp, out, cached = _usage(step)
    calls = [{"index": i, "id": _id("call"), "type": "function",
              "function": {"name": c["name"], "arguments": json.dumps(c.get("arguments", {}))}}
             for i, c in enumerate(_calls(step))]
    usage = {"prompt_tokens": inp, "completion_tokens": out, "total_tokens": inp + out,
             "prompt_tokens_details": {"cached_tokens": cached}, "completion_tokens_details": {"reasoning_tokens": 0}}
    finish = "tool_calls" if calls else "stop"
    head = {"id": _id("chatcmpl"), "created": int(time.time()), "model": body.get("model", "gpt")}
    if not body.get("stream"):
        msg = {"role": "assistant", "content": step.get("text") or None, **({"tool_calls": [
            {k: v for k, v in c.items() if k != "index"} for c in calls]} if calls else {})}
        return "application/json", json.dumps({**head, "object": "chat.completion", "usage": usage, "choices": [
            {"index": 0, "message": msg, "finish_reason": finish}]}).encode()

    def chunk(delta: dict, finish_reason=None, **extra) -> dict:
        return {**head, "object": "chat.completion.chunk",
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}], **extra}
    chunks = [chunk({"role": "assistant", "content": ""})]
    if step.get("text"):
        chunks.append(chunk({"content": step["text"]}))
    chunks += [chunk({"tool_calls": [c]}) for c in calls]
    chunks.append(chunk({}, finish, usage=usage))
    return "text/event-stream", b"".join(f"data: {json.dumps(c)}\n\n".encode() for c in chunks) + b"data: [DONE]\n\n"


# --- Gemini ---------------------------------------------------------------------------------

GEMINI_STATUS = {400: "INVALID_ARGUMENT", 401: "UNAUTHENTICATED", 403: "PERMISSION_DENIED", 404: "NOT_FOUND",
                 429: "RESOURCE_EXHAUSTED", 500: "INTERNAL", 503: "UNAVAILABLE"}


def gemini_error(status: int, err: dict) -> dict:
    return {"error": {"code": status, "message": err.get("message", "Internal error encountered."),
                      "status": err.get("type") or GEMINI_STATUS.get(status, "UNKNOWN")}}


def gemini_reply(step: dict, body: dict, path: str) -> tuple[str, bytes]:
    inp, out, cached = _usage(step)
    if path.endswith(":countTokens"):
        return "application/json", json.dumps({"totalTokens": inp}).encode()
    parts = ([{"text": step["text"]}] if step.get("text") else []) + [
        {"functionCall": {"name": c["name"], "args": c.get("arguments", {})}} for c in _calls(step)]
    chunk = {"candidates": [{"content": {"role": "model", "parts": parts}, "finishReason": "STOP", "index": 0}],
             "usageMetadata": {"promptTokenCount": inp, "candidatesTokenCount": out,
                               "cachedContentTokenCount": cached, "totalTokenCount": inp + out},
             "modelVersion": path.rsplit("/", 1)[-1].split(":")[0], "responseId": _id("resp")}
    if ":streamGenerateContent" in path:
        return "text/event-stream", _sse([chunk], named=False)
    return "application/json", json.dumps(chunk).encode()


# --- the server -----------------------------------------------------------------------------

def api_of(path: str) -> str | None:
    if path.startswith("/v1/messages"):
        return "anthropic"
    if path.rstrip("/").endswith("/responses"):
        return "openai"
    if path.rstrip("/").endswith("/chat/completions"):
        return "chat"
    if "/models/" in path and ":" in path.rsplit("/", 1)[-1]:
        return "gemini"
    return None


def matches(when: dict | None, api: str, path: str, body, raw: bytes) -> bool:
    if not when:
        return True
    body = body if isinstance(body, dict) else {}
    has_tools = bool(body.get("tools"))
    stream = bool(body.get("stream")) or ":streamGenerateContent" in path
    return ((when.get("api") in (None, api)) and when.get("path", "") in path
            and when.get("contains", "") in raw.decode("utf-8", "replace")
            and when.get("tools", has_tools) == has_tools and when.get("stream", stream) == stream)


class Script:
    """The steps left, consumed under a lock (the server is threaded)."""

    def __init__(self, script: dict):
        self.steps = [dict(s) for s in script.get("steps", [])]
        self.side = script.get("side", [])
        self.after = script.get("after", {"text": "Done."})
        self.lock = threading.Lock()
        self.used = 0

    def take(self, api, path, body, raw) -> tuple[str, dict]:
        with self.lock:
            for n, s in enumerate(self.side):
                if matches(s.get("when"), api, path, body, raw):
                    return f"side{n}", s
            if self.used < len(self.steps) and matches(self.steps[self.used].get("when"), api, path, body, raw):
                n, s = self.used, self.steps[self.used]
                s["repeat"] = s.get("repeat", 1) - 1
                if s["repeat"] <= 0:
                    self.used += 1
                return f"step{n}", s
            return "after", self.after


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "memfs-model-server/1"

    def log_message(self, *a):  # quiet: the record file says everything
        pass

    def _record(self, body, label: str, status: int) -> None:
        url = urlsplit(self.path)
        query = urlencode([(k, v) for k, v in parse_qsl(url.query) if k != "key"])
        rec = {"t": time.time(), "method": self.command, "path": url.path + ("?" + query if query else ""),
               "headers": {k.lower(): v for k, v in self.headers.items() if k.lower() not in SECRET_HEADERS},
               "body": body, "answer": label, "status": status}
        with self.server.record_lock, open(self.server.record, "a") as f:
            f.write(json.dumps(rec) + "\n")

    def _send(self, status: int, ctype: str, data: bytes, rid: str | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.send_header("request-id", rid or _id("req"))
        if ctype == "text/event-stream":
            self.send_header("Cache-Control", "no-cache")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def _probe(self) -> None:  # HEAD / GET probes (Claude Code's connectivity check, model lists)
        path = urlsplit(self.path).path
        data = json.dumps({"data": [], "models": [], "object": "list"}).encode()
        status = 200 if path.rstrip("/") in ("", "/v1", "/v1/models", "/v1beta/models") else 404
        self._record(None, "probe", status)
        self._send(status, "application/json", data if status == 200 else b'{"error":"not found"}')

    do_HEAD = do_GET = _probe

    def do_POST(self):
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = raw.decode("utf-8", "replace")
        path = urlsplit(self.path).path
        api = api_of(path)
        if api is None:
            self._record(body, "unknown", 404)
            return self._send(404, "application/json", b'{"error":{"message":"not found"}}')
        if path.endswith("/count_tokens"):
            self._record(body, "count_tokens", 200)
            return self._send(200, "application/json", b'{"input_tokens": 100}')
        label, step = self.server.script.take(api, path, body, raw)
        if step.get("hang"):  # recorded first, so that a test sees the request arrive
            self._record(body, label, 0)
            self.server.hung.wait(float(step["hang"]))  # (set when the server stops)
            self.close_connection = True
            return None
        if "error" in step:
            err = step["error"] if isinstance(step["error"], dict) else {"status": step["error"]}
            status = err.get("status", 500)
            doc = {"anthropic": anthropic_error, "openai": openai_error, "chat": openai_error,
                   "gemini": gemini_error}[api](status, err)
            self._record(body, label, status)
            return self._send(status, "application/json", json.dumps(doc).encode(), doc.get("request_id"))
        body_d = body if isinstance(body, dict) else {}
        if api == "anthropic":
            ctype, data = anthropic_reply(step, body_d)
        elif api == "openai":
            ctype, data = openai_reply(step, body_d)
        elif api == "chat":
            ctype, data = chat_reply(step, body_d)
        else:
            ctype, data = gemini_reply(step, body_d, path)
        self._record(body, label, 200)
        self._send(200, ctype, data)


def serve(script: dict, record: Path, port: int = 0, port_file: Path | None = None) -> None:
    httpd = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    httpd.daemon_threads = True
    httpd.script, httpd.record, httpd.record_lock = Script(script), record, threading.Lock()
    httpd.hung = threading.Event()
    record.touch()
    port = httpd.server_address[1]
    if port_file:
        tmp = port_file.with_name(port_file.name + ".tmp")
        tmp.write_text(f"{port}\n")
        tmp.rename(port_file)  # appears whole
    print(f"model_server: listening on http://127.0.0.1:{port}", flush=True)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    httpd.serve_forever()


class ModelServer:
    """``with ModelServer(script, record_path) as srv:`` — the server in a subprocess; ``srv.url``,
    ``srv.requests()``; stopped (by pid) on exit, whatever happened."""

    def __init__(self, script: dict, record: Path, timeout: float = 15):
        self.script, self.record, self.timeout = script, Path(record), timeout
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> ModelServer:
        base = self.record.with_suffix("")
        script_file, port_file = base.with_name(base.name + ".script.json"), base.with_name(base.name + ".port")
        script_file.write_text(json.dumps(self.script, indent=1))
        port_file.unlink(missing_ok=True)
        self.log = base.with_name(base.name + ".server.log")
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, __file__, "--script", str(script_file), "--record", str(self.record),
                 "--port", "0", "--port-file", str(port_file)], stdin=subprocess.DEVNULL, stdout=log, stderr=log)
        deadline = time.monotonic() + self.timeout
        while not port_file.exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"model server did not start:\n{self.log.read_text(errors='replace')}")
            time.sleep(0.02)
        self.port = int(port_file.read_text())
        self.url = f"http://127.0.0.1:{self.port}"
        return self

    def requests(self) -> list[dict]:
        return [json.loads(line) for line in self.record.read_text().splitlines() if line.strip()]

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)

    def __exit__(self, *exc) -> None:
        self.stop()


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--script", type=Path, required=True)
    ap.add_argument("--record", type=Path, required=True)
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--port-file", type=Path)
    a = ap.parse_args()
    serve(json.loads(a.script.read_text()), a.record, a.port, a.port_file)
