"""The 16-bit wire's owner's step between its two collectives: numpy or
TensorFlow, by row size (issue 40, item 3; one process, no MPI).

    python examples/benchmarks/owner_sum_cost.py --rounds 5 \\
        --out docs/benchmarks/owner_sum_cost.json

For N received 16-bit rows of C values (float16 wire), times the owner's
float32 sum and re-encode as the train step ran it before
`tf_gradients.HOST_NUMPY_MAX_ELEMENTS` (eager TensorFlow inside the
py_function: the XLA-fused stage, from a numpy array as the Alltoall leaves
it) against numpy's `wire.owner_sum` (what small host rows take now), after
checking that both give the same bits. Interleaved, `--rounds` rounds of
`--calls` calls each; microseconds per call. The machine is shared: the
JSON records the load average.
"""

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", default="2,4,8")
    p.add_argument("--values", default="256,4096,32768,262144")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--calls", type=int, default=10)
    p.add_argument("--out")
    args = p.parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import numpy as np
    import tensorflow as tf

    from keras_mpfp16.backend import tf_wire
    from keras_mpfp16.runtime.mpi import wire

    rng = np.random.default_rng(0)
    rows_out = []
    load0 = os.getloadavg()[0]
    for n in (int(r) for r in args.ranks.split(",")):
        for c in (int(v) for v in args.values.split(",")):
            scales = 10.0 ** rng.uniform(-6, 4, size=(n, 1))
            recv = wire.encode_rows(
                (rng.normal(size=(n, c)) * scales).astype(np.float32), "float16"
            )
            calls = {
                "tensorflow": lambda recv=recv: tf_wire.owner_sum(
                    tf.constant(recv), "float16", 0
                ).numpy(),
                "numpy": lambda recv=recv: wire.owner_sum(recv, "float16"),
            }
            same = bool(np.array_equal(calls["numpy"](), calls["tensorflow"]()))
            times = {k: [] for k in calls}
            for r in range(args.rounds):
                for k in calls if r % 2 == 0 else list(calls)[::-1]:
                    t0 = time.perf_counter()
                    for _ in range(args.calls):
                        calls[k]()
                    times[k].append((time.perf_counter() - t0) / args.calls * 1e6)
            med = {k: statistics.median(v) for k, v in times.items()}
            rows_out.append(
                {
                    "ranks": n,
                    "values": c,
                    "same_bits": same,
                    "us": times,
                    "median_us": med,
                }
            )
            print(
                f"N={n} C={c}: tensorflow {med['tensorflow']:.0f} us, numpy "
                f"{med['numpy']:.0f} us (same bits: {same})",
                flush=True,
            )
    out = {
        "command": " ".join(["python", *sys.argv]),
        "rounds": args.rounds,
        "calls": args.calls,
        "load": [load0, os.getloadavg()[0]],
        "rows": rows_out,
    }
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
