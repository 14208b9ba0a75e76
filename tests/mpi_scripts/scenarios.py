"""Several scripts of this folder, one after another, in one job: the
checks of a test file that each need a job of their own at the same size
share its start-up (mpirun, Python, TensorFlow, MPI) instead.

`mpirun -np N python scenarios.py OUT_DIR SPEC` where SPEC is JSON:
`[{"name": NAME, "script": "collectives.py", "args": [...]}, ...]`.

For each scenario, in order, on every rank: the script runs as `__main__`
(`runpy.run_path`, fresh globals, `sys.argv` = [script, *args]) with its
standard output going to `OUT_DIR/NAME.RANK.out` (the JSON lines its test
reads); an exception it raises (SystemExit other than 0 included) is
written, with its traceback, to `OUT_DIR/NAME.RANK.error` and the next
scenario runs. `OUT_DIR/NAME.RANK.done` marks a scenario ended either way.
Between scenarios the process is put back as a fresh script finds it: the
environment, `sys.argv`, Keras's dtype policy (float32) and session.

What it cannot isolate: a scenario that fails on some ranks only while
the others wait in a collective leaves them waiting, and the job ends at
its timeout (tests/mpi_launch.py's `run_scenarios` then fails every
scenario not done, each with the job's output). Only scripts that print
their results, need no environment of their own before `keras_mpfp16` is
imported and leave the job running belong here.
"""

import contextlib
import json
import os
import runpy
import sys
import traceback

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402

import keras_mpfp16 as kmp  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
out_dir, spec = sys.argv[1], json.loads(sys.argv[2])
rank = kmp.rank()
environ = dict(os.environ)

for scenario in spec:
    name = scenario["name"]
    script = os.path.join(HERE, scenario["script"])
    base = os.path.join(out_dir, f"{name}.{rank}")
    sys.argv = [script, *scenario.get("args", [])]
    with open(base + ".out", "w") as out:
        try:
            with contextlib.redirect_stdout(out):
                runpy.run_path(script, run_name="__main__")
        except SystemExit as exc:
            if exc.code not in (None, 0):
                with open(base + ".error", "w") as f:
                    f.write(traceback.format_exc())
        except BaseException:  # noqa: BLE001 - reported to this scenario's test
            with open(base + ".error", "w") as f:
                f.write(traceback.format_exc())
    with open(base + ".done", "w") as f:
        f.write("1")
    os.environ.clear()
    os.environ.update(environ)
    keras.config.set_dtype_policy("float32")
    keras.backend.clear_session()
