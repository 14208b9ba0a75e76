"""N-worker convergence: final test AUC vs N for each learning-rate rule.

Synchronous data parallelism on N workers with per-worker batch b is
simulated exactly in one process with batch N*b (see `common.py` for why,
and `equivalence.py` for the check against real `mpirun`), with
`kmp.callbacks.LearningRateScaler(rule=..., num_workers=N)`. The number of
epochs is the same for every N, so a larger N takes fewer, larger steps.

Data: synthetic shots (`examples/shots.py`) of equal length, one label per
shot (disruptive or not, ~15% positive); 131072 training and 16384 test
shots by default, so N*b stays far below the training set (at N = 128,
b = 32: 4096 rows, 3%). Model: LSTM(32) -> Dense(1, sigmoid); SGD with
momentum 0.9, the rule scaling lr0.

    python examples/convergence/scaling.py --out docs/benchmarks/convergence_scaling.json
    python examples/convergence/scaling.py --smoke   # seconds: the pipeline only

The JSON is rewritten after every run; running again with the same --out
skips the runs it already holds (resume after an interruption). At N = 1
every rule except "paper" has the factor 1 and warmup ramps from lr0 to lr0,
so those rules share one run per seed ("none"); "paper" (0.990 lr0) runs.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

WORKERS = [1, 2, 4, 8, 16, 32, 64, 128]


def parse_args(argv=None):
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument(
        "--workers", type=int, nargs="+", default=WORKERS, help="values of N"
    )
    p.add_argument(
        "--rules", nargs="+", default=common.STUDY_RULES, choices=list(common.RULES)
    )
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    p.add_argument("--epochs", type=int, default=4, help="the same for every N")
    p.add_argument("--batch", type=int, default=32, help="per-worker batch b")
    p.add_argument("--learning-rate", type=float, default=0.1, help="lr0 (N = 1)")
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--warmup-epochs", type=float, default=1.0, help="for linear+warmup")
    p.add_argument("--train-shots", type=int, default=131072)
    p.add_argument("--test-shots", type=int, default=16384)
    p.add_argument("--length", type=int, default=32, help="steps per shot")
    p.add_argument("--strength", type=float, default=0.5, help="precursor strength")
    p.add_argument("--units", type=int, default=32)
    p.add_argument("--data-seed", type=int, default=0)
    p.add_argument("--out", help="JSON results (rewritten after every run)")
    p.add_argument(
        "--smoke",
        action="store_true",
        help="tiny: 2048 shots, N in {1, 4}, rules none and linear, 1 seed, 1 epoch",
    )
    args = p.parse_args(argv)
    if args.smoke:
        args.train_shots, args.test_shots, args.epochs = 2048, 512, 1
        args.workers, args.seeds, args.units = [1, 4], args.seeds[:1], 8
        args.rules = [r for r in args.rules if r in ("none", "linear")] or ["none"]
    return args


def run_of(n, rule):
    """The rule whose run stands for `rule` at N: at N = 1 every rule but
    "paper" has the factor 1 (and its warmup ramps from lr0 to lr0)."""
    return "none" if n == 1 and not rule.startswith("paper") else rule


def runs_to_do(args):
    """(N, rule, seed) in seed-major order, N = 1 runs of equal rates merged."""
    for seed in args.seeds:
        for n in args.workers:
            for rule in dict.fromkeys(run_of(n, r) for r in args.rules):
                yield n, rule, seed


def summarise(runs, rules, workers):
    """Per rule and N: mean, std and count of the final test AUC over seeds."""
    table = {}
    for rule in rules:
        table[rule] = {}
        for n in workers:
            source = run_of(n, rule)
            values = [
                r["test_auc"] for r in runs if r["workers"] == n and r["rule"] == source
            ]
            diverged = sum(
                r["diverged"] for r in runs if r["workers"] == n and r["rule"] == source
            )
            mean, std, count = common.mean_std(values)
            table[rule][str(n)] = {
                "mean": mean,
                "std": std,
                "n": count,
                "runs": len(values),
                "diverged": diverged,
            }
    return table


# Arguments that define the training; runs in one JSON must share them.
SETTINGS = (
    "epochs", "batch", "learning_rate", "momentum", "warmup_epochs",
    "train_shots", "test_shots", "length", "strength", "units", "data_seed",
)  # fmt: skip


def summary(result):
    args = result["args"]
    rules = [r for r in common.RULES if r in args["rules"]]
    return summarise(result["runs"], rules, sorted(args["workers"]))


def main(argv=None):
    args = parse_args(argv)
    x, y = common.shot_windows(
        args.train_shots, args.length, args.data_seed, args.strength
    )
    x_test, y_test = common.shot_windows(
        args.test_shots, args.length, args.data_seed + 1, args.strength
    )
    print(
        f"train {x.shape} ({y.mean():.3f} positive), test {x_test.shape}, "
        f"epochs {args.epochs}, b {args.batch}",
        flush=True,
    )
    result = {
        "study": "convergence_scaling",
        "date": time.strftime("%Y-%m-%d"),
        "machine": common.MACHINE,
        "platform": f"{platform.machine()}, {os.cpu_count()} CPUs",
        "command": " ".join(
            ["python", "examples/convergence/scaling.py", *(argv or sys.argv[1:])]
        ),
        "args": vars(args),
        "runs": [],
    }
    if args.out and os.path.exists(args.out):
        # Resume or extend (more rules, seeds or N): only with the same
        # training settings, else the runs would not be comparable.
        with open(args.out) as f:
            previous = json.load(f)
        changed = [k for k in SETTINGS if previous["args"].get(k) != getattr(args, k)]
        if changed:
            raise SystemExit(
                f"{args.out} holds runs with other settings ({', '.join(changed)}); "
                "use another --out."
            )
        result["runs"] = previous["runs"]
        result["commands"] = previous.get("commands") or [previous["command"]]
        for key in ("workers", "rules", "seeds"):
            merged = previous["args"][key] + getattr(args, key)
            result["args"][key] = list(dict.fromkeys(merged))
    result.setdefault("commands", [])
    result["commands"].append(result.pop("command"))
    done = {(r["workers"], r["rule"], r["seed"]) for r in result["runs"]}
    for n, rule, seed in runs_to_do(args):
        if (n, rule, seed) in done:
            continue
        spec = common.RULES[rule]
        model, record, seconds, diverged = common.train_run(
            x,
            y,
            workers=n,
            batch=args.batch,
            rule=spec["rule"],
            warmup_epochs=args.warmup_epochs if spec.get("warmup") else 0.0,
            epochs=args.epochs,
            learning_rate=args.learning_rate,
            momentum=args.momentum,
            units=args.units,
            seed=seed,
        )
        auc, accuracy = common.evaluate(model, x_test, y_test)
        if not (auc == auc):  # NaN: the weights went non-finite
            diverged = True
        row = {
            "workers": n,
            "rule": rule,
            "seed": seed,
            "test_auc": auc,
            "test_accuracy": accuracy,
            "final_loss": record.losses[-1] if record.losses else None,
            "max_learning_rate": max(record.rates) if record.rates else None,
            "steps": len(record.losses),
            "diverged": diverged,
            "seconds": round(seconds, 1),
        }
        result["runs"].append(row)
        result["summary"] = summary(result)
        print(
            f"N={n:4d} {rule:14s} seed {seed}: test AUC {auc:.4f}, accuracy "
            f"{accuracy:.4f}, {row['steps']} steps, {seconds:.1f} s"
            + (" (diverged)" if diverged else ""),
            flush=True,
        )
        if args.out:
            with open(args.out, "w") as f:
                json.dump(result, f, indent=1)
    result["summary"] = summary(result)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    print_table(result["summary"], sorted(result["args"]["workers"]))
    return result


def print_table(summary, workers):
    print("\nfinal test AUC, mean +- std over seeds")
    print(f"{'rule':14s}" + "".join(f"{'N=' + str(n):>16s}" for n in workers))
    for rule, row in summary.items():
        cells = []
        for n in workers:
            s = row[str(n)]
            cells.append(f"{s['mean']:.4f}+-{s['std']:.4f}" if s["n"] else "-")
        print(f"{rule:14s}" + "".join(f"{c:>16s}" for c in cells))


if __name__ == "__main__":
    main()
