"""`python -m keras_mpfp16 doctor ARGS`, as a script path for the launch helpers.

runpy runs keras_mpfp16/__main__.py exactly as `python -m` does.
"""

import runpy
import sys

sys.argv = ["keras_mpfp16", "doctor", *sys.argv[1:]]
runpy.run_module("keras_mpfp16", run_name="__main__", alter_sys=True)
