"""Run a client CLI and record every network peer its process tree talks to that is not this host's loopback.

docs/agents.md configures each client with analytics, update checks and model-metadata downloads off; the
agent tests prove it with this watcher instead of assuming it. While the CLI runs, a thread reads the kernel's
socket tables (/proc/net/tcp, tcp6, udp, udp6) every POLL_S seconds and keeps the remote address of every
socket whose inode is held open by the CLI or one of its descendants (/proc/PID/fd). A loopback peer
(127.0.0.0/8, ::1) is the test server or the recording proxy; anything else is a connection attempt off the
machine (a connected UDP socket included: how glibc asks a DNS server). A socket that opens and closes between
two polls can be missed; a TCP connection to the internet lives for at least its handshake, longer than POLL_S.
"""

from __future__ import annotations

import ipaddress
import os
import subprocess
import threading
import time
from pathlib import Path

POLL_S = 0.02
_TABLES = ("tcp", "tcp6", "udp", "udp6")


def _descendants(root: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        # pid (comm) state ppid ...: comm may hold spaces and parentheses, so split after its last ')'.
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    found, todo = {root}, [root]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def _socket_inodes(pids: set[int]) -> set[str]:
    inodes = set()
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    return inodes


def _address(hex_address: str) -> tuple[ipaddress.IPv4Address | ipaddress.IPv6Address, int]:
    host, port = hex_address.split(":")
    raw = bytes.fromhex(host)
    # The kernel prints each 32-bit word in host (little-endian) order.
    ordered = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
    address = ipaddress.ip_address(ordered)
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address, int(port, 16)


def _remote_peers(inodes: set[str]) -> set[str]:
    peers = set()
    for table in _TABLES:
        try:
            lines = Path(f"/proc/net/{table}").read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) < 10 or fields[9] not in inodes:
                continue
            address, port = _address(fields[2])
            if address.is_unspecified or address.is_loopback:
                continue
            peers.add(f"{table} {address}:{port}")
    return peers


def run_watched(argv: list[str], env: dict[str, str], cwd: Path,
                timeout: float) -> tuple[subprocess.CompletedProcess, set[str]]:
    """Run argv (stdin closed, output captured) and return its result and the off-host peers it reached."""
    process = subprocess.Popen(argv, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               stdin=subprocess.DEVNULL)
    peers: set[str] = set()

    def watch() -> None:
        while process.poll() is None:
            peers.update(_remote_peers(_socket_inodes(_descendants(process.pid))))
            time.sleep(POLL_S)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        stdout, stderr = process.communicate()
        raise
    finally:
        watcher.join(timeout=5)
    return subprocess.CompletedProcess(argv, process.returncode, stdout, stderr), peers


class Watching:
    """Record the off-host peers of a process that runs in the background (a proxy server) while the block runs:
    `with Watching(process) as peers: ...`; peers keeps growing until the block ends."""

    def __init__(self, process: subprocess.Popen) -> None:
        self.process, self.peers, self._stop = process, set(), threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def _watch(self) -> None:
        while not self._stop.is_set() and self.process.poll() is None:
            self.peers.update(_remote_peers(_socket_inodes(_descendants(self.process.pid))))
            time.sleep(POLL_S)

    def __enter__(self) -> set[str]:
        self._thread.start()
        return self.peers

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
