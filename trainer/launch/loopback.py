"""A job on one machine listens on loopback only: nothing it opens can be reached from another host.

Measured with torch 2.13 (docs/stack.md): the elastic agent's c10d rendezvous store (``TCPStore(...,
is_master=True)``) listens on every interface whatever host it is given, and so does the second store the
agent starts for its workers (TCPStore sharing, on a free port); gloo binds the address the host name
resolves to, a LAN address on most machines. None of them has any authentication. For a single-node job:

- the rendezvous store is served by the launching process, from a socket bound to 127.0.0.1 (TCPStore's
  ``master_listen_fd``), and the agent joins it as a client (``rdzv_configs={"is_host": False}``);
- torch's second store is switched off (``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``, its opt-out) and the
  workers join the launcher's store instead (``MESHTRAIN_WORKER_STORE``; trainer/launch/worker.py), as
  they joined the agent's: no second listener, and no free port picked now and bound later (the race
  torch's opt-out path has);
- gloo binds the loopback interface (``GLOO_SOCKET_IFNAME``, unless the user set it).

Multi-node jobs keep torch's defaults: their stores and gloo must be reachable from the other nodes.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import socket
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

LOOPBACK = "127.0.0.1"
#: host:port of the store a single-node job's workers join (the launcher's), in the workers' environment
WORKER_STORE = "MESHTRAIN_WORKER_STORE"


def loopback_interface() -> str | None:
    """The loopback interface's name (``lo`` on Linux, ``lo0`` on macOS), None if neither exists."""
    try:
        names = {name for _, name in socket.if_nameindex()}
    except OSError:
        return None
    return next((name for name in ("lo", "lo0") if name in names), None)


@contextlib.contextmanager
def local_only_env(*, worker_store: str | None = None) -> Iterator[None]:
    """The environment a single-node job's workers start with (and an in-process run uses), restored after;
    ``worker_store``: the ``host:port`` of the launcher's store, for the workers to join."""
    wanted = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
    if worker_store:
        wanted[WORKER_STORE] = worker_store
    interface = loopback_interface()
    if interface and "GLOO_SOCKET_IFNAME" not in os.environ:
        wanted["GLOO_SOCKET_IFNAME"] = interface
    saved = {key: os.environ.get(key) for key in wanted}
    os.environ.update(wanted)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def is_loopback(host: str) -> bool:
    """``host`` is a loopback address literal (127.0.0.0/8, ::1)."""
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def tcp_store(host: str, port: int, *, world_size: int | None, is_master: bool, timeout: timedelta, **kwargs: Any):
    """``torch.distributed.TCPStore``; its server, when this process hosts it at a loopback address, listens on
    that address only (TCPStore itself would listen on every interface)."""
    import torch.distributed as dist

    if not (is_master and is_loopback(host)):
        return dist.TCPStore(host, port, world_size, is_master=is_master, timeout=timeout, **kwargs)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(128)
        port = sock.getsockname()[1]
    except BaseException:
        sock.close()
        raise
    fd = sock.detach()  # the store owns the listening socket from here on and closes it with itself
    try:
        return dist.TCPStore(host, port, world_size, is_master=True, timeout=timeout, master_listen_fd=fd, **kwargs)
    except BaseException:
        os.close(fd)
        raise


def local_rendezvous(*, port: int, timeout_s: float) -> tuple[Any, dict[str, Any], contextlib.AbstractContextManager]:
    """The rendezvous store of a single-node job, served from 127.0.0.1 (``port`` 0: a free one), the
    ``LaunchConfig`` arguments that make the agent join it, and the environment its workers start with, joining this
    store (``local_only_env``, to enter around the agent). Keep the store alive while the agent runs."""
    store = tcp_store(
        LOOPBACK,
        port,
        world_size=None,
        is_master=True,
        timeout=timedelta(seconds=timeout_s),
        wait_for_workers=False,
        multi_tenant=True,
    )
    args = {"rdzv_endpoint": f"{LOOPBACK}:{store.port}", "rdzv_configs": {"is_host": False}, "local_addr": LOOPBACK}
    return store, args, local_only_env(worker_store=args["rdzv_endpoint"])
