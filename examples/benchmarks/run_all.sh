#!/usr/bin/env bash
# Every CPU benchmark behind docs/benchmarks.md, one after another (so they do
# not compete for the cores), results in docs/benchmarks/ (or $1).
#   bash examples/benchmarks/run_all.sh [OUT_DIR]
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${1:-docs/benchmarks}
mkdir -p "$OUT"
# Anything else running skews every ratio. `nice` alone does not help: with
# the kernel's autogroup scheduling (on by default on most distributions),
# CPU time is shared fairly between *sessions*, so a niced job started from
# another terminal still takes half the machine. Lower its group instead:
#   echo 19 > /proc/<pid>/autogroup
echo "load before starting: $(cut -d' ' -f1-3 /proc/loadavg)"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 TF_CPP_MIN_LOG_LEVEL=2
for policy in float32 mixed_bfloat16; do
  python -m keras_mpfp16.benchmark overhead --policy "$policy" --rounds 7 --out "$OUT/overhead_$policy.json"
done
mpirun -np 2 --bind-to core python -m keras_mpfp16.benchmark allreduce --rounds 3 --out "$OUT/allreduce_np2.json"
python examples/benchmarks/peers.py --rounds 5 --out "$OUT/peers.json"
python examples/benchmarks/threads.py --rounds 5 --out "$OUT/threads.json"
python examples/benchmarks/comm_heavy.py --rounds 3 --out "$OUT/comm_heavy.json"
python examples/benchmarks/allreduce_scaling.py --sizes 1024,16384,262144,4194304,16777216 --out "$OUT/allreduce_scaling.json"
mpirun -np 2 --bind-to core python examples/benchmarks/loss_scale_trajectory.py --out "$OUT/loss_scale.json"
python examples/benchmarks/autogroup.py --rounds 3 --out "$OUT/autogroup.json"
python examples/benchmarks/plots.py "$OUT"
