"""``derived/transcript.md``: the session as Markdown (SPEC §11), the export's text.

Rendered by :class:`memfs.export.markdown.Transcript`, one per view state, so a refresh after
an append renders only the segments (turns, records between turns) whose bytes changed — the
new or still open turn — and joins the others' cached text; a cap rewrite or a new opening
renders it whole again. It begins with the session's metadata, so it is one of the views
re-rendered when ``index/about.json`` changes.
"""

from __future__ import annotations

import weakref

_TRANSCRIPTS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def render(st, handle) -> bytes:
    """The bytes of ``transcript.md`` for the view state ``st`` of ``handle``'s session."""
    from memfs.export.markdown import Transcript  # (loaded on first use: the views do not need it)

    with st.lock:
        transcript = _TRANSCRIPTS.get(st)
        if transcript is None:
            transcript = _TRANSCRIPTS[st] = Transcript()
        return transcript.render(handle).encode()
