"""Transfer schedules alone on the emulated cluster (no codec, no Keras).

    python examples/benchmarks/cluster_transfer.py --nodes 4 --rate 1gbit \\
        --out docs/benchmarks/cluster_transfer.json

Root, under `flock /tmp/netns-cluster.lock`. One rank per emulated node (each its own `/tmp`)
(`cluster.py`), Open MPI's allreduce forced to its ring as in the other
cluster suites. For 16-bit payloads of E elements per rank (the dense
benchmark model's whole gradient, 25M, and one 25 MB bucket, 6.3M), the
milliseconds (slowest rank, `--rounds` each) of moving the bytes of the
16-bit wire's two phases with:

  mpi_alltoall      Open MPI's Alltoall (the wire's first phase before
                    ring.alltoall)
  pairwise_alltoall N-1 Sendrecv steps, step k with ranks r+k and r-k: the
                    Alltoall's bytes, one partner at a time (pairs exchange
                    in step N/2 of an even N)
  linear_alltoall   every Isend/Irecv posted at once
  xor_alltoall      N-1 exchanges with rank r XOR k (power-of-two N only)
  cycle_alltoall    runtime/mpi/ring.py's alltoall (the wire's first phase
                    for rows of 1 MiB or more at 3+ ranks): no two ranks
                    send to each other in any step
  ring_rs           N-1 neighbour Sendrecv steps of one row each (the byte
                    movement of WIRE_SCHEDULE=ring; the sums left out)
  mpi_allgather     Open MPI's Allgather of one row per rank
  ring_allgather    runtime/mpi/ring.py's allgather (what the wire uses now
                    for rows of 1 MiB or more at 3+ ranks)
  allreduce_same_bytes  Open MPI's ring Allreduce of E/2 float32: the bytes
                    of Horovod's Compression.fp16 allreduce
  ring_allgather_poll   ring_allgather's moves as Isend/Irecv, waited for by
                    Testall every --poll seconds (default 0.2 ms) with a
                    sleep in between instead of MPI's spinning wait
  cycle_alltoall_poll   cycle_alltoall's moves, waited for the same way

Besides the milliseconds (`ms`), the JSON records each schedule's CPU time
(`cpu_ms`: the slowest rank's `time.process_time()`, user + system), which
shows what a rank spends waiting: MPI's wait spins for the whole transfer.
"""

import argparse
import json
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
SCHEDULES = (
    "mpi_alltoall",
    "pairwise_alltoall",
    "linear_alltoall",
    "xor_alltoall",
    "cycle_alltoall",
    "ring_rs",
    "mpi_allgather",
    "ring_allgather",
    "allreduce_same_bytes",
    "ring_allgather_poll",
    "cycle_alltoall_poll",
)


def worker(elements: int, rounds: int, out: str, poll: float) -> None:
    import numpy as np
    from mpi4py import MPI

    from keras_mpfp16.runtime.mpi import ring

    comm = MPI.COMM_WORLD
    n, r = comm.Get_size(), comm.Get_rank()
    chunk = -(-elements // n)
    send = np.random.default_rng(r).integers(0, 60000, (n, chunk), dtype=np.uint16)
    recv = np.empty_like(send)
    floats = np.ones(elements // 2, np.float32)
    floats_out = np.empty_like(floats)
    right, left = (r + 1) % n, (r - 1) % n
    row = np.empty(chunk, np.uint16)

    def pairwise_alltoall():
        recv[r] = send[r]
        for k in range(1, n):
            dst, src = (r + k) % n, (r - k) % n
            comm.Sendrecv(send[dst], dest=dst, recvbuf=recv[src], source=src)

    def linear_alltoall():
        recv[r] = send[r]
        reqs = []
        for k in range(1, n):
            dst, src = (r + k) % n, (r - k) % n
            reqs.append(comm.Irecv(recv[src], source=src))
            reqs.append(comm.Isend(send[dst], dest=dst))
        MPI.Request.Waitall(reqs)

    def xor_alltoall():
        recv[r] = send[r]
        for k in range(1, n):
            p = r ^ k
            comm.Sendrecv(send[p], dest=p, recvbuf=recv[p], source=p)

    def ring_rs():
        for s in range(n - 1):
            comm.Sendrecv(send[(r - s - 1) % n], dest=right, recvbuf=row, source=left)

    def polled(requests):
        # Experiment: wait without spinning in Open MPI's progress loop
        # (a Test every `poll` seconds, the CPU free in between).
        while not MPI.Request.Testall(requests):
            time.sleep(poll)

    def ring_allgather_poll():
        recv[r] = send[0]
        for s in range(n - 1):
            out_b, in_b = (r - s) % n, (r - s - 1) % n
            polled(
                [
                    comm.Irecv(recv[in_b], source=left, tag=7),
                    comm.Isend(send[0] if s == 0 else recv[out_b], dest=right, tag=7),
                ]
            )

    moves = ring._alltoall_moves(n, r) if n >= 3 else ()
    half = chunk // 2
    part_slice = {0: slice(0, chunk), 1: slice(0, half), 2: slice(half, chunk)}

    def cycle_alltoall_poll():
        recv[r] = send[r]
        for dest, part, src, src_part in moves:
            polled(
                [
                    comm.Irecv(recv[src, part_slice[src_part]], source=src, tag=8),
                    comm.Isend(send[dest, part_slice[part]], dest=dest, tag=8),
                ]
            )

    run = {
        "mpi_alltoall": lambda: comm.Alltoall(send, recv),
        "pairwise_alltoall": pairwise_alltoall,
        "linear_alltoall": linear_alltoall,
        "xor_alltoall": xor_alltoall,
        "cycle_alltoall": lambda: ring.alltoall(comm, send, recv, chunk * 2, 0),
        "ring_rs": ring_rs,
        "mpi_allgather": lambda: comm.Allgather(send[0], recv),
        "ring_allgather": lambda: ring.allgather(comm, send[0], recv, chunk * 2, 0),
        "allreduce_same_bytes": lambda: comm.Allreduce(floats, floats_out),
        "ring_allgather_poll": ring_allgather_poll,
        "cycle_alltoall_poll": cycle_alltoall_poll,
    }
    schedules = [k for k in SCHEDULES if k != "xor_alltoall" or n & (n - 1) == 0]
    times = {k: [] for k in schedules}  # r XOR k: a power-of-two N only
    cpu = {k: [] for k in schedules}
    for name in schedules:  # warm-up: connections opened
        run[name]()
    # The polled variants must move the same bytes as the library's schedules.
    for polled_name, name in (
        ("ring_allgather_poll", "ring_allgather"),
        ("cycle_alltoall_poll", "cycle_alltoall"),
    ):
        recv.fill(0)
        run[name]()
        want = recv.copy()
        recv.fill(0)
        run[polled_name]()
        if not np.array_equal(recv, want):
            raise AssertionError(f"{polled_name} moved other bytes than {name}")
    for _ in range(rounds):
        for name in schedules:
            comm.Barrier()
            t, c = time.perf_counter(), time.process_time()
            run[name]()
            c = time.process_time() - c
            comm.Barrier()
            times[name].append(1000 * (time.perf_counter() - t))
            cpu[name].append(1000 * comm.allreduce(c, op=MPI.MAX))
    if r == 0:
        result = {"elements": elements, "ranks": n, "ms": times, "cpu_ms": cpu}
        Path(out).write_text(json.dumps(result))


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--nodes", type=int, default=4)
    p.add_argument("--rate", default="1gbit")
    p.add_argument("--elements", default="25000000,6300000")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument(
        "--poll", type=float, default=2e-4, help="seconds between the *_poll tests"
    )
    p.add_argument("--out")
    p.add_argument("--worker", type=int, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        worker(args.worker, args.rounds, args.out, args.poll)
        return 0
    sys.path.insert(0, str(HERE.parent.parent / "tests"))
    sys.path.insert(0, str(HERE))
    from cluster import Cluster
    from cluster_bench import RING, run_job

    results = {"nodes": args.nodes, "rate": args.rate, "poll": args.poll, "runs": []}
    with Cluster(nodes=args.nodes, rate=args.rate, private_tmp=True) as c:
        for e in args.elements.split(","):
            argv = [__file__, "--worker", e, "--rounds", str(args.rounds)]
            argv += ["--poll", str(args.poll)]
            run = run_job(c, args.nodes, argv, extra=RING, timeout=900)
            run.pop("job_seconds", None)
            results["runs"].append(run)
            for name, ms in run["ms"].items():
                shown = " ".join(f"{t:.0f}" for t in ms)
                cpu = " ".join(f"{t:.0f}" for t in run["cpu_ms"][name])
                print(
                    f"{args.nodes} nodes {args.rate} E={e} {name}: {shown} (cpu {cpu})"
                )
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
