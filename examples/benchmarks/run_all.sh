#!/usr/bin/env bash
# Every CPU benchmark behind docs/benchmarks.md, docs/layers.md (drift and
# speed) and docs/reliability.md (exit times), one after another (so they do
# not compete for the cores), results in docs/benchmarks/ (or $1). Each line
# is the command its page shows (tests/test_docs_tables.py checks that), and
# with the default folder the pages' tables are rewritten from the new files.
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
python -m keras_mpfp16.benchmark overhead --policy float32 --rounds 8 --out "$OUT/overhead_float32.json"
python -m keras_mpfp16.benchmark overhead --policy mixed_bfloat16 --rounds 8 --out "$OUT/overhead_mixed_bfloat16.json"
mpirun -np 2 --bind-to core python -m keras_mpfp16.benchmark allreduce --rounds 3 --out "$OUT/allreduce_np2.json"
python examples/benchmarks/peers.py --rounds 5 --max-others 0.2 --retries 2 --out "$OUT/peers.json"
python examples/benchmarks/threads.py --rounds 5 --out "$OUT/threads.json"
python examples/benchmarks/comm_heavy.py --rounds 3 --out "$OUT/comm_heavy.json"
python examples/benchmarks/allreduce_scaling.py --sizes 1024,16384,262144,4194304,16777216 --out "$OUT/allreduce_scaling.json"
mpirun -np 2 --bind-to core python examples/benchmarks/loss_scale_trajectory.py --out "$OUT/loss_scale.json"
python examples/benchmarks/autogroup.py --rounds 3 --out "$OUT/autogroup.json"
python examples/benchmarks/layers_numerics.py --out "$OUT/layers_numerics.json"
python examples/benchmarks/layers_speed.py --rounds 11 --out "$OUT/layers_speed_default.json"
python examples/benchmarks/layers_speed.py --policies mixed_float16 mixed_bfloat16 --input-precisions float32 compute --recurrent-precisions float32 split compute --rounds 7 --out "$OUT/layers_speed_variants.json"
python examples/benchmarks/layers_speed.py --policies mixed_float16 mixed_bfloat16 --recurrent-precisions float32 compute --batch 64 --length 128 --features 64 --units 256 --steps 3 --rounds 9 --out "$OUT/layers_speed_256units.json"
python examples/benchmarks/fault_exit_times.py --repeat 3 --out "$OUT/fault_exit_times.json"
mpirun -np 2 --bind-to core python examples/benchmarks/state_sync.py --rounds 7 --out "$OUT/state_sync.json"
python examples/benchmarks/imdb_job.py --rounds 3 --out "$OUT/imdb_job.json"
# The emulated multi-node cluster needs root and Linux network namespaces.
if [ "$(id -u)" = 0 ] && python examples/benchmarks/cluster.py check >/dev/null; then
  python examples/benchmarks/cluster_bench.py --suite link --out "$OUT/cluster_link.json"
  python examples/benchmarks/cluster_bench.py --suite main --rounds 5 --out "$OUT/cluster_main.json"
  python examples/benchmarks/cluster_bench.py --suite overlap --rounds 5 --out "$OUT/cluster_overlap.json"
  python examples/benchmarks/cluster_bench.py --suite sparse --rounds 5 --out "$OUT/cluster_sparse.json"
  python examples/benchmarks/cluster_faults.py --repeat 2 --out "$OUT/cluster_faults.json"
  python examples/benchmarks/cluster_restart.py --repeat 3 --out "$OUT/cluster_restart.json"
  python examples/benchmarks/cluster_scaling.py --link "$OUT/cluster_link.json" --main "$OUT/cluster_main.json" --plot "$OUT/cluster_scaling.png" --out "$OUT/cluster_scaling.json"
  python examples/benchmarks/cluster_report.py "$OUT" --plot
else
  echo "skipping the emulated-cluster benchmarks (need root and network namespaces)"
fi
python examples/benchmarks/plots.py "$OUT"
if [ "$OUT" = docs/benchmarks ]; then
  python examples/benchmarks/report.py docs/benchmarks
fi
