"""`python -m keras_mpfp16 COMMAND [ARG ...]`: the package's command-line tools.

`python -m keras_mpfp16 --help` lists them; `python -m keras_mpfp16 COMMAND
--help` shows a command's own options.
"""

from __future__ import annotations

import argparse
import sys

# Each tool: (one line of help, the module whose `main(argv)` runs it).
TOOLS = {
    "doctor": (
        "check the installation and the launch (run it alone, or under "
        "mpirun/srun like the training)",
        "keras_mpfp16.doctor",
    ),
    "benchmark": (
        "numbers for your own cluster: allreduce (bandwidth vs raw mpi4py), "
        "train (samples/s at the launched size), overhead (one process)",
        "keras_mpfp16.benchmark.__main__",
    ),
}

_EPILOG = """\
the launch wrapper (its own command, as it supervises the job without Keras):
  kmp-launch [--max-restarts K] mpirun -np N python train.py
      ends a job that lost a node (exit status 69), optionally restarting it;
      also `python -m keras_mpfp16.runtime.launch ...`; `kmp-launch --help`.

examples:
  python -m keras_mpfp16 doctor
  mpirun -np 2 python -m keras_mpfp16 doctor --json
  mpirun -np 2 python -m keras_mpfp16 benchmark allreduce --out ar.json
"""


def _parser() -> argparse.ArgumentParser:
    width = max(len(name) for name in TOOLS)
    listing = "\n".join(
        f"  {name.ljust(width)}  {help_}" for name, (help_, _) in TOOLS.items()
    )
    parser = argparse.ArgumentParser(
        prog="python -m keras_mpfp16",
        usage="python -m keras_mpfp16 [-h] [--version] COMMAND [ARG ...]",
        description=f"The keras-mpfp16 command-line tools.\n\ncommands:\n{listing}",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
    )
    from keras_mpfp16 import __version__

    parser.add_argument(
        "--version",
        action="version",
        version=f"keras-mpfp16 {__version__}",
    )
    parser.add_argument(
        "command", metavar="COMMAND", choices=list(TOOLS), help=argparse.SUPPRESS
    )
    parser.add_argument("args", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Runs the tool `argv[0]` with the rest of `argv`; returns its status
    (2, with argparse's message, for a missing or unknown command)."""
    argv = sys.argv[1:] if argv is None else argv
    parser = _parser()
    if not argv:
        parser.error(f"a COMMAND is required: one of {', '.join(TOOLS)}")
    args = parser.parse_args(argv)
    import importlib

    tool = importlib.import_module(TOOLS[args.command][1])
    return tool.main(args.args)


if __name__ == "__main__":
    # Two statements: `sys.exit` must be looked up after main() initialised
    # MPI, which wraps it so a non-zero status ends every rank's job.
    status = main()
    sys.exit(status)
