"""`python -m keras_mpfp16.benchmark`: numbers for your own cluster.

Run it under your launcher, e.g. `mpirun -np 8 python -m keras_mpfp16.benchmark
allreduce` or `srun python -m keras_mpfp16.benchmark train --units 512`.
Rank 0 prints a table and, with `--out`, writes JSON.

Subcommands:
  allreduce  bandwidth vs message size, every wire dtype, next to raw mpi4py
  train      samples/s of a stacked-LSTM model at the launched world size
  overhead   one process: DistributedOptimizer vs the bare optimizer
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

DEFAULTS = dict(
    timesteps=128,
    features=16,
    units=128,
    layers=2,
    batch=64,
    steps=40,
    policy="float32",
    wire_dtype="float32",
    bucket_mb=25.0,
    layer_impl="keras",
)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m keras_mpfp16.benchmark",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--out", help="write JSON results here (rank 0)")
    common.add_argument("--rounds", type=int, default=None)
    model = argparse.ArgumentParser(add_help=False)
    for key, val in DEFAULTS.items():
        model.add_argument(f"--{key.replace('_', '-')}", type=type(val), default=val)
    sub = p.add_subparsers(
        dest="what", required=True, metavar="{allreduce,train,overhead}"
    )
    ar = sub.add_parser(
        "allreduce",
        parents=[common],
        help="bandwidth vs message size, every wire dtype, next to raw mpi4py",
    )
    ar.add_argument("--sizes", help="comma-separated byte sizes")
    ar.add_argument("--no-graph", action="store_true", help="skip the tf.function path")
    tr = sub.add_parser(
        "train",
        parents=[common, model],
        help="samples/s of a stacked-LSTM model at the launched world size",
    )
    tr.add_argument("--plain", action="store_true", help="bare Keras optimizer")
    sub.add_parser(
        "overhead",
        parents=[common, model],
        help="one process: DistributedOptimizer vs the bare optimizer",
    )
    return p


def _fmt_bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024:
            return f"{n:g} {unit}"
        n /= 1024
    return f"{n:g} TiB"


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    from keras_mpfp16.runtime.mpi import world

    world.init()
    if args.what == "overhead" and world.size() > 1:
        # A one-process measurement: say so once, not once per rank.
        if world.is_root():
            print(
                "overhead measures one process (DistributedOptimizer vs the bare "
                f"optimizer); run it without mpirun (launched: {world.size()} ranks).",
                file=sys.stderr,
            )
        return 2
    cfg = {k: getattr(args, k, v) for k, v in DEFAULTS.items()}
    meta = {
        "when": time.strftime("%Y-%m-%d %H:%M:%S"),
        "host": platform.node(),
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "size": world.size(),
        "python": sys.version.split()[0],
    }
    if args.what == "allreduce":
        from keras_mpfp16.benchmark import allreduce

        sizes = [int(s) for s in args.sizes.split(",")] if args.sizes else None
        records = allreduce.run(sizes, rounds=args.rounds or 3, graph=not args.no_graph)
        result = {
            "meta": meta,
            "records": records,
            "ratios_vs_raw": allreduce.ratios(records),
        }
        if world.is_root():
            print(
                f"allreduce over {world.size()} ranks (GB/s of float32 payload; x = vs raw mpi4py)"
            )
            for row in result["ratios_vs_raw"]:
                speeds = {
                    r["variant"]: r["GBps"]
                    for r in records
                    if r["bytes"] == row["bytes"]
                }
                cells = "  ".join(
                    f"{k}={speeds[k]:.3f}" + (f" ({row[k]:.2f}x)" if k in row else "")
                    for k in speeds
                )
                print(f"{_fmt_bytes(row['bytes']):>10}  {cells}")
    elif args.what == "train":
        from keras_mpfp16.benchmark import train

        result = {
            "meta": meta,
            "config": cfg,
            **train.throughput(cfg, rounds=args.rounds or 5, plain=args.plain),
        }
        if world.is_root():
            print(
                f"{cfg['layers']}x LSTM({cfg['units']}) T={cfg['timesteps']} batch {cfg['batch']}/rank, "
                f"{cfg['policy']}, {result['params']:,} params, {world.size()} ranks: "
                f"{result['samples_per_s']:.0f} samples/s (rounds: "
                + ", ".join(f"{s:.0f}" for s in result["samples_per_s_all"])
                + ")"
            )
    else:
        from keras_mpfp16.benchmark import train

        result = {
            "meta": meta,
            "config": cfg,
            **train.one_process_overhead(cfg, rounds=args.rounds or 7),
        }
        if world.is_root():  # under mpirun, every rank measures; one prints
            print(
                f"one process, {cfg['policy']}: DistributedOptimizer / plain throughput = "
                f"{result['ratio_ours_over_plain']:.3f} (median of per-round ratios)\n"
                "  plain: "
                + ", ".join(f"{s:.0f}" for s in result["plain_samples_per_s"])
                + " samples/s\n"
                "  ours:  "
                + ", ".join(f"{s:.0f}" for s in result["ours_samples_per_s"])
                + " samples/s"
            )
    if args.out and world.is_root():
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    # Looked up after main() ran init(), so the job sees the status (a
    # `sys.exit(main())` would bind sys.exit before init wraps it).
    status = main()
    sys.exit(status)
