"""Other agents' formats into this event family (SPEC §8): pure translation, then runners.

A *translator* is a small stateful object fed one source line at a time (``feed(raw)``, the
line's bytes without its newline); it returns the event lines to append (bytes, bare events
or envelopes) and raises :class:`Untranslatable` for a line it cannot read, which the caller
records in ``rejected.jsonl``. Lines that carry nothing the event family has a place for
(a Claude Code ``file-history-snapshot``, a Codex ``turn_context``) translate to nothing.
``state()`` is a small JSON-able dict from which ``restore(state)`` resumes, so
``memfs import --follow`` can stop and go on without losing or repeating a line.

Formats (``--format``): each agent's, as its folder's table lists them
(:attr:`memfs.agents.common.Shapes.formats`): ``codex`` covers Codex ``exec --json`` output
(already this event family: passed through byte for byte) and Codex rollout files; ``claude``
Claude Code ``stream-json`` output and transcripts; ``gemini`` Gemini CLI ``stream-json`` output
and chat files; ``opencode`` ``opencode run --format json`` output (OpenCode's store is a
database: :mod:`memfs.agents.opencode.read`); ``auto`` picks by the first JSON line.
No I/O happens in the translators; :mod:`memfs.ingest.record` and
:mod:`memfs.ingest.importer` (with :mod:`memfs.ingest.follow`) are the runners.
"""

from __future__ import annotations

from typing import Any

import orjson

from memfs import agents
from memfs.facts import OUTPUT_HEAD, OUTPUT_TAIL, bounded_output  # noqa: F401  (the ingest's names for them)
from memfs.store.paths import new_session_name_problem

FORMATS = ("auto", *agents.AGENTS)  # --format: auto, or an agent's formats only (its table's ``formats``)


class Untranslatable(ValueError):
    """A source line the translator cannot read (its one-line reason is ``str(exc)``)."""


class VarsState:
    """A translator whose whole resumable state is its attributes (``import --follow`` stores
    :meth:`state` and gives it back to :meth:`restore`; a key it no longer has is ignored)."""

    def state(self) -> dict:
        return dict(vars(self))

    def restore(self, state: dict) -> None:
        for key, value in state.items():
            if key in vars(self):
                setattr(self, key, value)


def parse_object(raw: bytes, fmt: str) -> dict:
    """``raw`` as a JSON object, or :class:`Untranslatable` naming the format."""
    try:
        obj = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise Untranslatable(f"{fmt}: line is not valid JSON: {exc}") from None
    if type(obj) is not dict:
        raise Untranslatable(f"{fmt}: line is not a JSON object")
    return obj


def dumps(event: dict) -> bytes:
    return orjson.dumps(event)


TOKEN_FIELDS = ("input", "cached_input", "cache_creation", "output", "reasoning")


def request_entry(model: Any, tokens: dict, at: Any = None) -> dict:
    """One model request as an entry of a close's ``requests`` (:data:`memfs.events.REQUEST`):
    its model, time and non-zero token counts, in memfs's disjoint form (``tokens`` keyed by
    :data:`TOKEN_FIELDS`: ``input`` without cache reads and writes, ``output`` with reasoning)."""
    out: dict = {}
    if isinstance(model, str) and model:
        out["model"] = model
    if isinstance(at, str) and at:
        out["at"] = at
    for key in TOKEN_FIELDS:
        value = tokens.get(key)
        if type(value) is int and value > 0:
            out[key] = value
    return out


def stamp_close(event: dict, agent: str, requests: list[dict], model: Any = None) -> dict:
    """A close with what the agent's record says of its turn (SPEC §10 "Per-turn facts"): the
    ``agent``, the ``model`` (the last request's that names one, else ``model``) and the
    ``requests``."""
    event["agent"] = agent
    named = [r["model"] for r in requests if "model" in r]
    last = named[-1] if named else model
    if isinstance(last, str) and last:
        event["model"] = last
    if requests:
        event["requests"] = requests
    return event


def text_of(value: Any) -> str:
    """The text of a message content: a string, or the ``text`` of a list of blocks."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        parts = []
        for block in value:
            if isinstance(block, str):
                parts.append(block)
            elif isinstance(block, dict) and isinstance(block.get("text"), str):
                parts.append(block["text"])
        return "\n".join(parts)
    return ""


def child_session_name(parent: str | None, child: str) -> str | None:
    """A sub-agent's session: ``<parent>.<child>`` (the parent conversation's name and the
    agent's own child id), or None when ``parent`` is not a string or that is not a valid
    ``mkdir`` name (both come from a file: untrusted)."""
    if not isinstance(parent, str) or not parent or not child:
        return None
    name = f"{parent}.{child}"
    return name if new_session_name_problem(name) is None else None


PROMPT_BYTES = 4096  # a prompt carried in ``turn.started.context.prompt`` is cut to this


def bounded_prompt(text: str) -> str:
    """A user's prompt as ``turn.started.context.prompt`` carries it: its first
    :data:`PROMPT_BYTES` UTF-8 bytes (cut on a character boundary)."""
    data = text.encode("utf-8", "surrogatepass")
    return text if len(data) <= PROMPT_BYTES else data[:PROMPT_BYTES].decode("utf-8", "ignore")


def classify(obj: dict) -> str | None:
    """Which translator reads a decoded line (its kind: ``native`` for this event family, Codex
    ``exec --json`` included, ``rollout``, ``claude``, ``gemini``, ``opencode``), by the first
    of every agent's formats whose test takes it (:func:`memfs.agents.line_formats`), or None
    when the line does not say."""
    fmt = _format_of(obj)
    return fmt.kind if fmt is not None else None


def session_id_of(obj: dict) -> str | None:
    """The thread or session id a decoded source line names, if any (its format's reader)."""
    fmt = _format_of(obj)
    return fmt.session_id(obj) if fmt is not None else None


def _format_of(obj: dict):
    return next((f for _, f in agents.line_formats() if f.test(obj)), None)


def translators() -> dict:
    """Every agent folder's translators (its ``read.TRANSLATORS``: kind → class)."""
    out: dict = {}
    for name in agents.AGENTS:
        module = agents.reader(name)
        out.update(getattr(module, "TRANSLATORS", None) or {})
    return out


def make_translator(kind: str, reader=None):
    """A fresh translator for a kind :func:`classify` names (``native``, ``rollout``, ``claude``,
    ``gemini``, ``opencode``: :func:`translators`). ``reader`` (see
    :class:`memfs.ingest.sidefiles.SideReader`) is handed to a translator that reads side files
    (``reader`` attribute: Claude Code's ``tool-results/``)."""
    translator = translators()[kind]()
    if reader is not None and hasattr(translator, "reader"):
        translator.reader = reader
    return translator


class AutoTranslator:
    """Picks the translator by the first line that says which format it is (``--format``
    ``auto``, or an agent's name: then only that agent's formats). Lines before that go through
    as native lines (the store then judges them), unless the agent's table names its ``line``:
    then they are refused."""

    def __init__(self, fmt: str = "auto", reader=None):
        if fmt not in FORMATS:
            raise ValueError(f"format must be one of {', '.join(FORMATS)}")
        self.fmt = fmt
        self.reader = reader  # side files, for the translators that read them
        self.inner: Any = None  # the format's translator (make_translator), once known

    @property
    def kind(self) -> str | None:
        return getattr(self.inner, "kind", None)

    @property
    def meta(self) -> dict:
        """What the record says of the conversation (``memfs.store.about`` keys), so far."""
        return getattr(self.inner, "meta", None) or {}

    def _choose(self, raw: bytes) -> None:
        try:
            obj = parse_object(raw, "auto")
        except Untranslatable:
            return
        kind = classify(obj)
        if kind is None:
            return
        if self.fmt != "auto" and agents.owner_of(kind) != self.fmt:
            name = next(f.name for _, f in agents.line_formats() if f.kind == kind)
            raise Untranslatable(f"--format {self.fmt}: this line is in another format ({name})")
        self.inner = make_translator(kind, self.reader)

    def feed(self, raw: bytes) -> list[bytes]:
        if self.inner is None:
            self._choose(raw)
            if self.inner is None:
                table = agents.shapes(self.fmt)
                if table is not None and table.line is not None:  # (else: judged as this family's)
                    parse_object(raw, self.fmt)  # raises for non-JSON
                    raise Untranslatable(f"{self.fmt}: not {table.line} (no known \"type\")")
                return [raw]
        return self.inner.feed(raw)

    def finish(self) -> list[bytes]:
        """At the end of a one-shot import: what closes a record that has no end-of-turn mark
        (a Gemini chat file's last turn); nothing for the other formats."""
        finish = getattr(self.inner, "finish", None)
        return finish() if finish is not None else []

    def state(self) -> dict:
        return {"kind": self.kind, "inner": self.inner.state() if self.inner is not None else None}

    def restore(self, state: dict) -> None:
        kind = state.get("kind")
        if kind:
            self.inner = make_translator(kind, self.reader)
            self.inner.restore(state.get("inner") or {})
