"""What a single-node job listens on, in-process: the /proc reader the integration test uses sees every listener
and its address; a store served by trainer/launch/loopback.py listens on 127.0.0.1 only, where torch's own
TCPStore listens on every interface; the workers' environment pins gloo to the loopback interface."""

from __future__ import annotations

import os
import socket
from datetime import timedelta

import pytest

from tests.listeners import listeners_of
from trainer.launch.loopback import (
    LOOPBACK,
    WORKER_STORE,
    local_only_env,
    local_rendezvous,
    loopback_interface,
    tcp_store,
)


def mine(port: int) -> set[str]:
    return {str(ln.address) for ln in listeners_of([os.getpid()]) if ln.port == port}


def test_the_proc_reader_sees_loopback_and_wildcard_listeners():
    with socket.socket() as lo, socket.socket() as anywhere, socket.socket(socket.AF_INET6) as anywhere6:
        for sock, host in ((lo, "127.0.0.1"), (anywhere, "0.0.0.0"), (anywhere6, "::")):
            sock.bind((host, 0))
            sock.listen()
        found = {ln.port: ln for ln in listeners_of([os.getpid()])}
        assert str(found[lo.getsockname()[1]].address) == "127.0.0.1" and found[lo.getsockname()[1]].loopback
        assert str(found[anywhere.getsockname()[1]].address) == "0.0.0.0"
        assert not found[anywhere.getsockname()[1]].loopback
        assert str(found[anywhere6.getsockname()[1]].address) == "::" and not found[anywhere6.getsockname()[1]].loopback


def test_a_served_store_listens_on_loopback_only_where_torch_listens_everywhere():
    import torch.distributed as dist

    plain = dist.TCPStore(LOOPBACK, 0, None, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=10))
    assert mine(plain.port) - {"127.0.0.1"}, "torch's TCPStore now binds its host: update loopback.py and docs"
    served, args, env = local_rendezvous(port=0, timeout_s=10)
    assert mine(served.port) == {"127.0.0.1"}
    assert args == {
        "rdzv_endpoint": f"127.0.0.1:{served.port}",
        "rdzv_configs": {"is_host": False},
        "local_addr": LOOPBACK,
    }
    client = tcp_store(LOOPBACK, served.port, world_size=None, is_master=False, timeout=timedelta(seconds=10))
    client.set("k", "v")
    assert served.get("k") == b"v"
    with env:  # the workers' environment joins this store
        assert os.environ[WORKER_STORE] == args["rdzv_endpoint"]
    port = served.port
    del client, served, env
    assert not mine(port), "the store's listening socket outlived it"


def test_the_workers_environment_pins_gloo_to_loopback_and_is_restored(monkeypatch):
    monkeypatch.delenv("GLOO_SOCKET_IFNAME", raising=False)
    monkeypatch.delenv("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", raising=False)
    assert loopback_interface() == "lo"  # Linux
    monkeypatch.delenv(WORKER_STORE, raising=False)
    with local_only_env(worker_store="127.0.0.1:4242"):
        assert os.environ["GLOO_SOCKET_IFNAME"] == "lo"
        assert os.environ["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] == "1"  # no second store in the agent
        assert os.environ[WORKER_STORE] == "127.0.0.1:4242"  # the workers join the launcher's
    for key in ("GLOO_SOCKET_IFNAME", "TORCH_DISABLE_SHARE_RDZV_TCP_STORE", WORKER_STORE):
        assert key not in os.environ, key
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "eth7")  # the user's own choice stands
    with local_only_env():
        assert os.environ["GLOO_SOCKET_IFNAME"] == "eth7"


@pytest.mark.parametrize("host", ["127.0.0.1", "::1"])
def test_tcp_store_serves_any_loopback_address_from_that_address(host):
    try:
        store = tcp_store(
            host, 0, world_size=None, is_master=True, timeout=timedelta(seconds=10), wait_for_workers=False
        )
    except OSError as exc:  # no IPv6 on this host
        pytest.skip(f"cannot bind {host}: {exc}")
    assert mine(store.port) == {host}
