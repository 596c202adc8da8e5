"""How a mount proves who it is to NATS, and keeps the proof private (SPEC §9 "Trust boundary").

:class:`Credentials` is what *both* NATS connections of a mount present — ``nats-py``'s
(:mod:`memfs.cluster.node`) and the event loop's own (:mod:`memfs.cluster.wire`) — built from
the ``[cluster]`` settings: ``user`` + ``password_file``, ``token_file``, ``creds`` (an NKey
seed file or a ``.creds`` file: user JWT and seed), ``tls_ca`` / ``tls_cert`` / ``tls_key``;
or, without those, credentials in the server URLs (``nats://user:password@host``,
``nats://token@host``). Secret files are read again at every connection (a rotated file is
used at the next one) and once when the mount starts, so that a missing or malformed file
fails the mount; the TLS files are read when the mount starts.

:func:`refusal` says whether a connection failure is the server refusing the credentials or
a failed TLS handshake — final, not worth retrying; :class:`Refused` carries that, with the
server, as one line.

Nothing secret leaves the process: :func:`memfs.cluster.redact` hides URL userinfo
(``nats://user:***@host``) in anything shown (xattrs, messages); :func:`redact_logs` does it to
every log record; :func:`hide_argv_secrets` rewrites the process's own command line
(``/proc/<pid>/cmdline``) when URLs on it carry credentials. Imports nothing of NATS (``nkeys``
only for an NKey)."""

from __future__ import annotations

import base64
import logging
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING
from urllib.parse import unquote, urlsplit

from memfs.cluster import has_userinfo, redact
from memfs.errors import MemfsError

if TYPE_CHECKING:  # (imported where TLS is used: most clusters never need it)
    import ssl

# what a NATS server answers (-ERR) when it refuses a client's credentials
_AUTH_ERRORS = ("authorization violation", "authentication expired", "authentication revoked",
                "account authentication expired")
_JWT = re.compile(rb"-{3,}BEGIN NATS USER JWT-{3,}\s*\n\s*(\S+)")
_SEED = re.compile(rb"-{3,}BEGIN USER NKEY SEED-{3,}\s*\n\s*(\S+)")


class Refused(MemfsError):
    """A NATS server refused this mount's credentials, or TLS with it failed: retrying with the
    same settings cannot help."""

    errno_name = "EACCES"


def refusal(exc: BaseException) -> str | None:
    """What a connection failure says when it is final: ``authorization failed …`` (the server's
    ``-ERR 'Authorization Violation'``) or ``TLS failed …``; None for anything else (a server
    down, a timeout: worth another try). Causes count (trio wraps a TLS error)."""
    import ssl

    seen = exc
    for _ in range(8):  # (a chain may loop)
        if isinstance(seen, ssl.SSLError):
            why = getattr(seen, "verify_message", None) or seen.reason or str(seen)
            return f"TLS failed ({why})"
        seen = seen.__cause__ or seen.__context__
        if seen is None:
            break
    text = str(exc)
    if any(e in text.lower() for e in _AUTH_ERRORS) or type(exc).__name__ == "AuthorizationError":
        said = text.strip().removeprefix("nats: ") or "'Authorization Violation'"
        return f"authorization failed (the server said {said})"
    if "tls required" in text.lower():
        return f"TLS failed (the server said {text.strip()})"
    return None


def tls_not_offered(url: str) -> str:
    """The refusal when ``tls_ca``/``tls_cert`` is set and the server at ``url`` does not ask for
    TLS: this side never speaks plain text then (a stripped or misconfigured server)."""
    return (f"TLS failed at {redact(url)} (the server does not offer TLS, and tls_ca/tls_cert is set: "
            "this side never sends credentials in plain text)")


async def check_tls_offered(servers: list[str], timeout: float) -> None:
    """Before ``nats-py`` (which speaks TLS only when a server's INFO asks for it) connects with
    TLS configured: read each reachable server's INFO and raise :class:`Refused` when one does
    not require TLS. A server that cannot be reached is left to the connection's own retries."""
    import asyncio
    import json

    for url in servers:
        parts = urlsplit(url)
        try:
            reader, writer = await asyncio.wait_for(
                asyncio.open_connection(parts.hostname, parts.port or 4222), timeout)
        except (TimeoutError, OSError):
            continue
        try:
            line = await asyncio.wait_for(reader.readline(), timeout)
        except (TimeoutError, OSError):
            continue
        finally:
            writer.close()
        if line.startswith(b"INFO "):
            try:
                info = json.loads(line[5:])
            except ValueError:
                continue
            if not info.get("tls_required"):
                raise Refused(tls_not_offered(url))


def _read(key: str, path: str) -> bytes:
    """A secret file's content, stripped; a ConfigError naming the key when unreadable or empty."""
    from memfs.config import ConfigError

    try:
        with open(path, "rb") as f:
            data = f.read().strip()
    except OSError as exc:
        raise ConfigError(f"cluster.{key}: cannot read {path}: {exc.strerror}") from None
    if not data:
        raise ConfigError(f"cluster.{key}: {path} is empty")
    return data


@dataclass(frozen=True, slots=True)
class Credentials:
    """What a mount presents to its NATS servers (:meth:`load` from a ClusterConfig)."""

    user: str | None = None
    password_file: str | None = None
    token_file: str | None = None
    creds: str | None = None
    jwt: bool = False  # ``creds`` is a .creds file (a user JWT and its seed), not a bare seed
    tls: ssl.SSLContext | None = None
    tls_ca: str | None = None
    tls_cert: str | None = None

    @classmethod
    def load(cls, config) -> Credentials:
        """Check the files ``config`` names (read once now: a bad one fails the mount with a
        one-line :class:`memfs.config.ConfigError`) and build the TLS context."""
        import ssl

        from memfs.config import ConfigError

        if config.password_file:
            _read("password_file", config.password_file)
        if config.token_file:
            _read("token_file", config.token_file)
        jwt = False
        if config.creds:
            jwt = _JWT.search(_read("creds", config.creds)) is not None
            _keypair(config.creds).wipe()
        tls = None
        if config.tls_ca or config.tls_cert:
            try:
                tls = ssl.create_default_context(cafile=config.tls_ca)  # tls_ca: that CA only; else the system's
            except (OSError, ssl.SSLError) as exc:
                raise ConfigError(f"cluster.tls_ca: cannot load {config.tls_ca}: {exc}") from None
            if config.tls_cert:
                try:
                    tls.load_cert_chain(config.tls_cert, config.tls_key)
                except (OSError, ssl.SSLError) as exc:
                    raise ConfigError(f"cluster.tls_cert/tls_key: cannot load {config.tls_cert}"
                                      f"{' and ' + config.tls_key if config.tls_key else ''}: {exc}") from None
        return cls(user=config.user, password_file=config.password_file, token_file=config.token_file,
                   creds=config.creds, jwt=jwt, tls=tls, tls_ca=config.tls_ca, tls_cert=config.tls_cert)

    def describe(self, url: str = "") -> str:
        """What was presented to ``url``, for a refusal's message (names files, never their content)."""
        if self.user:
            return f"user {self.user!r} with the password in {self.password_file}"
        if self.token_file:
            return f"the token in {self.token_file}"
        if self.creds:
            return f"the {'user JWT and ' if self.jwt else ''}NKey in {self.creds}"
        if has_userinfo(url):
            return "the credentials in the URL"
        return "no credentials given: set user and password_file, token_file or creds in [cluster]"

    def describe_tls(self, why: str = "") -> str:
        """The TLS settings a failure (``why``, from :func:`refusal`) concerns."""
        if "ALERT" in why:  # the server's alert: it refused this side's certificate (or its absence)
            return f"the server refused the client certificate {self.tls_cert or '(none: set tls_cert)'}"
        return f"trusting the CA in {self.tls_ca}" if self.tls_ca else "trusting the system's CAs"

    def nats_options(self) -> dict:
        """Keyword arguments of ``nats.connect`` (secrets read at each connection)."""
        options: dict = {}
        if self.user:
            options["user"] = self.user
            options["password"] = _reader("password_file", self.password_file)
        elif self.token_file:
            options["token"] = _reader("token_file", self.token_file)
        elif self.creds:
            options["user_credentials" if self.jwt else "nkeys_seed"] = self.creds
        if self.tls is not None:
            options["tls"] = self.tls
        return options

    def connect_fields(self, info: dict, url: str) -> dict:
        """The credentials of a ``CONNECT`` to the server at ``url`` that sent ``info``
        (its ``nonce`` signed with the NKey), as ``nats-py`` sends them."""
        if self.user:
            return {"user": self.user, "pass": _read("password_file", self.password_file).decode()}
        if self.token_file:
            return {"auth_token": _read("token_file", self.token_file).decode()}
        if self.creds:
            kp = _keypair(self.creds)
            try:
                signed = kp.sign(info.get("nonce", "").encode())
                fields = {"sig": base64.urlsafe_b64encode(signed).rstrip(b"=").decode()}
                if self.jwt:
                    fields["jwt"] = _JWT.search(_read("creds", self.creds))[1].decode()
                else:
                    fields["nkey"] = kp.public_key.decode()
            finally:
                kp.wipe()
            return fields
        parts = urlsplit(url)
        if parts.username is not None and parts.password is not None:
            return {"user": unquote(parts.username), "pass": unquote(parts.password)}
        if parts.username:
            return {"auth_token": unquote(parts.username)}
        return {}


def _reader(key: str, path: str):
    """A secret file's reader for nats-py, which retries after an ``OSError`` (and would stop
    reconnecting on anything else)."""

    def read() -> str:
        try:
            return _read(key, path).decode()
        except MemfsError as exc:
            raise OSError(str(exc)) from None

    return read


def _keypair(path: str):
    """The NKey of a seed file or a .creds file."""
    from memfs.config import ConfigError

    try:
        import nkeys
    except ImportError:
        raise MemfsError("cluster.creds needs the nkeys package: pip install 'memfs[cluster]'") from None
    data = _read("creds", path)
    found = _SEED.search(data)
    seed = found[1] if found else data
    try:
        return nkeys.from_seed(bytearray(seed))
    except Exception:
        raise ConfigError(f"cluster.creds: {path} holds no NKey seed (SU…) nor a .creds file's") from None


# --- nothing secret shown --------------------------------------------------------------------


def redact_logs() -> None:
    """Hide URL userinfo in every log record from now on (messages and tracebacks)."""
    make = logging.getLogRecordFactory()
    if getattr(make, "memfs_redacts", False):
        return

    def record(*args, **kwargs):
        rec = make(*args, **kwargs)
        try:
            message = rec.getMessage()
        except Exception:  # a bad format: logging reports it as it would
            return rec
        if "@" in message:
            rec.msg, rec.args = redact(message), None
        if rec.exc_info and not rec.exc_text:
            rec.exc_text = redact(logging.Formatter().formatException(rec.exc_info))
        return rec

    record.memfs_redacts = True  # type: ignore[attr-defined]  # (the mark checked above, on the function)
    logging.setLogRecordFactory(record)


def hide_argv_secrets() -> bool:
    """Rewrite this process's command line (``/proc/self/cmdline``, what ``ps`` shows) with URL
    userinfo hidden; True when something was hidden. A forked daemon inherits it. Linux only:
    the arguments' memory is found at ``arg_start``..``arg_end`` of ``/proc/self/stat``."""
    import ctypes

    try:
        with open("/proc/self/stat", "rb") as f:
            stat = f.read()
        with open("/proc/self/cmdline", "rb") as f:
            shown = f.read()
        fields = stat[stat.rindex(b")") + 2:].split()
        start, end = int(fields[45]), int(fields[46])  # fields 48 and 49 of proc(5)
    except (OSError, ValueError, IndexError):
        return False
    size = end - start
    if start <= 0 or size <= 0 or ctypes.string_at(start, size) != shown:
        return False
    hidden = b"\0".join(redact(a.decode(errors="surrogateescape")).encode(errors="surrogateescape")
                        for a in shown.split(b"\0"))
    if hidden == shown:
        return False
    hidden = hidden[:size - 1].ljust(size, b"\0")
    ctypes.memmove(start, hidden, size)
    return True
