"""The one-seed pilots run before the N-worker study (`scaling.py`).

Two things, on the study's data and model, seed 1, 2 epochs (so N = 64
takes 128 steps):

- the single-worker sweep: final test AUC at N = 1 for each lr0 in
  `--sweep` (how lr0 = 0.1 was chosen);
- the rule comparison at N = 64 for each `LR0:WARMUP_EPOCHS` in `--pilots`:
  every rule of the study at that lr0, warmup rules warming up over
  WARMUP_EPOCHS epochs.

Each piece is one `scaling.py` run; the results are gathered into one JSON:

    python examples/convergence/pilots.py --out docs/benchmarks/convergence_pilots.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
import scaling  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument(
        "--sweep",
        type=float,
        nargs="+",
        default=[0.02, 0.05, 0.1, 0.2, 0.5, 1.0],
        help="lr0 values run at N = 1",
    )
    p.add_argument(
        "--pilots",
        nargs="+",
        default=["0.02:1", "0.2:0.5"],
        help="LR0:WARMUP_EPOCHS pairs run at N = 64 with every rule",
    )
    p.add_argument("--workers", type=int, default=64, help="N of the rule pilots")
    p.add_argument("--out", help="JSON results")
    p.add_argument(
        "--smoke",
        action="store_true",
        help="tiny: scaling.py's smoke data, one sweep value, one pilot at N = 4",
    )
    args = p.parse_args(argv)
    if args.smoke:
        args.sweep, args.pilots, args.workers, args.epochs = [0.1], ["0.1:1"], 4, 1
    return args


def one_run(argv, smoke):
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "run.json")
        result = scaling.main([*argv, "--out", out, *(["--smoke"] if smoke else [])])
    return result


def main(argv=None):
    args = parse_args(argv)
    common_args = ["--seeds", str(args.seed), "--epochs", str(args.epochs)]
    started = time.time()
    report = {
        "study": "convergence_pilots",
        "date": time.strftime("%Y-%m-%d"),
        "machine": common.MACHINE,
        "command": " ".join(
            ["python", "examples/convergence/pilots.py", *(argv or sys.argv[1:])]
        ),
        "seed": args.seed,
        "epochs": args.epochs,
        "sweep": [],
        "pilots": [],
    }
    for lr0 in args.sweep:
        r = one_run(
            [
                *common_args,
                "--workers",
                "1",
                "--rules",
                "none",
                "--learning-rate",
                str(lr0),
            ],
            args.smoke,
        )
        run = r["runs"][0]
        report["sweep"].append(
            {
                "learning_rate": lr0,
                "auc": run["test_auc"],
                "final_loss": run["final_loss"],
            }
        )
    for pilot in args.pilots:
        lr0, warmup = (float(v) for v in pilot.split(":"))
        r = one_run(
            [
                *common_args,
                "--workers",
                str(args.workers),
                "--rules",
                *(common.STUDY_RULES if not args.smoke else ["none", "linear"]),
                "--learning-rate",
                str(lr0),
                "--warmup-epochs",
                str(warmup),
            ],
            args.smoke,
        )
        rows = [row for row in r["runs"] if row["workers"] == args.workers]
        report["pilots"].append(
            {
                "learning_rate": lr0,
                "warmup_epochs": warmup,
                "workers": args.workers,
                "auc": {row["rule"]: row["test_auc"] for row in rows},
                "final_loss": {row["rule"]: row["final_loss"] for row in rows},
            }
        )
    report["seconds"] = round(time.time() - started, 1)
    print(json.dumps({k: v for k, v in report.items() if k in ("sweep", "pilots")}))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)
    return report


if __name__ == "__main__":
    main()
