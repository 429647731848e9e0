"""Test hosts: brokers on machines of their own, made of Linux network namespaces.

``with Hosts(3) as hosts:`` makes three hosts, each a network namespace with its own address
on a private network (a ``/24`` of 10.77.0.0/16 that no other run on this machine holds), all
joined by a bridge in this machine's namespace, which has the network's first address
(``hosts.gateway``): the test process reaches every host, and a ``Proxy`` listening on the
gateway can stand on the way between two of them. ``host.prefix`` runs a command inside a host
(``ip netns exec``): ``BrokerProcess(..., host=h.address, within=h.prefix)`` is a broker on it.

Faults between hosts: ``host.down()`` / ``host.up()`` set the host's link down and up (its
connections fall silent, as when a cable is pulled), ``host.limit(bits)`` holds its link to a
rate each way (``tc`` token bucket). The kernels here have no ``netem``; delay, stalls and
partitions come from ``padres.testing.proxy``.

Nothing is left behind: leaving the block (however it is left) kills what still runs in the
hosts and deletes the namespaces, links and bridge. Their names carry the process id of the run
that made them and the set's number in it, one hex digit (namespaces ``padres-<pid>-<set>-<n>``,
links ``pd<pid>-<set>h<n>``, bridge ``pd<pid>-<set>b``), and every ``Hosts`` first sweeps away
those of runs whose process is gone. It needs root and
``ip`` (iproute2); ``unavailable()`` says why hosts cannot be made here, for a test to skip.
"""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import os
import re
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from types import TracebackType
from typing import Final

from padres.errors import HostsError

__all__ = ["Host", "Hosts", "sweep", "unavailable"]

NETWORK: Final = ipaddress.IPv4Network("10.77.0.0/16")
"""The private network the hosts of every run take a ``/24`` of."""
MOST: Final = 250
"""Hosts one ``Hosts`` makes at most (one ``/24``)."""
_LOCK: Final = "/run/lock/padres-hosts.lock"
_NAMESPACE = re.compile(r"^padres-(\d+)-[0-9a-f]-\d+$")
_LINK = re.compile(r"^pd(\d+)-[0-9a-f](?:b|h\d+)$")
_SETS = 16
"""Sets of hosts one process may hold at a time."""


def _ip(*args: str, check: bool = True) -> str:
    """Run ``ip`` (or ``tc``, given as the first argument) and return its output."""
    command = list(args) if args[0] == "tc" else ["ip", *args]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if check and done.returncode != 0:
        raise HostsError(f"{' '.join(command)}: {done.stderr.strip() or done.returncode}")
    return done.stdout


def unavailable() -> str | None:
    """Why test hosts cannot be made here (None when they can): not Linux, not root, no
    ``ip``, or namespaces refused (a container that forbids them)."""
    if not sys.platform.startswith("linux"):
        return "test hosts need Linux network namespaces"
    if os.geteuid() != 0:
        return "test hosts need root (ip netns add)"
    if shutil.which("ip") is None or shutil.which("tc") is None:
        return "test hosts need iproute2 (ip and tc)"
    probe = f"padres-{os.getpid()}-probe"  # not a name ``sweep`` knows
    try:
        _ip("netns", "add", probe)
    except HostsError as exc:
        return f"network namespaces are refused here: {exc}"
    _ip("netns", "del", probe, check=False)
    return None


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def _kill_inside(namespace: str) -> None:
    """Kill every process still running in ``namespace``."""
    for pid in _ip("netns", "pids", namespace, check=False).split():
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(pid), signal.SIGKILL)


def sweep() -> list[str]:
    """Delete the namespaces and links of runs whose process is gone (killed, say, before it
    could clean up), killing what still runs in them; returns their names."""
    swept = []
    for line in _ip("netns", "list").splitlines():
        name = line.split()[0] if line.split() else ""
        found = _NAMESPACE.match(name)
        if found and _gone(int(found.group(1))):
            _kill_inside(name)
            _ip("netns", "del", name, check=False)
            swept.append(name)
    for line in _ip("-o", "link", "show").splitlines():
        name = line.split(":")[1].strip().split("@")[0] if ":" in line else ""
        found = _LINK.match(name)
        if found and _gone(int(found.group(1))):
            _ip("link", "del", name, check=False)
            swept.append(name)
    return swept


@dataclass(frozen=True)
class Host:
    """One test host: a namespace with one address, its link a veth pair into the bridge."""

    name: str
    namespace: str
    address: str
    link: str
    """This machine's end of the host's link (the host's own end is ``eth0``)."""

    @property
    def prefix(self) -> list[str]:
        """What runs a command inside the host: put it before the command's arguments."""
        return ["ip", "netns", "exec", self.namespace]

    def run(self, *args: str) -> str:
        """Run a command inside the host; its output (``HostsError`` if it fails)."""
        done = subprocess.run([*self.prefix, *args], capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise HostsError(f"{' '.join(args)} on {self.name}: {done.stderr.strip()}")
        return done.stdout

    def down(self) -> None:
        """Set the host's link down: what is sent either way is lost, and nothing says so."""
        _ip("link", "set", self.link, "down")

    def up(self) -> None:
        _ip("link", "set", self.link, "up")

    def limit(self, bits_per_second: int) -> None:
        """Hold the host's link to ``bits_per_second`` each way (a token bucket, ``tc tbf``;
        bursts of 20 ms of it, at least 4 KiB)."""
        burst = max(4096, bits_per_second // 8 // 50)
        rule = ["root", "tbf", "rate", f"{bits_per_second}bit", "burst", str(burst)]
        rule += ["latency", "500ms"]
        _ip("tc", "qdisc", "replace", "dev", self.link, *rule)
        self.run("tc", "qdisc", "replace", "dev", "eth0", *rule)

    def unlimit(self) -> None:
        _ip("tc", "qdisc", "del", "dev", self.link, "root", check=False)
        with contextlib.suppress(HostsError):
            self.run("tc", "qdisc", "del", "dev", "eth0", "root")


class Hosts:
    """``count`` test hosts (see the module docstring); a context manager."""

    def __init__(self, count: int) -> None:
        if not 1 <= count <= MOST:
            raise HostsError(f"between 1 and {MOST} hosts, not {count}")
        self.count = count
        self.hosts: list[Host] = []
        self.gateway = ""
        """This machine's address on the hosts' network (the bridge's)."""
        self.bridge = ""
        self._run = ""

    def __getitem__(self, index: int) -> Host:
        return self.hosts[index]

    def __iter__(self) -> Iterator[Host]:
        return iter(self.hosts)

    def __len__(self) -> int:
        return len(self.hosts)

    def __enter__(self) -> Hosts:
        try:
            self._make()
        except BaseException:
            self.remove()
            raise
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.remove()

    def _make(self) -> None:
        os.makedirs(os.path.dirname(_LOCK), exist_ok=True)
        with open(_LOCK, "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # two runs must not take the same /24
            sweep()
            self._run = _free_set()
            self.bridge = f"pd{self._run}b"
            subnet = _free_subnet()
            addresses = list(subnet.hosts())
            self.gateway = str(addresses[0])
            _ip("link", "add", self.bridge, "type", "bridge")
            _ip("addr", "add", f"{self.gateway}/{subnet.prefixlen}", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")
        for n in range(self.count):
            host = Host(
                f"h{n}",
                f"padres-{self._run}-{n}",
                str(addresses[n + 1]),
                f"pd{self._run}h{n}",
            )
            self.hosts.append(host)
            _make_host(host, self.bridge, subnet.prefixlen)

    def remove(self) -> None:
        """Kill what runs in the hosts and delete them, their links and the bridge."""
        for host in self.hosts:
            _kill_inside(host.namespace)
            _ip("netns", "del", host.namespace, check=False)
            _ip("link", "del", host.link, check=False)  # gone with the namespace, usually
        self.hosts.clear()
        if self.bridge:
            _ip("link", "del", self.bridge, check=False)


def _free_set() -> str:
    """``<pid>-<set>``: this process's first set number whose bridge does not exist."""
    links = _ip("-o", "link", "show")
    for number in range(_SETS):
        run = f"{os.getpid()}-{number:x}"
        if f" pd{run}b:" not in links:
            return run
    raise HostsError(f"this process holds {_SETS} sets of test hosts already")


def _make_host(host: Host, bridge: str, prefixlen: int) -> None:
    inside = host.link.replace("h", "p")
    _ip("netns", "add", host.namespace)
    _ip("link", "add", host.link, "type", "veth", "peer", "name", inside)
    _ip("link", "set", inside, "netns", host.namespace)
    _ip("link", "set", host.link, "master", bridge, "up")
    _ip("-n", host.namespace, "link", "set", inside, "name", "eth0")
    _ip("-n", host.namespace, "addr", "add", f"{host.address}/{prefixlen}", "dev", "eth0")
    _ip("-n", host.namespace, "link", "set", "eth0", "up")
    _ip("-n", host.namespace, "link", "set", "lo", "up")


def _free_subnet() -> ipaddress.IPv4Network:
    """A ``/24`` of ``NETWORK`` that no address of this machine is in."""
    taken = [
        ipaddress.ip_interface(found).network
        for found in re.findall(r"inet (\S+)", _ip("-o", "-4", "addr", "show"))
    ]
    for subnet in NETWORK.subnets(new_prefix=24):
        if subnet.network_address.packed[2] != 0 and not any(map(subnet.overlaps, taken)):
            return subnet
    raise HostsError(f"every /24 of {NETWORK} is in use")
