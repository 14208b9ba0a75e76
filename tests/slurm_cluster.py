"""A Slurm of several nodes on the emulated cluster (examples/benchmarks/cluster.py).

One `slurmd` per emulated node, each started through the cluster's agent: in
the node's network namespace, with the node's hostname (so `slurmd` finds its
`NodeName` without `-N`), address (`NodeAddr`) and node-local `/tmp` (its
spool directory, pid file and log live there); one `slurmctld` outside the
nodes on the bridge's address (`.254`, where a login node would be), on ports
of its own (6917 / 6918) so that it never meets the single-node Slurm of
`.ci/slurm-up`. munge is this machine's (its socket is a file, seen from
every namespace). The configuration is a file of its own, named by
`SLURM_CONF` in `env()`: pass that environment to `srun`, `sbatch`,
`sinfo` and friends.

`SlurmdTimeout` is Slurm's default (300 s), as on most clusters: a cut node
stays "responding" to Slurm for minutes, which is what the restart recipe
must not wait for.

Python, as root, with examples/benchmarks on `sys.path`:

```python
with Cluster(3, private_tmp=True, prefix="kmps", subnet="10.78.9") as c:
    with SlurmNodes(c) as slurm:
        subprocess.run(["srun", "-N", "3", "hostname"], env=slurm.env())
```
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

MARK = "# written by keras-mpfp16 tests/slurm_cluster.py"
CTLD_PORT, SLURMD_PORT = 6917, 6918


def why_not() -> str | None:
    """Why a multi-node Slurm cannot be started here (None: it can)."""
    if os.geteuid() != 0:
        return "needs root (slurmctld, slurmd in network namespaces)"
    missing = [
        c
        for c in (
            "srun",
            "sbatch",
            "sinfo",
            "scontrol",
            "slurmd",
            "slurmctld",
            "munged",
        )
        if not shutil.which(c)
    ]
    if missing:
        return f"{', '.join(missing)} not found: apt-get install slurm-wlm munge libpmix-dev"
    return None


def _munge_ok() -> bool:
    return (
        subprocess.run(
            ["munge", "-n"], capture_output=True, stdin=subprocess.DEVNULL
        ).returncode
        == 0
    )


def ensure_munge() -> None:
    """Starts munged as .ci/slurm-up does, if it is not running."""
    if _munge_ok():
        return
    for d in ("/run/munge", "/var/lib/munge", "/var/log/munge", "/etc/munge"):
        os.makedirs(d, exist_ok=True)
        shutil.chown(d, "munge", "munge")
    key = Path("/etc/munge/munge.key")
    if not key.exists() or key.stat().st_size == 0:
        key.write_bytes(os.urandom(1024))
        shutil.chown(key, "munge", "munge")
        key.chmod(0o400)
    Path("/run/munge/munged.pid").unlink(missing_ok=True)
    subprocess.run(["runuser", "-u", "munge", "--", "munged"], check=True)
    for _ in range(50):
        if _munge_ok():
            return
        time.sleep(0.1)
    raise RuntimeError("munged did not start (see /var/log/munge/munged.log)")


# What the agent runs in a node: `ip netns exec` gives the node a fresh /sys
# without this machine's cgroup mounts, and slurmd 22.05 will not start
# without them (its cgroup plugin is loaded whatever ProctrackType and
# TaskPlugin say): the v1 hierarchies are mounted again in the node's own
# mount namespace (the same hierarchies, not new ones). The spool directory
# is on the node's /tmp.
_SLURMD = (
    "mkdir -p /tmp/slurmd && mount -t tmpfs cgroup /sys/fs/cgroup && "
    "for h in freezer cpuset memory devices cpu cpuacct; do "
    "mkdir -p /sys/fs/cgroup/$h && mount -t cgroup -o $h cgroup /sys/fs/cgroup/$h; done; "
    "mkdir -p /sys/fs/cgroup/systemd && "
    "mount -t cgroup -o none,name=systemd cgroup /sys/fs/cgroup/systemd && "
    "exec slurmd -f "
)


class SlurmNodes:
    """slurmctld + one slurmd per node of `cluster` (an examples/benchmarks
    Cluster that is up, with `private_tmp`). `state` holds slurm.conf, the
    controller's state and log (default: under the cluster's shared tmp)."""

    def __init__(self, cluster, state: Path | None = None, slurmd_timeout: int = 300):
        if not cluster.private_tmp:
            raise ValueError("SlurmNodes needs a Cluster with private_tmp=True.")
        self.cluster = cluster
        self.state = Path(state or cluster.tmp_root / "slurm")
        self.conf = self.state / "slurm.conf"
        self.slurmd_timeout = slurmd_timeout
        self.names = [cluster.node(k) for k in range(1, cluster.nodes + 1)]
        self._ctld: subprocess.Popen | None = None

    def env(self, extra: dict | None = None) -> dict:
        return {**os.environ, "SLURM_CONF": str(self.conf), **(extra or {})}

    def node_list(self) -> str:
        c = self.cluster
        return f"{c.prefix}[1-{c.nodes}]" if c.nodes > 1 else c.node(1)

    def _write_conf(self) -> None:
        c = self.cluster
        host = socket.gethostname().split(".")[0]
        addrs = ",".join(c.address(k) for k in range(1, c.nodes + 1))
        (self.state / "ctld").mkdir(parents=True, exist_ok=True)
        self.conf.write_text(
            f"""{MARK}
ClusterName=kmpnodes
SlurmctldHost={host}({c.subnet}.254)
SlurmctldPort={CTLD_PORT}
SlurmdPort={SLURMD_PORT}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=cred_expire=30
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
SlurmctldPidFile={self.state}/slurmctld.pid
StateSaveLocation={self.state}/ctld
SlurmctldLogFile={self.state}/slurmctld.log
SlurmdSpoolDir=/tmp/slurmd
SlurmdPidFile=/tmp/slurmd.pid
SlurmdLogFile=/tmp/slurmd.log
SlurmctldTimeout=30
SlurmdTimeout={self.slurmd_timeout}
InactiveLimit=0
KillWait=10
MinJobAge=300
JobCompType=jobcomp/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=5,bf_interval=5
NodeName={self.node_list()} NodeAddr={addrs} CPUs=1 State=UNKNOWN
PartitionName=nodes Nodes={self.node_list()} Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
"""
        )
        self.conf.chmod(0o644)

    def slurmd_log(self, k: int) -> str:
        path = self.cluster.tmp_root / "nodes" / self.cluster.node(k) / "slurmd.log"
        try:
            return path.read_text()
        except OSError:
            return ""

    def ctld_log(self) -> str:
        try:
            return (self.state / "slurmctld.log").read_text()
        except OSError:
            return ""

    def states(self) -> dict[str, str]:
        out = subprocess.run(
            ["sinfo", "-h", "-N", "-o", "%N %T"],
            capture_output=True,
            text=True,
            timeout=20,
            env=self.env(),
        ).stdout
        return dict(line.split()[:2] for line in out.splitlines() if line.strip())

    def up(self, timeout: float = 60) -> SlurmNodes:
        ensure_munge()
        self.state.mkdir(parents=True, exist_ok=True)
        self._write_conf()
        self._ctld = subprocess.Popen(
            ["slurmctld", "-D", "-f", str(self.conf)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        for k in range(1, self.cluster.nodes + 1):
            # Daemonizes inside the node (its namespaces stay with it).
            proc = subprocess.run(
                [
                    str(self.cluster.agent),
                    self.cluster.node(k),
                    _SLURMD + str(self.conf),
                ],
                capture_output=True,
                text=True,
                timeout=60,
            )
            if proc.returncode != 0:
                self.down()
                raise RuntimeError(
                    f"slurmd did not start on {self.cluster.node(k)} "
                    f"(status {proc.returncode}): {proc.stderr[-2000:]}"
                )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            states = self.states()
            if len(states) == self.cluster.nodes and all(
                s.startswith("idle") for s in states.values()
            ):
                return self
            time.sleep(0.5)
        logs = "\n".join(
            f"--- {n} slurmd.log ---\n{self.slurmd_log(k)[-1500:]}"
            for k, n in enumerate(self.names, 1)
        )
        self.down()
        raise RuntimeError(
            f"the nodes did not become idle within {timeout}s ({self.states()}):\n"
            f"--- slurmctld.log ---\n{self.ctld_log()[-2000:]}\n{logs}"
        )

    def down(self) -> None:
        """Ends every job, the slurmds (with everything else in the nodes:
        `Cluster.down` kills what the namespaces hold) and slurmctld."""
        if self._ctld:
            subprocess.run(
                ["scancel", "--full", "--signal=KILL", "--partition=nodes"],
                capture_output=True,
                timeout=30,
                env=self.env(),
            )
        self.cluster.kill_all()
        if self._ctld:
            self._ctld.terminate()
            try:
                self._ctld.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._ctld.kill()
                self._ctld.wait()
            self._ctld = None
        shutil.rmtree(self.state, ignore_errors=True)

    def __enter__(self) -> SlurmNodes:
        return self.up()

    def __exit__(self, *exc) -> None:
        self.down()
