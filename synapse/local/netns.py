"""Masters of a local cluster in private network namespaces, so the network between them can be cut.

On loopback every replica's traffic comes from 127.0.0.1 (pysyncobj does not bind its outgoing
sockets), so no rule can tell one master's packets from another's. Here each master runs in its
own namespace with its own address on a private bridge:

    root namespace: bridge <br> 10.211.K.254/24   (workers, clients, synctl)
    namespace <tag>m1: eth0 10.211.K.1/24          (master m1 binds its Raft and API ports here)
    namespace <tag>m2: eth0 10.211.K.2/24          ...

Cutting a master off from its peers is a routing change inside its namespace: a blackhole route
per peer address. Its packets to the peers vanish (and so do its replies to theirs), while
clients and workers, which reach it from the bridge address, still do. Needs root and `ip`
(iproute2); `unavailable()` says why not, so callers can skip with that message.

Every name carries the network's random tag. A caller that passes a ledger file to `create` has
the tag written there before anything is built, so `sweep(ledger)` can remove whatever a run that
was killed part-way left (namespaces, the bridge, veth ends), even before cluster.json names it.
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SUBNET_PREFIX = "10.211"


class Unavailable(RuntimeError):
    """Private networks cannot be built on this machine; the message says why."""


def unavailable() -> str:
    """'' when namespaces can be made here, else why not (tried for real: a namespace, a veth pair
    and a bridge, removed again)."""
    try:
        MasterNet.create(["probe"]).destroy()
    except Unavailable as exc:
        return str(exc)
    return ""


def _ip(*args: str, check: bool = True) -> str:
    proc = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=10)
    if check and proc.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {proc.stderr.strip() or proc.returncode}")
    return proc.stdout


def _free_subnet() -> int:
    used = {int(m) for m in re.findall(rf"{re.escape(SUBNET_PREFIX)}\.(\d+)\.", _ip("-4", "route", "show"))}
    for k in range(200, 255):
        if k not in used:
            return k
    raise RuntimeError(f"no free {SUBNET_PREFIX}.K.0/24 subnet between K=200 and K=254")


@dataclass
class MasterNet:
    """The bridge and one namespace per master; `to_dict` / `from_dict` keep it in cluster.json."""

    tag: str
    subnet: int
    replicas: list[str]

    @classmethod
    def create(cls, replicas: list[str], ledger: Path | None = None) -> MasterNet:
        """Build the bridge and the namespaces; raises Unavailable (and leaves nothing) if it cannot.
        With `ledger`, the network's tag is appended to that file first (see `sweep`)."""
        if os.geteuid() != 0:
            raise Unavailable("network namespaces need root (run the partition nemesis as root)")
        if shutil.which("ip") is None:
            raise Unavailable("the `ip` command (iproute2) is not installed")
        tag = secrets.token_hex(3)
        if ledger is not None:
            with open(ledger, "a") as f:
                f.write(tag + "\n")
        try:
            return cls._build(tag, replicas)
        except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
            raise Unavailable(f"cannot build a private network here: {exc}") from exc

    @classmethod
    def _build(cls, tag: str, replicas: list[str]) -> MasterNet:
        net = cls(tag=tag, subnet=_free_subnet(), replicas=list(replicas))
        try:
            _ip("link", "add", net.bridge, "type", "bridge")
            _ip("addr", "add", f"{net.gateway}/24", "dev", net.bridge)
            _ip("link", "set", net.bridge, "up")
            for i, replica in enumerate(net.replicas):
                ns, veth = net.namespace(replica), f"synv{net.tag}{i}"
                _ip("netns", "add", ns)
                _ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
                _ip("link", "set", veth, "master", net.bridge)
                _ip("link", "set", veth, "up")
                _ip("-n", ns, "addr", "add", f"{net.address(replica)}/24", "dev", "eth0")
                _ip("-n", ns, "link", "set", "eth0", "up")
                _ip("-n", ns, "link", "set", "lo", "up")
        except BaseException:
            net.destroy()
            raise
        return net

    @property
    def bridge(self) -> str:
        return f"synbr{self.tag}"

    @property
    def gateway(self) -> str:
        """The root namespace's address on the bridge: where clients and workers come from."""
        return f"{SUBNET_PREFIX}.{self.subnet}.254"

    def namespace(self, replica: str) -> str:
        return f"syn{self.tag}{replica}"

    def address(self, replica: str) -> str:
        return f"{SUBNET_PREFIX}.{self.subnet}.{self.replicas.index(replica) + 1}"

    def command(self, replica: str, argv: list[str]) -> list[str]:
        """`argv` run inside the replica's namespace (ip netns exec execs it: the pid is argv's)."""
        return ["ip", "netns", "exec", self.namespace(replica), *argv]

    def peers(self, replica: str) -> list[str]:
        return [self.address(r) for r in self.replicas if r != replica]

    def isolate(self, replica: str) -> None:
        """Cut `replica` off from every other master; clients and workers still reach it."""
        for peer in self.peers(replica):
            _ip("-n", self.namespace(replica), "route", "replace", "blackhole", f"{peer}/32")

    def isolated(self, replica: str) -> bool:
        routes = _ip("-n", self.namespace(replica), "route", "show", "type", "blackhole", check=False)
        return any(peer in routes for peer in self.peers(replica))

    def heal(self, replica: str | None = None) -> None:
        """Undo `isolate` for one replica, or for all."""
        for r in [replica] if replica else self.replicas:
            for peer in self.peers(r):
                _ip("-n", self.namespace(r), "route", "del", "blackhole", f"{peer}/32", check=False)

    def destroy(self) -> None:
        """Remove the namespaces (their veth pairs go with them) and the bridge; idempotent."""
        for replica in self.replicas:
            _ip("netns", "del", self.namespace(replica), check=False)
        _ip("link", "del", self.bridge, check=False)

    @staticmethod
    def leftovers(tags: list[str]) -> list[str]:
        """Namespaces, bridges and veth ends that exist now and carry one of `tags`."""
        if not tags or shutil.which("ip") is None:
            return []
        names = [line.split()[0] for line in _ip("netns", "list", check=False).splitlines() if line.strip()]
        names += [line.split(":")[1].strip().split("@")[0]
                  for line in _ip("-o", "link", "show", check=False).splitlines() if line.count(":") >= 2]
        prefixes = tuple(p for tag in tags for p in (f"syn{tag}", f"synbr{tag}", f"synv{tag}"))
        return sorted({n for n in names if n.startswith(prefixes)})

    @staticmethod
    def sweep(ledger: Path) -> list[str]:
        """Remove every namespace, bridge and veth of the networks a ledger names; returns what it
        removed. Idempotent; stop the processes inside the namespaces first, or they keep them."""
        try:
            tags = [t for t in ledger.read_text().split() if re.fullmatch(r"[0-9a-f]{6}", t)]
        except OSError:
            return []
        found = MasterNet.leftovers(tags)
        namespaces = set(_ip("netns", "list", check=False).split())
        for name in found:
            if name in namespaces:
                _ip("netns", "del", name, check=False)
            else:
                _ip("link", "del", name, check=False)
        return found

    def to_dict(self) -> dict[str, Any]:
        return {"tag": self.tag, "subnet": self.subnet, "replicas": self.replicas}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> MasterNet:
        return cls(tag=data["tag"], subnet=int(data["subnet"]), replicas=list(data["replicas"]))
