"""`python -m keras_mpfp16.runtime.launch mpirun ...`: the documented command;
`kmp-launch mpirun ...` (the console script of pyproject.toml's
`[project.scripts]`) runs its `main` too.

Forwards to the launch wrapper, `keras_mpfp16.runtime.supervision.launch_wrapper`
(which see); its names stay importable from here.
"""

from keras_mpfp16.runtime.supervision.launch_wrapper import (
    NODE_LOST_EXIT_CODE,
    main,
    report_lost,
    run,
)

__all__ = ["NODE_LOST_EXIT_CODE", "main", "report_lost", "run"]

if __name__ == "__main__":
    main()
