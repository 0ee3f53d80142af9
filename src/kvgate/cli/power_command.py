"""`kvgate power`: the questions and repeats each check needs, and what a given n buys (exact figures)."""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import numpy as np

from kvgate import EXIT_OK, InputError
from kvgate.gate import policy as policy_module
from kvgate.statistics import margins, power

MAX_QUESTIONS = 1_000_000  # the most questions counted exactly (gsm8k's test split has 1319)
HELP = "questions and repeats each check needs; false alarms and power of the accuracy and throughput tests"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--discordance", type=float, nargs="+", default=None, metavar="FLIPS",
                        help="noise flips: the share of questions two runs of unchanged code disagree on (default "
                             "0.05 0.10 and the policy's design_flips)")
    parser.add_argument("--margin", type=float, default=None,
                        help="one check with this margin in points (default: the policy's FP8 tax and baseline margin)")
    parser.add_argument("--target-drop", type=float, default=None,
                        help="the drop to catch, points (default: margin + the policy's gap_points)")
    parser.add_argument("--alpha", type=float, default=None, help="per check, at drop = margin (default: the policy's)")
    parser.add_argument("--power", type=float, default=None, help="detection wanted (default: the policy's)")
    parser.add_argument("--n", type=int, default=None, help="also print the figures at this many questions")
    parser.add_argument("--tests", type=int, default=32,
                        help="run-level figures for a run of this many checks at margin / 2 (default 32)")
    parser.add_argument("--simulate", type=int, default=0, metavar="RUNS",
                        help="with --n: replay the real test on RUNS simulated comparisons per figure")
    parser.add_argument("--repeat-sd", type=float, nargs="+", default=[0.02, 0.03], metavar="SD",
                        help="throughput: each repeat's own log-SD (default 0.02 0.03)")
    parser.add_argument("--slowdown", type=float, default=0.10, help="throughput: the slowdown to catch (default 0.10)")
    parser.add_argument("--policy", type=Path, default=None, help="default: matrix/policy.toml")


def run(args: argparse.Namespace) -> int:
    policy = policy_module.load(args.policy)
    acc, tput = policy.accuracy, policy.throughput
    alpha = acc.alpha if args.alpha is None else args.alpha
    wanted = acc.power if args.power is None else args.power
    flips = args.discordance or sorted({0.05, 0.10, acc.design_flips})
    _validate(args, alpha, wanted, flips)
    if args.margin is not None:
        target = args.target_drop if args.target_drop is not None else args.margin + acc.gap_points
        checks = [("the check", args.margin, target)]
    else:
        checks = [("fp8_accuracy (FP8 vs auto)", acc.fp8_tax_points, acc.fp8_tax_points + acc.gap_points),
                  ("baseline_accuracy", acc.baseline_margin_points, acc.baseline_margin_points + acc.gap_points)]
    _validate_checks(args, checks, [*flips, acc.design_flips], alpha, wanted)  # the sequential plan is sized at design_flips
    print(f"kvgate power: paired gsm8k margin test, H0 \"drop <= margin\", alpha {alpha:g} per check, power "
          f"{wanted:g} at the drop to catch.")
    print("Noise flips: the share of questions two runs of unchanged code disagree on, half each way; a regression "
          "breaks right answers on top of them.")
    print()
    print(_questions_table(checks, flips, alpha, wanted))
    print(f"the policy asks {acc.questions} questions (accuracy.questions, sized at {100 * acc.design_flips:g} % flips)")
    print()
    print(_sequential_text(policy, checks, alpha, wanted))
    if args.n is not None:
        print()
        print(_at_n(args, checks, flips, alpha))
    print()
    print(_throughput_text(tput, args))
    return EXIT_OK


def _validate(args: argparse.Namespace, alpha: float, wanted: float, flips: list[float]) -> None:
    source = "kvgate power"
    checks = [
        (args.n is None or args.n >= 1, "--n", "must be >= 1"),
        (all(0 < f < 1 for f in flips), "--discordance", "must be a share in (0, 1), e.g. 0.10"),
        (args.margin is None or 0 <= args.margin < 100, "--margin", "must be in [0, 100) points"),
        (args.target_drop is None or args.margin is not None, "--target-drop", "needs --margin"),
        (args.target_drop is None or args.margin is None or args.target_drop > args.margin, "--target-drop",
         "must exceed --margin: a drop within the margin is built to pass, at any n"),
        (0 < alpha < 0.5, "--alpha", "must be in (0, 0.5)"),
        (0.5 <= wanted < 1, "--power", "must be in [0.5, 1)"),
        (args.tests >= 1, "--tests", "must be >= 1"),
        (args.simulate >= 0, "--simulate", "must be >= 0"),
        (args.simulate == 0 or args.n is not None, "--simulate", "needs --n"),
        (all(0 < s < 1 for s in args.repeat_sd), "--repeat-sd", "must be a log-SD in (0, 1), e.g. 0.03"),
        (0 < args.slowdown < 1, "--slowdown", "must be in (0, 1), e.g. 0.10"),
    ]
    for ok, flag, what in checks:
        if not ok:
            raise InputError(source, f"{flag} {what}", hint="See `kvgate power --help`")


def _validate_checks(args: argparse.Namespace, checks: list[tuple[str, float, float]], flips: list[float],
                     alpha: float, wanted: float) -> None:
    """Each drop to catch on top of each share of noise flips must fit in the questions: a regression of `target`
    points breaks right answers besides the flips, so flips + target / 100 above 1 is no question model at all. And
    the questions it needs must be few enough to count exactly (a drop a hair above the margin needs billions)."""
    for _, _, target in checks:
        for f in flips:
            if not f + target / 100 <= 1:
                flag = "--target-drop" if args.target_drop is not None else "--margin" if args.margin is not None \
                    else "--discordance"
                raise InputError("kvgate power", f"{flag}: a drop of {target:g} points on top of {100 * f:g} % noise "
                                 "flips breaks more answers than there are questions",
                                 hint="Lower --discordance or the drop to catch (--margin, --target-drop)")
    for _, margin, target in checks:
        for f in flips:
            try:
                guess: float = power.normal_questions(margin_points=margin, target_points=target, flips=f, alpha=alpha,
                                                      power=wanted)
            except OverflowError:  # a gap of 1e-300 points
                guess = math.inf
            if guess > MAX_QUESTIONS:
                raise InputError("kvgate power", f"catching a drop of {target:g} points over a margin of {margin:g} at "
                                 f"{100 * f:g} % flips needs {f'about {guess:.3g}' if math.isfinite(guess) else 'unboundedly many'} questions, more than the {MAX_QUESTIONS} "
                                 "kvgate power counts exactly", hint="Widen the gap between --margin and --target-drop, "
                                 "or ask less (--alpha, --power)")


def _questions_table(checks: list[tuple[str, float, float]], flips: list[float], alpha: float, wanted: float) -> str:
    header = ["check", "margin", "catches", *(f"{100 * f:g} % flips" for f in flips)]
    rows = [header]
    for name, margin, target in checks:
        rows.append([name, f"{margin:g}", f"{target:g}",
                     *(str(power.questions_needed(margin_points=margin, target_points=target, flips=f, alpha=alpha,
                                                  power=wanted)) for f in flips)])
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    lines = ["questions each check needs (fixed design, exact; gsm8k's test split has 1319):"]
    for row in rows:
        lines.append("  " + "  ".join(cell.ljust(w) if i == 0 else cell.rjust(w)
                                      for i, (cell, w) in enumerate(zip(row, widths, strict=True))))
    return "\n".join(lines)


def _sequential_text(policy: policy_module.Policy, checks: list[tuple[str, float, float]], alpha: float,
                     wanted: float) -> str:
    acc = policy.accuracy
    seq = acc.sequential
    fixed = max(power.questions_needed(margin_points=m, target_points=t, flips=acc.design_flips, alpha=alpha,
                                       power=wanted) for _, m, t in checks)
    lines = []
    for name, margin, target in checks:
        plan = power.sequential_plan(fixed_questions=fixed, fractions=seq.looks, alpha=alpha, beta=1 - wanted,
                                     rho=seq.beta_spending_rho, margin_points=margin, gap_points=target - margin)
        if not lines:
            lines.append(f"group-sequential: looks at {', '.join(map(str, plan.looks))} questions (up to "
                         f"{plan.max_questions} = {plan.inflation:.4f} x {fixed}); O'Brien-Fleming alpha spending, "
                         f"futility at the drop to catch with beta t^{seq.beta_spending_rho:g}, non-binding")
            lines.append("  expected questions as a share of the fixed design's, and P(fail):")
        cells = ", ".join(f"{scenario} {share:.2f} ({plan.fails[scenario]:.2%})"
                          for scenario, share in plan.expected_fraction.items())
        lines.append(f"  {name}: {cells}")
    return "\n".join(lines)


def _at_n(args: argparse.Namespace, checks: list[tuple[str, float, float]], flips: list[float], alpha: float) -> str:
    lines = [f"at n = {args.n} questions (exact; P(fail) per check, and for a run of {args.tests} checks at "
             "margin / 2):"]
    for name, margin, target in checks:
        for f in flips:
            fig = power.accuracy_figures(n=args.n, flips=f, margin_points=margin, target_points=target, alpha=alpha,
                                         run_of=args.tests)
            lines.append(f"  {name}, {100 * f:g} % flips: drop 0 {_percent(fig.fails_at_zero)}, margin/2 "
                         f"{_percent(fig.fails_at_half_margin)}, margin {_percent(fig.fails_at_margin)}, "
                         f"{target:g} pts {_percent(fig.power_at_target)}; run of {args.tests} at margin/2 "
                         f"{_percent(fig.run_fails_at_half_margin)}")
            if args.simulate:
                lines.append("    " + _simulated(args.n, f, margin, target, alpha, args.simulate))
    return "\n".join(lines)


def _simulated(n: int, flips: float, margin: float, target: float, alpha: float, runs: int) -> str:
    rng = np.random.default_rng(20261130)
    parts = []
    for label, drop in (("margin", margin), (f"{target:g} pts", target)):
        p10, p01 = power.paired_probabilities(flips=flips, drop_points=drop)
        counts = rng.multinomial(n, [p10, p01, 1 - p10 - p01], size=runs)
        rate = float(margins.margin_rejects(counts[:, 0], counts[:, 1], n, margin_points=margin, alpha=alpha).mean())
        failed = round(rate * runs)
        if 0 < failed < runs:
            parts.append(f"{label} {_percent(rate)} ± {_percent(math.sqrt(rate * (1 - rate) / runs))}")
        else:  # none or all: the standard error is 0, no precision; the exact one-sided 95 % bound instead
            bound = 0.05 ** (1 / runs)
            parts.append(f"{label} {_percent(rate)} ({failed} of {runs}; 95 % "
                         + (f"upper bound {_percent(1 - bound)})" if failed == 0 else f"lower bound {_percent(bound)})"))
    return f"simulated ({runs} comparisons each): " + ", ".join(parts)


def _throughput_text(tput: policy_module.ThroughputPolicy, args: argparse.Namespace) -> str:
    slow = args.slowdown
    lines = [f"throughput: H0 \"ratio >= {1 - tput.tolerance:.2f}\", alpha {tput.alpha:g}; rounds of interleaved A/B "
             f"repeats for power 0.9 at a {100 * slow:g} % slowdown (the policy asks {tput.rounds}):"]
    for sd in args.repeat_sd:
        rounds = power.rounds_needed(repeat_sd=sd, tolerance=tput.tolerance, slowdown=slow, alpha=tput.alpha,
                                     power=0.9)
        unchanged = power.paired_rounds_power(rounds or 2, repeat_sd=sd, tolerance=tput.tolerance, slowdown=0.0,
                                              alpha=tput.alpha)
        lines.append(f"  {100 * sd:g} % per-repeat SD: {rounds if rounds else 'more than 200'} rounds (an unchanged cell "
                     f"then fails {_percent(unchanged)})")
    best = power.stored_power(None, repeat_sd=0.0, run_to_run_sd=tput.run_to_run_sd, tolerance=tput.tolerance,
                              slowdown=slow, alpha=tput.alpha_unpaired)
    unchanged = power.stored_power(None, repeat_sd=0.0, run_to_run_sd=tput.run_to_run_sd, tolerance=tput.tolerance,
                                   slowdown=0.0, alpha=tput.alpha_unpaired)
    lines.append(f"  a stored baseline (run-to-run SD {100 * tput.run_to_run_sd:g} %, alpha {tput.alpha_unpaired:g}): a "
                 f"{100 * slow:g} % slowdown is caught at most {_percent(best)} of the time, however many repeats (an "
                 f"unchanged cell fails {_percent(unchanged)})")
    lines.append("")
    lines.append(_measured_table(tput, args.policy))
    return "\n".join(lines)


def _measured_table(tput: policy_module.ThroughputPolicy, policy_path: Path | None) -> str:
    """Per [[throughput.measured_noise]] entry: the design its workload runs (matrix/workloads.toml), and what an A/B
    of that design catches at 5/10/15 % slowdowns, what an unchanged cell and one slowed by the tolerance fail, and a
    stored baseline at 10 %."""
    from kvgate.matrix import cells as matrix_module

    folder = policy_path.parent if policy_path is not None and any(
        (policy_path.parent / name).is_file() for name in matrix_module.MATRIX_FILES) else None
    try:
        workloads = matrix_module.load(folder).workloads
    except Exception:
        workloads = {}
    slowdowns = (0.05, 0.10, 0.15)
    rows = ["measured throughput noise, and what an A/B run of each cell's design catches (power at a 5 / 10 / 15 % "
            "slowdown; false alarms of an unchanged cell and of one slowed by exactly the tolerance):",
            "| cell | workload | repeat SD | engine SD | design | A/B: 5 / 10 / 15 % | unchanged fails | at tolerance "
            "| stored baseline: 10 % | measured |",
            "|---|---|---|---|---|---|---|---|---|---|"]
    for noise in tput.measured_noise:
        workload = workloads.get(noise.workload)
        if workload is not None and (noise.engine_sd is not None or "repeats" in workload.throughput):
            # the design the workload runs; where no engine SD is measured, the gate's stand-in
            # (ThroughputPolicy.engine_sd_for: the policy's run-to-run SD) is what the test assumes
            engines = int(workload.throughput.get("engines", 1))
            repeats = int(workload.throughput["repeats"])
            repeat_sd = noise.repeat_sd
            engine_sd = noise.engine_sd if noise.engine_sd is not None else tput.run_to_run_sd
            design = f"{engines} engine{'s' if engines > 1 else ''} x {repeats} repeats"
        else:  # each repeat its own engine: the paired design of the policy's rounds
            engines, repeats = tput.rounds, 1
            repeat_sd, engine_sd = 0.0, noise.per_engine_sd
            design = f"{engines} engines x 1 repeat, paired"

        def caught(slowdown: float, engines=engines, repeats=repeats, repeat_sd=repeat_sd,
                   engine_sd=engine_sd) -> float:
            return power.engine_ab_power(engines, repeats, repeat_sd=repeat_sd, engine_sd=engine_sd,
                                         tolerance=tput.tolerance, slowdown=slowdown, alpha=tput.alpha)

        # a stored baseline ran at another time: each side's E engines average their own levels, and the two runs'
        # levels differ by the policy's run-to-run SD besides
        stored = power.stored_power(engines, repeat_sd=math.sqrt(engine_sd**2 + repeat_sd**2 / repeats),
                                    run_to_run_sd=tput.run_to_run_sd, tolerance=tput.tolerance, slowdown=0.10,
                                    alpha=tput.alpha_unpaired)
        where = noise.workload + ("" if workload is not None else " (not in this matrix)")
        engine_text = ("-" if workload is None else f"{100 * engine_sd:.3g} % (run_to_run_sd stands in)") \
            if noise.engine_sd is None else f"{100 * noise.engine_sd:.3g} %"
        rows.append(f"| {noise.cell} | {where} | {100 * noise.repeat_sd:.3g} % | {engine_text} | {design} | "
                    f"{' / '.join(_percent(caught(s)) for s in slowdowns)} | {_percent(caught(0.0))} | "
                    f"{_percent(caught(tput.tolerance))} | {_percent(stored)} | {noise.date}, "
                    f"{noise.engines} engine{'s' if noise.engines != 1 else ''}, {noise.repeats} repeats{f', {noise.shape}' if noise.shape else ''} |")
    if not tput.measured_noise:
        rows.append("| (none measured) | | | | | | | | | |")
    return "\n".join(rows)


def _percent(value: float) -> str:
    if value == 0:
        return "0 %"
    if value < 0.001:
        return f"{100 * value:.2g} %"
    return f"{100 * value:.1f} %"
