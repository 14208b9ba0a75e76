"""The 16-bit wire's schedules, numerically: Alltoall, ring, pipelined.

    mpirun -np N python examples/benchmarks/wire_schedule_numerics.py \\
        --out docs/benchmarks/wire_schedule_numerics_N.json

Every rank holds a synthetic gradient `g_r = c * common + noise_r` (one
million float32 values, log-uniform magnitudes over 6 decades, as layers of
a model differ): `c = 1` with noise 0.1 ("aligned": ranks' gradients agree,
partial sums grow like N) and `c = 0` ("noise": independent gradients,
partial sums grow like sqrt(N)). Each is summed by the numpy codec
(`allreduce_flat`, bit for bit the train step's codec) with
`WIRE_SCHEDULE=alltoall` and `=ring` (the ring forced for every row), and
on the pipelined schedule (`alltoall@S`: `WIRE_PIPELINE_SEGMENT=S`, for
each S of `--segments`), in float16 and bfloat16; the error is ||got - truth|| / ||truth|| against a
float64 sum. Rank 0 prints and writes the JSON.
"""

import argparse
import json

import numpy as np

import keras_mpfp16.config as config
from keras_mpfp16 import runtime
from keras_mpfp16.runtime.mpi import collectives, ring


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--elements", type=int, default=1_000_000)
    p.add_argument(
        "--segments",
        default="32000,262144",
        help="WIRE_PIPELINE_SEGMENT values to run as schedules alltoall@S",
    )
    p.add_argument("--out")
    args = p.parse_args()
    pipelined = [f"alltoall@{s}" for s in args.segments.split(",") if s]
    runtime.init()
    n, r = runtime.size(), runtime.rank()
    ring.RING_MIN_BYTES = 0  # the ring for every row when asked for
    common_rng = np.random.default_rng(0)
    magnitude = 10.0 ** common_rng.uniform(-6, 0, size=args.elements)
    common = common_rng.normal(size=args.elements) * magnitude
    noise = np.random.default_rng(1 + r).normal(size=args.elements) * magnitude
    results = {"ranks": n, "elements": args.elements, "rel_err": {}}
    for case, c, sigma in (("aligned", 1.0, 0.1), ("noise", 0.0, 1.0)):
        g = (c * common + sigma * noise).astype(np.float32)
        truth = runtime.allreduce(g.astype(np.float64), op="sum")
        for wire in ("float16", "bfloat16"):
            for schedule in ("alltoall", "ring", *pipelined):
                segment = int(schedule.partition("@")[2] or 0)
                config.set("WIRE_SCHEDULE", schedule.partition("@")[0])
                config.set("WIRE_PIPELINE_SEGMENT", segment)
                got = collectives.allreduce_flat(g, op="sum", wire_dtype=wire)
                err = float(np.linalg.norm(got - truth) / np.linalg.norm(truth))
                results["rel_err"][f"{case} {wire} {schedule}"] = err
    config.set("WIRE_SCHEDULE", "alltoall")
    config.set("WIRE_PIPELINE_SEGMENT", 0)
    if r == 0:
        for key, err in results["rel_err"].items():
            print(f"N={n} {key}: {err:.3e}")
        if args.out:
            with open(args.out, "w") as f:
                json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
