"""Link figures of a (real or emulated) cluster, mpi4py only.

    mpirun -np N ... python examples/benchmarks/cluster_linkprobe.py --out link.json

* ping-pong between rank 0 and rank 1 (one-way time = half the round trip)
  for sizes 8 B .. 64 MB: the latency `alpha` (8-byte one-way time) and the
  bandwidth `beta` (bytes/s of the largest message), the two numbers of the
  alpha-beta model in cluster_scaling.py;
* `comm.Allreduce` of float32 sums at N ranks for the same sizes (what Open
  MPI's own algorithm choice gives), to check the model against.
Rank 0 prints a table and writes JSON.
"""

import argparse
import json
import socket
import time

import numpy as np
from mpi4py import MPI

SIZES = [8, 1024, 65536, 1 << 20, 8 << 20, 64 << 20]


def reps_for(nbytes: int) -> int:
    return int(min(50, max(3, (32 << 20) // max(nbytes, 1))))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out")
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    comm = MPI.COMM_WORLD
    rank, n = comm.Get_rank(), comm.Get_size()
    pingpong = {s: [] for s in SIZES}
    allreduce = {s: [] for s in SIZES}
    for _ in range(args.rounds):
        for s in SIZES:
            buf = np.zeros(s, np.uint8)
            reps = reps_for(s)
            comm.Barrier()
            t0 = time.perf_counter()
            for _ in range(reps):
                if rank == 0:
                    comm.Send(buf, dest=1, tag=1)
                    comm.Recv(buf, source=1, tag=2)
                elif rank == 1:
                    comm.Recv(buf, source=0, tag=1)
                    comm.Send(buf, dest=0, tag=2)
            one_way = (time.perf_counter() - t0) / reps / 2
            pingpong[s].append(comm.bcast(one_way, root=0))
            a = np.ones(max(1, s // 4), np.float32)
            b = np.empty_like(a)
            comm.Allreduce(a, b)
            comm.Barrier()
            t0 = time.perf_counter()
            for _ in range(reps):
                comm.Allreduce(a, b)
            mine = (time.perf_counter() - t0) / reps
            allreduce[s].append(comm.allreduce(mine, op=MPI.MAX))
    if rank == 0:
        best_pp = {s: min(v) for s, v in pingpong.items()}
        best_ar = {s: min(v) for s, v in allreduce.items()}
        alpha = best_pp[SIZES[0]]
        beta = SIZES[-1] / (best_pp[SIZES[-1]] - alpha)
        result = {
            "when": time.strftime("%Y-%m-%d %H:%M:%S"),
            "ranks": n,
            "hosts": comm.gather(socket.gethostname(), root=0),
            "alpha_s": alpha,
            "beta_bytes_per_s": beta,
            "pingpong_one_way_s": {str(s): v for s, v in pingpong.items()},
            "allreduce_s": {str(s): v for s, v in allreduce.items()},
        }
        print(
            f"{n} ranks: alpha {alpha * 1e6:.1f} us, beta {beta * 8 / 1e9:.3f} Gbit/s"
        )
        for s in SIZES:
            print(
                f"  {s:>10} B  one-way {best_pp[s] * 1e3:9.3f} ms"
                f"  allreduce {best_ar[s] * 1e3:9.3f} ms"
            )
        if args.out:
            with open(args.out, "w") as f:
                json.dump(result, f, indent=1)
    else:
        comm.gather(socket.gethostname(), root=0)


if __name__ == "__main__":
    main()
