"""Cluster mode's trust boundary (SPEC §9): what a host takes from the stream, checked first.

Anyone who can publish on the stream's subjects can write memory. Nothing they publish may
make a host touch a path outside its store, count a write that is not in the stream, or hold
its follower on one message (:mod:`memfs.cluster.node` applies these):

* a session name taken from a subject is validated as ``mkdir`` validates one
  (:func:`memfs.store.paths.new_session_name_problem`: sanitized form, no leading ``-``, at
  most 255 bytes) before it reaches a path; a message that fails is skipped and logged with
  its stream sequence;
* a publish's acknowledgement is a success only when it names a new message of this
  session's subject after the fence (:func:`ack_problem`); a duplicate ack counts only when
  the message stored at its sequence is this very publish (:func:`is_this_publish`: a retry
  of our own whose first ack was lost) — else the line is published again under a new
  ``Nats-Msg-Id``, still fenced;
* the host id in ``Nats-Msg-Id`` is unique per daemon start (:func:`new_host_id`);
* a line longer than the servers take with its headers (:func:`line_limit`) is refused at
  ``write()`` with ``EFBIG``, nothing of it published;
* a line the follower cannot apply — invalid here, or of a session whose history here differs
  from the stream's (:class:`Diverged`) — goes to that session's ``rejected.jsonl`` with its
  stream sequence, and the follower moves past it.
"""

from __future__ import annotations

import os
import socket

from memfs.errors import ValidationError

# bytes of a message kept from the line: its headers (fence, Nats-Msg-Id, batch ids) take under
# 1 KiB; the rest makes the kernel's first piece of a longer write() — up to 256 pages of the
# writer's buffer, at least 1 MiB less 4095 bytes — already cross the limit with the default
# max_payload (1 MiB), so that write() is refused (EFBIG), not answered with a short count
HEADER_ROOM = 8192
MESSAGE_TOO_BIG = 10054  # JetStream: the message is over the stream's max_msg_size


class Diverged(ValidationError):
    """A stream line of a session whose local history differs from the stream's: not applied."""

    errno_name = "EEXIST"


def new_host_id() -> str:
    """``<hostname>.<pid>.<random>``: the host id of this daemon start. The hostname and pid
    say which daemon it is; the random part keeps two daemons apart that share both (two
    containers, each its own PID namespace) and a restarted one from its previous start."""
    return f"{socket.gethostname()}.{os.getpid()}.{os.urandom(4).hex()}"


def line_limit(max_payload: int, max_msg_size: int | None) -> int:
    """The longest line a host publishes: the server's ``max_payload`` (and the stream's
    ``max_msg_size`` when set: both count the headers too) less :data:`HEADER_ROOM`."""
    limit = max_payload
    if max_msg_size is not None and max_msg_size > 0:
        limit = min(limit, max_msg_size)
    return max(0, limit - HEADER_ROOM)


def ack_problem(ack: dict, stream: str, fence: int, batch: str | None = None, count: int = 1) -> str | None:
    """Why JetStream's reply ``ack`` (as JSON) to a publish fenced at ``fence`` — of one line,
    or of atomic batch ``batch`` of ``count`` lines — does not say that it stored it as new
    messages of the publish's subject; None when it does."""
    if "error" in ack:
        return f"refused: {ack['error']}"
    seq = ack.get("seq")
    if ack.get("stream") != stream or not isinstance(seq, int):
        return f"not an acknowledgement of stream {stream}"
    if ack.get("duplicate"):
        return f"a duplicate of stream message {seq}"
    if batch is not None and (ack.get("batch") != batch or ack.get("count") != count):
        return f"not batch {batch} of {count} ({ack.get('batch')!r}, {ack.get('count')!r})"
    if seq - count < fence:
        return f"stream sequence {seq} is not after the fence {fence}"
    return None


def is_this_publish(msg, subject: str, line: bytes, msg_id: str, fence: int) -> bool:
    """Whether ``msg`` (the stream's message at a duplicate ack's sequence, None when gone) is
    the publish of ``line`` on ``subject`` under ``msg_id`` fenced at ``fence``."""
    return (msg is not None and msg.subject == subject and msg.seq > fence and bytes(msg.data) == line
            and (msg.headers or {}).get("Nats-Msg-Id") == msg_id)
