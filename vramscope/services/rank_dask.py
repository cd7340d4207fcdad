"""`vramscope ranks DIR --dask ADDRESS`: the analyses on an existing Dask cluster.

Before any work, the address is checked, so that every bad one is one line and a usage
error within seconds (an HTTP port answers nothing a Dask client understands, and a client
waits on it for minutes; a proxy's "HTTP/1.1 400" read as a Dask frame's length asked for
3 EiB):

* its form: `tcp://HOST:PORT` (a bare `HOST:PORT` is tcp, as in Dask) or `tls://HOST:PORT`;
  any other scheme, or no port, is refused with what is expected;
* `tls://` needs Dask's own TLS settings (`distributed.comm.tls.ca-file`, `.client.cert`,
  `.client.key` in the Dask configuration, or their DASK_DISTRIBUTED__COMM__TLS__...
  environment variables): without them it is refused with that said;
* the scheduler's handshake: a scheduler speaks first on a new connection (distributed's
  comm/core.py `Listener.on_connection` writes its handshake, then reads the peer's): one
  framed message (an 8-byte length, the frame count, each frame's length; comm/tcp.py
  `read`, protocol/utils.py `pack_frames_prelude`) whose first frame is a msgpack map.
  Whatever does not send that within HANDSHAKE_S of connecting is not a Dask scheduler
  (an HTTP server sends nothing until asked; a proxy sends HTTP), and is refused with what
  it did; whatever does is then asked its `identity` over Dask's own comm, so that a
  worker's or a nanny's address (they speak the same protocol) is refused too. Name
  lookup, connection, handshake and identity all run within that deadline, in a thread of
  their own.

The files are sent to the workers as absolute, resolved paths (os.path.realpath), not as
their bytes: a worker resolves a relative path in its own working directory, and a folder
of ranks is gigabytes, which belong on a file system the workers share, not in the
scheduler's messages. So the files must be at the same absolute path on the workers (a
shared file system); the results name the files as the folder given names them, as with
`--jobs`. Each worker writes its rank cache records where its own VRAMSCOPE_CACHE_DIR says.
"""
from __future__ import annotations

import dataclasses
import os
import re
import socket
import ssl
import struct
import threading
import time
from typing import Any

from ..parsers import Progress
from .rank_read import RankRead, RanksError, read_rank

HANDSHAKE_S = 5.0               # name lookup, connection and the scheduler's first message
CLIENT_S = 5                    # the client's own connection, once the scheduler answered
MAX_HANDSHAKE_BYTES = 1 << 20   # a scheduler's handshake is tens of bytes
_ADDRESS = re.compile(r"^(?:(?P<scheme>[a-z][a-z0-9+.-]*)://)?(?P<host>\[[0-9a-fA-F:.]+\]|[^:/\s\[\]]+):(?P<port>\d{1,5})$",
                      re.IGNORECASE)


def check_address(address: str) -> tuple[str, str, int, dict[str, Any]]:
    """(the address as Dask takes it, host, port, Dask's connection arguments: the TLS
    context for tls://) or RanksError saying what is expected (see the module docstring)."""
    m = _ADDRESS.match(address.strip())
    if m is None:
        raise RanksError(f"--dask {address!r}: expected a scheduler address such as tcp://HOST:8786 "
                         f"(or tls://HOST:PORT)")
    scheme = (m["scheme"] or "tcp").lower()
    host, port = m["host"].strip("[]"), int(m["port"])
    if scheme not in ("tcp", "tls"):
        raise RanksError(f"--dask {address!r}: the scheme {scheme}:// is not one vramscope connects with (tcp:// "
                         f"or tls://; an http:// address is the dashboard's, the scheduler's is tcp://HOST:8786)")
    if not 0 < port < 65536:
        raise RanksError(f"--dask {address!r}: {port} is not a port number")
    args: dict[str, Any] = {}
    if scheme == "tls":
        from distributed.security import Security
        try:
            args = Security().get_connection_args("client")
        except Exception as e:  # noqa: BLE001 - a TLS configuration that cannot be used, said in one line
            raise RanksError(f"--dask {address}: Dask's TLS settings cannot be used: {_one_line(e)}") from None
        if args.get("ssl_context") is None:
            raise RanksError(f"--dask {address}: tls:// needs Dask's TLS settings (distributed.comm.tls.ca-file, "
                             f"distributed.comm.tls.client.cert and .client.key in the Dask configuration, or the "
                             f"DASK_DISTRIBUTED__COMM__TLS__* environment variables); none are set")
    return f"{scheme}://{m['host']}:{port}", host, port, args


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split()) or type(e).__name__


def _recv(sock: socket.socket, n: int, deadline: float) -> bytes:
    out = b""
    while len(out) < n:
        sock.settimeout(max(0.01, deadline - time.monotonic()))
        chunk = sock.recv(min(n - len(out), 1 << 16))
        if not chunk:
            raise ConnectionError("it closed the connection")
        out += chunk
    return out


class _NoConnection(Exception):
    """The connection itself was not made within the deadline (a host that is down, a
    firewall that drops the packets)."""


class _NoIdentity(Exception):
    """It sent Dask's handshake, and then no answer to `identity` (or a broken one)."""


def _handshake(host: str, port: int, context: ssl.SSLContext | None, deadline: float) -> None:
    """Connect and read the scheduler's first message (module docstring); raises OSError
    (socket.timeout: connected, and nothing came), _NoConnection or ValueError saying what
    came instead."""
    try:
        raw = socket.create_connection((host, port), timeout=max(0.01, deadline - time.monotonic()))
    except socket.timeout:
        raise _NoConnection() from None
    with raw:
        sock = context.wrap_socket(raw, server_hostname=host) if context is not None else raw
        head = _recv(sock, 8, deadline)
        (total,) = struct.unpack("=Q", head)
        if not 16 <= total <= MAX_HANDSHAKE_BYTES:
            raise ValueError(f"it sent {head!r}, not a Dask message")
        body = _recv(sock, total, deadline)
        (frames,) = struct.unpack_from("=Q", body)
        if not 1 <= frames <= 64 or 8 * (frames + 1) > total:
            raise ValueError("its first message is not a Dask message")
        (first,) = struct.unpack_from("=Q", body, 8)
        start = 8 * (frames + 1)
        import msgpack
        try:
            hello = msgpack.loads(body[start:start + first], raw=False, strict_map_key=False)
        except Exception:  # noqa: BLE001 - whatever it is, it is not Dask's handshake
            hello = None
        if not isinstance(hello, dict):
            raise ValueError("its first message is not a Dask handshake")


def _identity(address: str, args: dict[str, Any], deadline: float) -> str:
    """What the Dask server at `address` says it is ("Scheduler", "Worker", "Nanny"): its
    `identity` reply, over Dask's own comm, within the deadline."""
    import asyncio

    from distributed.comm import connect

    async def ask() -> Any:
        comm = await connect(address, timeout=max(0.01, deadline - time.monotonic()), **args)
        try:
            await comm.write({"op": "identity", "reply": True})
            return await comm.read()
        finally:
            comm.abort()
    reply = asyncio.run(asyncio.wait_for(ask(), max(0.01, deadline - time.monotonic())))
    return str(reply.get("type")) if isinstance(reply, dict) else "?"


def probe(address: str) -> str:
    """The checked address (see `check_address`) once a Dask scheduler answered on it;
    RanksError in one line otherwise, within HANDSHAKE_S."""
    dask_address, host, port, args = check_address(address)
    outcome: list[BaseException | str] = []

    def attempt() -> None:
        deadline = time.monotonic() + HANDSHAKE_S
        try:
            _handshake(host, port, args.get("ssl_context"), deadline)   # it speaks Dask
        except BaseException as e:  # noqa: BLE001 - reported by the caller
            outcome.append(e)
            return
        try:
            outcome.append(_identity(dask_address, args, deadline))     # and is the scheduler
        except BaseException as e:  # noqa: BLE001 - reported by the caller
            outcome.append(_NoIdentity(e))

    # a thread of its own, so that a name lookup that hangs cannot hold the command: the
    # deadline is ours (a daemon thread does not keep the process alive)
    t = threading.Thread(target=attempt, name="vramscope-dask-probe", daemon=True)
    t.start()
    t.join(HANDSHAKE_S + 1)
    if not outcome:
        raise RanksError(f"no Dask scheduler at {dask_address}: nothing answered within {HANDSHAKE_S:g} s")
    e = outcome[0]
    if e == "Scheduler":
        return dask_address
    if isinstance(e, str):
        why = (f"it is a Dask {e.lower()}'s address, not the scheduler's" if e in ("Worker", "Nanny")
               else "it speaks Dask's protocol but does not say it is a scheduler")
    elif isinstance(e, _NoIdentity):
        cause = e.args[0]
        why = ("it sent Dask's handshake, then no answer to `identity` within "
               f"{HANDSHAKE_S:g} s" if isinstance(cause, TimeoutError) else
               f"it sent Dask's handshake, then failed to say what it is ({_one_line(cause)})")
    elif isinstance(e, _NoConnection):
        why = f"no answer to a connection within {HANDSHAKE_S:g} s (a host that is down, or a firewall)"
    elif isinstance(e, (socket.timeout, TimeoutError)):
        why = (f"it accepted the connection but sent no Dask handshake within {HANDSHAKE_S:g} s (an HTTP port, such "
               f"as the dashboard's? the scheduler listens on tcp://HOST:8786 by default)")
    elif isinstance(e, socket.gaierror):
        why = f"the name {host!r} is not known ({e.strerror or e})"
    elif isinstance(e, ssl.SSLError):
        why = f"the TLS handshake failed ({_one_line(e)})"
    elif isinstance(e, OSError):
        why = f"cannot connect: {e.strerror or _one_line(e)}"
    else:
        why = _one_line(e)
    raise RanksError(f"no Dask scheduler at {dask_address}: {why}")


def usable(address: str) -> str:
    """The address as Dask takes it, once Dask is installed and a scheduler answered on it
    (`probe`); RanksError otherwise. `read_ranks` asks before it lists a file."""
    try:
        import distributed  # noqa: F401
    except ImportError:
        raise RanksError("--dask needs dask.distributed: pip install 'vramscope[dask]'") from None
    return probe(address)


def on_dask(paths: list[str], rules_path: str | None, use_cache: bool, address: str,
            progress: Progress, checked: bool = False) -> list[RankRead]:
    """`read_rank` of every path on the Dask scheduler at `address` (see the module
    docstring), in order. Raises RanksError for an address that cannot be used (`checked`:
    `usable` said it can, just now)."""
    dask_address = address if checked else usable(address)
    from distributed import Client
    absolute = [os.path.realpath(p) for p in paths]
    try:
        client = Client(dask_address, timeout=CLIENT_S, set_as_default=False)
    except Exception as e:  # noqa: BLE001 - it answered as a scheduler, then the client failed
        raise RanksError(f"cannot use the Dask scheduler at {dask_address}: {_one_line(e)}") from None
    futures: list[Any] = []
    try:
        # each file is a task of its own (pure=False: read it again if asked again)
        futures = client.map(read_rank, absolute, rules_path=rules_path, use_cache=use_cache, pure=False)
        pending = set(range(len(futures)))
        while pending:
            done = {k for k in pending if futures[k].done()}
            pending -= done
            progress.update((len(paths) - len(pending)) * progress.total / len(paths))
            if pending and not done:
                time.sleep(0.05)
        reads = client.gather(futures)
    except BaseException:
        if futures:
            client.cancel(futures)
        raise
    finally:
        client.close(timeout=CLIENT_S)
    # the files as the folder given names them (as --jobs does)
    return [dataclasses.replace(rd, path=p) for rd, p in zip(reads, paths)]


__all__ = ["check_address", "probe", "usable", "on_dask", "HANDSHAKE_S"]
