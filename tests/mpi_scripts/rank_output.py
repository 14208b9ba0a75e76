"""Output on ranks other than 0 (issue 19, item 8).

Run as `mpirun -np N python rank_output.py MODE` with MODE `default`
(nothing requested), `env` (launched with KERAS_MPFP16_ROOT_STDOUT_ONLY=1)
or `call` (`kmp.root_stdout_only()` half-way). Every rank prints lines
tagged with its rank to stdout (Python's print, a raw write to file
descriptor 1, a subprocess) and to stderr; `kmp.print_once` prints once.
"""

import os
import subprocess
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras_mpfp16 as kmp  # noqa: E402

mode = sys.argv[1]
rank = kmp.rank()

print(f"BEFORE print rank {rank}", flush=True)
if mode == "call":
    kmp.root_stdout_only()
print(f"AFTER print rank {rank}", flush=True)
os.write(1, f"AFTER fd1 rank {rank}\n".encode())
subprocess.run(["echo", f"AFTER subprocess rank {rank}"], check=True)
print(f"AFTER stderr rank {rank}", file=sys.stderr, flush=True)
kmp.print_once(f"ONCE from rank {rank}", flush=True)
kmp.barrier()
