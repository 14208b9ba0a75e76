"""`python -m keras_mpfp16 COMMAND`: command-line tools.

Commands:
    doctor   check the installation and the launch (see keras_mpfp16.doctor)
"""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__.strip())
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command == "doctor":
        from keras_mpfp16 import doctor

        return doctor.main(rest)
    print(f"unknown command {command!r}; allowed: doctor", file=sys.stderr)
    return 2


if __name__ == "__main__":
    # Two statements: `sys.exit` must be looked up after main() initialised
    # MPI, which wraps it so a non-zero status ends every rank's job.
    status = main()
    sys.exit(status)
