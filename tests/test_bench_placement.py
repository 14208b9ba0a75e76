"""Placing benchmark ranks on emulated nodes (issue 40, item 5), without a
cluster: `scale_guarantees.py --nodes` checks where the ranks ran and refuses
an N the nodes cannot share evenly; `cluster_bench.run_job` passes ranks per
node to the launch and, when the nodes have their own /tmp, has rank 0 write
its JSON where the driver can read it.

The runs themselves (16 ranks on 4 nodes) need root and the machine-wide
emulated cluster: docs/scaling.md gives their commands and results."""

import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "examples" / "benchmarks"
sys.path.insert(0, str(BENCH))

import scale_guarantees  # noqa: E402
from cluster import Cluster  # noqa: E402


@pytest.fixture
def four_nodes(monkeypatch):
    # Names only: a Cluster is not brought up by constructing it.
    monkeypatch.setattr(scale_guarantees, "CLUSTER", Cluster(4, "1gbit"))


def records(hosts):
    return [{"rank": r, "host": h} for r, h in enumerate(hosts)]


def test_placement_is_checked_node_by_node(four_nodes):
    even = [f"kmpnode{1 + r // 4}" for r in range(16)]
    hosts, ok = scale_guarantees.placement(records(even), 16)
    assert ok is True
    assert hosts == {f"kmpnode{k}": 4 for k in range(1, 5)}
    # One rank on the wrong node (5 on node 1, 3 on node 4): not placed.
    uneven = even[:]
    uneven[-1] = "kmpnode1"
    assert scale_guarantees.placement(records(uneven), 16)[1] is False
    # All 16 on one machine's hostname (the launch ignored the nodes).
    assert scale_guarantees.placement(records(["box"] * 16), 16)[1] is False
    # A node missing (12 ranks on 3 nodes, the fourth never ran).
    assert scale_guarantees.placement(records(even[:12]), 16)[1] is False


def test_placement_on_one_machine_has_nothing_to_check():
    assert scale_guarantees.CLUSTER is None
    hosts, ok = scale_guarantees.placement(records(["box"] * 3), 3)
    assert (hosts, ok) == ({"box": 3}, None)


def test_uneven_ranks_per_node_is_refused_by_name(capsys):
    with pytest.raises(SystemExit) as exc:
        scale_guarantees.main(["--np", "16", "15", "--nodes", "4"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "--np 15" in err and "--nodes 4" in err and "multiple" in err
    with pytest.raises(SystemExit):
        scale_guarantees.main(["--np", "16", "--nodes", "-1"])
    assert "--nodes must be >= 0; received -1" in capsys.readouterr().err


class FakeCluster:
    """What run_job asks of a cluster; the "launch" runs one local process
    that writes the JSON at the path given after --out, as rank 0 does."""

    private_tmp = True

    def __init__(self, shared: Path):
        self.shared = shared
        self.calls = []

    def shared_dir(self, name="run"):
        d = self.shared / name
        d.mkdir()
        return d

    def mpirun_command(self, argv, nodes=None, extra=(), ranks_per_node=1):
        self.calls.append({"nodes": nodes, "ranks_per_node": ranks_per_node})
        code = (
            "import json, sys; i = sys.argv.index('--out'); "
            "open(sys.argv[i + 1], 'w').write(json.dumps({'ok': 1}))"
        )
        return [sys.executable, "-c", code, *argv[1:]]


def test_run_job_places_ranks_and_reads_rank0s_file_from_the_shared_dir(tmp_path):
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import cluster_bench

    fake = FakeCluster(tmp_path)
    job = cluster_bench.run_job(fake, 4, ["worker.py", "--x", "1"], ranks_per_node=2)
    assert job["ok"] == 1
    assert fake.calls == [{"nodes": 4, "ranks_per_node": 2}]
    # Rank 0 wrote where every node and the driver see it, not in /tmp.
    assert (tmp_path / "job" / "job.json").exists()


def test_cluster_bench_refuses_zero_ranks_per_node():
    res = subprocess.run(
        [
            sys.executable,
            str(BENCH / "cluster_bench.py"),
            "--suite",
            "main",
            "--ranks-per-node",
            "0",
            "--out",
            "unused.json",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 2
    assert "--ranks-per-node must be >= 1; received 0" in res.stderr
