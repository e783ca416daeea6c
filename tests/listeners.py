"""The listening TCP sockets of a process tree, read from /proc (Linux): ``/proc/net/tcp`` and ``tcp6`` list every
socket in LISTEN state with its inode; ``/proc/<pid>/fd`` maps a process's descriptors to socket inodes."""

from __future__ import annotations

import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

LISTEN = "0A"


@dataclass(frozen=True)
class Listener:
    pid: int
    address: ipaddress.IPv4Address | ipaddress.IPv6Address
    port: int

    @property
    def loopback(self) -> bool:
        addr = self.address
        if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
            addr = addr.ipv4_mapped
        return addr.is_loopback

    def __str__(self) -> str:
        return f"{self.address}:{self.port} (pid {self.pid})"


def _address(field: str, *, v6: bool) -> tuple[ipaddress.IPv4Address | ipaddress.IPv6Address, int]:
    """``0100007F:1F90`` -> 127.0.0.1, 8080: the kernel prints each 32-bit word in host (little-endian) order."""
    hex_ip, hex_port = field.split(":")
    raw = bytes.fromhex(hex_ip)
    raw = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    return (ipaddress.IPv6Address(raw) if v6 else ipaddress.IPv4Address(raw)), int(hex_port, 16)


def listening_inodes() -> dict[int, tuple]:
    """inode -> (address, port) of every listening TCP socket on the machine."""
    out = {}
    for name, v6 in (("tcp", False), ("tcp6", True)):
        path = Path("/proc/net") / name
        if not path.exists():
            continue
        for line in path.read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == LISTEN:
                out[int(fields[9])] = _address(fields[1], v6=v6)
    return out


def process_tree(root: int) -> list[int]:
    """``root`` and every process below it."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo += children.get(pid, [])
    return out


def socket_inodes(pid: int) -> set[int]:
    out = set()
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:  # the process is gone
        return out
    for fd in fds:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            out.add(int(target[len("socket:[") : -1]))
    return out


def listeners_of(pids: list[int]) -> set[Listener]:
    """The listening TCP sockets these processes hold now."""
    table = listening_inodes()
    return {Listener(pid, *table[ino]) for pid in pids for ino in socket_inodes(pid) if ino in table}
