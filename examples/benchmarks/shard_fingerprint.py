"""What `kmp.shard`'s same-data check costs: fingerprinting a 1 GiB array.

    python examples/benchmarks/shard_fingerprint.py [--gib 1] [--repeats 5]

`shard` makes one allgather of a small tuple per call (a few hundred bytes:
shapes, dtypes, one CRC-32); the rest of the cost is computing the
fingerprint on each rank, measured here in one process, no MPI:

- the fingerprint of a C-contiguous float32 array of `--gib` GiB (sampled:
  every k-th row, about 64 MiB read),
- the same for a non-contiguous view of that size (every other column of
  an array twice as wide: the sampled rows are copied first),
- a 64 MiB array (the largest one hashed whole),
- for comparison, a CRC-32 of every byte of the `--gib` GiB array (what a
  check of every byte would cost).

Prints the median and the range over `--repeats` runs of each.
"""

import argparse
import os
import statistics
import time
import zlib

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402

from keras_mpfp16.data.fingerprint import FULL_HASH_BYTES, fingerprint  # noqa: E402


def timed(fn, repeats):
    seconds = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        seconds.append(time.perf_counter() - start)
    return statistics.median(seconds), min(seconds), max(seconds)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gib", type=float, default=1.0)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    rows = int(args.gib * 2**30 / (256 * 4))
    x = np.random.default_rng(0).random((rows, 256), dtype=np.float32)
    wide = np.empty((rows, 512), np.float32)
    wide[:, ::2] = x
    view = wide[:, ::2]
    small = x[: FULL_HASH_BYTES // (256 * 4)]
    cases = [
        (f"fingerprint, {x.nbytes / 2**30:.2f} GiB contiguous", lambda: fingerprint(x)),
        (
            f"fingerprint, {x.nbytes / 2**30:.2f} GiB strided view",
            lambda: fingerprint(view),
        ),
        (
            f"fingerprint, {small.nbytes / 2**20:.0f} MiB (hashed whole)",
            lambda: fingerprint(small),
        ),
        (
            f"CRC-32 of every byte, {x.nbytes / 2**30:.2f} GiB",
            lambda: zlib.crc32(x.view(np.uint8).reshape(-1)),
        ),
    ]
    print(f"{args.repeats} runs each; seconds: median (min-max)")
    for name, fn in cases:
        med, lo, hi = timed(fn, args.repeats)
        print(f"  {name:45s} {med:.3f} ({lo:.3f}-{hi:.3f})")


if __name__ == "__main__":
    main()
