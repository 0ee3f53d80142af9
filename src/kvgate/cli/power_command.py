"""`kvgate power`: what a paired gsm8k check can detect at a given n, discordance and margin."""

from __future__ import annotations

import argparse
from pathlib import Path

from kvgate import EXIT_OK, InputError
from kvgate.gate import policy as policy_module
from kvgate.gate.power import PowerFigures, accuracy_power, questions_needed, simulate_run, unpaired_se_points
from kvgate.gate.stats import MULTIPLICITY_METHODS

HELP = "minimum detectable gsm8k drop, false-alarm rates and questions needed for the paired accuracy check"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--n", type=int, help="questions scored per run (gsm8k test split: 1319)")
    parser.add_argument("--discordance", type=float, required=True,
                        help="expected share of questions on which the two runs disagree, e.g. 0.10")
    parser.add_argument("--margin", type=float, default=None,
                        help="allowed drop in points (default: the policy's baseline margin)")
    parser.add_argument("--target-drop", type=float, default=None,
                        help="a true drop in points: print the questions needed to catch it")
    parser.add_argument("--alpha", type=float, default=None, help="run-wide alpha (default: the policy's)")
    parser.add_argument("--multiplicity", choices=MULTIPLICITY_METHODS, default=None,
                        help="adjustment over the run (default: the policy's)")
    parser.add_argument("--power", type=float, default=0.9, help="detection probability wanted (default 0.9)")
    parser.add_argument("--tests", type=int, default=64,
                        help="accuracy tests in the run's family: cells x filters x checks (default 64)")
    parser.add_argument("--accuracy", type=float, default=0.65,
                        help="reference accuracy, for the unpaired comparison and --simulate (default 0.65)")
    parser.add_argument("--simulate", type=int, default=0, metavar="RUNS",
                        help="also replay the real tests on RUNS simulated runs per figure (e.g. 2000)")
    parser.add_argument("--policy", type=Path, default=None, help="default: matrix/policy.toml")


def run(args: argparse.Namespace) -> int:
    policy = policy_module.load(args.policy)
    alpha = args.alpha if args.alpha is not None else policy.accuracy.alpha
    method = args.multiplicity or policy.accuracy.multiplicity
    margin = args.margin if args.margin is not None else policy.accuracy.baseline_margin_points
    _validate(args, alpha, margin)
    tests = 1 if method == "none" else args.tests
    print(f"kvgate power: paired gsm8k check; discordance {args.discordance:.1%}, margin {margin:g} points, "
          f"alpha {alpha:g} run-wide ({method}), power {args.power:g}, a run of {args.tests} tests")
    if args.n is not None:
        single = accuracy_power(n=args.n, discordance=args.discordance, margin_points=margin, alpha=alpha,
                                power=args.power, tests=1)
        family = accuracy_power(n=args.n, discordance=args.discordance, margin_points=margin, alpha=alpha,
                                power=args.power, tests=tests)
        print(_table(args, single, family, method))
        if args.simulate:
            print(_simulated(args, single, family, alpha, margin, method))
    if args.target_drop is not None:
        print(_needed(args, alpha, margin, tests, method))
    return EXIT_OK


def _validate(args: argparse.Namespace, alpha: float, margin: float) -> None:
    source = "kvgate power"
    if args.n is None and args.target_drop is None:
        raise InputError(source, "nothing to compute", hint="Give --n, --target-drop, or both")
    checks = [
        (args.n is None or args.n >= 1, "--n", "must be >= 1"),
        (0 < args.discordance <= 1, "--discordance", "must be a share in (0, 1], e.g. 0.10"),
        (margin >= 0, "--margin", "must be >= 0 points"),
        (0 < alpha < 1, "--alpha", "must be in (0, 1)"),
        (0 < args.power < 1, "--power", "must be in (0, 1)"),
        (args.tests >= 1, "--tests", "must be >= 1"),
        (0 < args.accuracy < 1, "--accuracy", "must be in (0, 1)"),
        (args.simulate >= 0, "--simulate", "must be >= 0"),
    ]
    for ok, flag, what in checks:
        if not ok:
            raise InputError(source, f"{flag} {what}", hint="See `kvgate power --help`")


def _table(args: argparse.Namespace, single: PowerFigures, family: PowerFigures, method: str) -> str:
    corrected = f"after {method} over {family.tests} tests" if method != "none" else "no correction"
    rows = [
        ("", "no correction", corrected),
        ("significance level of the test", f"{single.per_test_alpha:.3g}", f"{family.per_test_alpha:.3g}"),
        ("fails when the measured drop exceeds", f"{single.threshold_points:.2f} pts",
         f"{family.threshold_points:.2f} pts"),
        (f"minimum detectable drop (power {args.power:g})", f"{single.minimum_detectable_drop_points:.2f} pts",
         f"{family.minimum_detectable_drop_points:.2f} pts"),
        ("false failures, unchanged cell (drop 0)", _percent(single.false_alarm_per_test),
         _percent(family.false_alarm_per_test)),
        (f"false failures of a run of {args.tests} unchanged tests", _percent(1 - (1 - single.false_alarm_per_test) ** args.tests),
         _percent(1 - (1 - family.false_alarm_per_test) ** args.tests)),
        ("failures at a true drop equal to the margin", _percent(single.fails_at_margin),
         _percent(family.fails_at_margin)),
    ]
    width = max(len(r[0]) for r in rows)
    lines = [f"n = {args.n}: SE of the paired drop {single.se_points:.2f} pts "
             f"(an unpaired test from the two means: {unpaired_se_points(n=args.n, accuracy=args.accuracy):.2f} pts "
             f"at accuracy {args.accuracy:g})"]
    lines += [f"  {a:<{width}}  {b:>16}  {c:>22}" for a, b, c in rows]
    lines.append("  (after the correction: a lone regression among the tests, where Holm and BH both ask p <= alpha/tests; "
                 "independent tests)")
    return "\n".join(lines)


def _simulated(args: argparse.Namespace, single: PowerFigures, family: PowerFigures, alpha: float, margin: float,
               method: str) -> str:
    common = dict(n=args.n, reference_accuracy=args.accuracy, discordance=args.discordance, margin_points=margin,
                  alpha=alpha, runs=args.simulate)
    lines = [f"simulated ({args.simulate} runs each; exact McNemar, {method}, the gate's rule; discordance kept "
             f"at {args.discordance:.1%}, so a drop above it is impossible):"]
    for label, figures, tests, how in (("one check alone", single, 1, "none"),
                                       (f"{args.tests} tests, {method}", family, args.tests, method)):
        drop = figures.minimum_detectable_drop_points
        unchanged = simulate_run(**common, multiplicity=how, tests=tests, seed=1)
        if drop / 100 <= args.discordance:
            caught = simulate_run(**common, multiplicity=how, tests=tests, regressed_tests=1, true_drop_points=drop,
                                  seed=2).detection_per_test
            detection = f"detects a {drop:.2f}-pt drop in {_percent(caught)}"
        else:
            detection = f"(a {drop:.2f}-pt drop needs more than {args.discordance:.0%} discordance)"
        lines.append(f"  {label}: false failures {_percent(unchanged.false_failure_per_test)} per test, "
                     f"{_percent(unchanged.false_failure_run)} per run; {detection}")
    return "\n".join(lines)


def _needed(args: argparse.Namespace, alpha: float, margin: float, tests: int, method: str) -> str:
    common = dict(target_drop_points=args.target_drop, discordance=args.discordance, margin_points=margin,
                  alpha=alpha, power=args.power)
    alone = questions_needed(**common, tests=1)
    if alone is None:
        return (f"a true drop of {args.target_drop:g} pts is not above the margin ({margin:g} pts): the check is "
                f"built to let it pass, at any n")
    corrected = questions_needed(**common, tests=tests)
    text = (f"questions needed to catch a {args.target_drop:g}-pt drop with power {args.power:g}: "
            f"{alone} for one check alone, {corrected} after {method} over {tests} tests")
    if max(alone, corrected or 0) > 1319:
        text += " (gsm8k's test split has 1319)"
    return text


def _percent(value: float | None) -> str:
    if value is None:
        return "-"
    if value == 0:
        return "0 %"
    if value < 0.001:
        return f"{100 * value:.2g} %"
    return f"{100 * value:.1f} %"
