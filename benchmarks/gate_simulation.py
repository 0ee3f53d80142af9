"""The gate's error rates by simulation, through `kvgate gate`: accuracy and throughput tables.

    PYTHONPATH=src nice -n 10 python benchmarks/gate_simulation.py [--runs 20000] [--cli-runs 25] [--quick]

Accuracy questions come from tests/synthetic_run.QuestionModel: per-question difficulty, noise flips and the
regression are separate parameters (a question set of gsm8k-like difficulty, accuracy 0.65; two runs of
unchanged code disagree on `flips` of the questions; the regression breaks right answers of the candidate).
Throughput repeats: log-normal with a shared round drift (interleaved A/B), or each run with its own level
(a stored baseline).

Every figure comes from the gate's own functions on simulated outcomes (the fast path: kvgate.statistics.margins and
kvgate.statistics.sequential, vectorised, the functions `kvgate gate` calls); a subset of the same simulated runs is
written as results folders in the contract's format (docs/results-folder.md) and judged by `kvgate gate`
in-process (kvgate.cli.main), and every one of those verdicts must agree with the fast path's decision (the
"CLI agrees" column). Interleaved throughput goes through the gate's check function on loaded folders, as
`evaluate()` does not yet pass the interleaved flag. Monte Carlo standard errors are printed with each figure.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import math
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "tests"))  # synthetic_run: the tests' writer of contract-format folders

from kvgate.cli import main as kvgate  # noqa: E402
from kvgate.gate import policy as policy_module  # noqa: E402
from kvgate.gate.checks import pending as pending_checks  # noqa: E402
from kvgate.gate.checks import throughput as throughput_checks  # noqa: E402
from kvgate.matrix import cells as matrix_module  # noqa: E402
from kvgate.results.run_loader import KnownNames, load_run  # noqa: E402
from kvgate.statistics import distributions, margins, sequential  # noqa: E402
from synthetic_run import (  # noqa: E402
    QuestionModel,
    flexible_from_strict,
    write_accuracy,
    write_cell,
    write_engines_ab_run,
    write_throughput,
)

POLICY = policy_module.load()
ACC, TPUT = POLICY.accuracy, POLICY.throughput
MODEL = "meta-llama/Llama-3.1-8B-Instruct"  # a workload without an accuracy floor: the tables are the comparisons
BACKEND, ARCH = "FLASHINFER", "sm90"
FLIPS = (0.05, 0.10, 0.15)
TODAY = "2026-11-30"


def se(rate: float, runs: int) -> float:
    return math.sqrt(max(rate * (1 - rate), 0.25 / runs) / runs)  # never 0: a 0/runs rate is "below ~1/runs"


def pct(rate: float, runs: int) -> str:
    return f"{100 * rate:6.3f} ± {100 * se(rate, runs):.3f}"


class Gate:
    """`kvgate gate` in-process on folders written under one scratch directory."""

    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="kvgate-sim-"))
        self.count = 0
        self.calls = 0
        self.seconds = 0.0

    def folder(self) -> Path:
        self.count += 1
        return self.root / f"run-{self.count}"

    def judge(self, run: Path, *extra: str) -> dict:
        started = time.perf_counter()
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()) as err:
            status = kvgate(["gate", str(run), "--today", TODAY, *extra])
        self.seconds += time.perf_counter() - started
        self.calls += 1
        if status not in (0, 1):
            raise RuntimeError(f"kvgate gate exited {status} on {run}: {err.getvalue()}")
        verdict = json.loads((run / "gate" / "verdict.json").read_text())
        shutil.rmtree(run)
        return verdict

    def close(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)


def check_of(verdict: dict, kind: str, cell: str | None = None, subject: str | None = "strict-match") -> dict:
    found = [c for c in verdict["checks"] if c["kind"] == kind and (cell is None or c["cell"] == cell)
             and (subject is None or c["subject"] == subject)]
    if len(found) != 1:
        raise RuntimeError(f"expected one {kind} check for {cell}, found {len(found)}")
    return found[0]


# ---------------------------------------------------------------------------------------------- accuracy

def write_pair(run: Path, kind: str, reference: np.ndarray, candidate: np.ndarray, rng: np.random.Generator, *,
               model: str = MODEL, candidate_ids=None, reference_ids=None, record: dict | None = None) -> None:
    """One comparison as results folders: fp8_accuracy (auto and fp8 cells of one run) or baseline_accuracy
    (an A/B run: the base side and the head side of one cell)."""
    folder_suffix = model.rsplit("/", 1)[-1]
    if kind == "fp8_accuracy":
        cells = (("auto", None, reference, reference_ids, None), ("fp8", None, candidate, candidate_ids, record))
    else:
        cells = (("auto", "base", reference, reference_ids, None), ("auto", "head", candidate, candidate_ids, record))
    for dtype, side, outcomes, ids, sequential_record in cells:
        extra = {**({"side": side} if side else {}), **({"sequential": sequential_record} if sequential_record else {})}
        folder = f"{dtype}-{side or 'head'}-{folder_suffix}"
        cell = write_cell(run, backend=BACKEND, kv_cache_dtype=dtype, arch=ARCH, model=model, folder=folder,
                          extra=extra or None)
        flexible = flexible_from_strict(outcomes, rng)
        write_accuracy(cell, {"strict-match": outcomes.tolist(), "flexible-extract": flexible.tolist()},
                       model=model, prompt_chars=0, question_ids=ids)


def fixed_decisions(reference: np.ndarray, candidate: np.ndarray, margin: float) -> np.ndarray:
    """The fast path: counts -> margins.margin_log_p (what margin_test computes) -> p <= alpha."""
    b = (reference & ~candidate).sum(axis=1)
    c = (~reference & candidate).sum(axis=1)
    return margins.margin_rejects(b, c, reference.shape[1], margin_points=margin, alpha=ACC.alpha)


def accuracy_cell_table(args: argparse.Namespace, gate: Gate, rng: np.random.Generator) -> list[str]:
    lines = ["", "ACCURACY, per cell: P(fail) in % at the true drop (points); fixed design; "
             f"{args.runs} simulated comparisons per figure (± Monte Carlo SE)",
             "check (margin)          n   flips      drop 0    drop m/2      drop m   power m+3   CLI agrees"]
    for kind, margin in (("fp8_accuracy", ACC.fp8_tax_points), ("baseline_accuracy", ACC.baseline_margin_points)):
        for n in (1319, ACC.questions):
            for flips in FLIPS:
                model = QuestionModel(n=n, flips=flips, seed=n)
                questions = model.questions()
                rates, agree, total = [], 0, 0
                for drop in (0.0, margin / 2, margin, margin + ACC.gap_points):
                    failed = 0
                    for start in range(0, args.runs, args.chunk):
                        size = min(args.chunk, args.runs - start)
                        ref, cand = model.runs(size, drop_points=drop, rng=rng, questions=questions)
                        decisions = fixed_decisions(ref, cand, margin)
                        failed += int(decisions.sum())
                        if start == 0 and drop in (margin, margin + ACC.gap_points) and flips == 0.15:
                            for i in range(min(args.cli_runs, size)):
                                run = gate.folder()
                                write_pair(run, kind, ref[i], cand[i], rng)
                                status = check_of(gate.judge(run), kind)["status"]
                                agree += status == ("fail" if decisions[i] else "pass")
                                total += 1
                    rates.append(failed / args.runs)
                cli = f"{agree}/{total}" if total else ""
                lines.append(f"{kind[:-9]:>8} ({margin:g})  {n:>6}  {100 * flips:4.0f} %  "
                             + "  ".join(pct(r, args.runs) for r in rates) + f"  {cli:>10}")
    return lines


def run_level_table(args: argparse.Namespace, gate: Gate, rng: np.random.Generator) -> list[str]:
    cells, tax = 32, 1.6
    runs = args.run_level_runs
    lines = ["", f"ACCURACY, run level: P(any of {cells} FP8 cells fails), every cell at a true {tax}-point tax "
             f"(margin {ACC.fp8_tax_points:g}); {runs} simulated runs per figure",
             "       n   flips   P(run fails) %   CLI agrees (cells)"]
    for n in (1319, ACC.questions):
        for flips in FLIPS:
            model = QuestionModel(n=n, flips=flips, seed=n)
            questions = model.questions()
            any_failed = np.zeros(runs, dtype=bool)
            agree = total = 0
            for _ in range(cells):
                for start in range(0, runs, args.chunk):
                    size = min(args.chunk, runs - start)
                    ref, cand = model.runs(size, drop_points=tax, rng=rng, questions=questions)
                    any_failed[start:start + size] |= fixed_decisions(ref, cand, ACC.fp8_tax_points)
            if n == 1319 and flips == 0.15:  # whole 32-cell runs through the gate
                for _ in range(args.cli_run_level):
                    run = gate.folder()
                    expected = {}
                    for cell in range(cells):
                        ref, cand = model.runs(1, drop_points=tax, rng=rng, questions=questions)
                        model_name = f"bench/model-{cell:02d}"
                        write_pair(run, "fp8_accuracy", ref[0], cand[0], rng, model=model_name)
                        expected[model_name] = bool(fixed_decisions(ref, cand, ACC.fp8_tax_points)[0])
                    verdict = gate.judge(run)
                    for check in verdict["checks"]:
                        if check["kind"] == "fp8_accuracy" and check["subject"] == "strict-match":
                            agree += check["status"] == ("fail" if expected[check["model"]] else "pass")
                            total += 1
            rate = float(any_failed.mean())
            cli = f"{agree}/{total}" if total else ""
            lines.append(f"  {n:>6}  {100 * flips:4.0f} %   {pct(rate, runs)}   {cli:>10}")
    return lines


def sequential_decisions(design: sequential.Design, reference: np.ndarray,
                         candidate: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The runner's procedure, vectorised: decide() at each look on the prefix; (failed, questions used)."""
    runs = reference.shape[0]
    b = np.cumsum(reference & ~candidate, axis=1)
    c = np.cumsum(~reference & candidate, axis=1)
    alive = np.ones(runs, dtype=bool)
    failed = np.zeros(runs, dtype=bool)
    used = np.zeros(runs, dtype=np.int64)
    bounds = design.bounds
    for k, n in enumerate(design.looks):
        bk, ck = b[:, n - 1], c[:, n - 1]
        log_p = margins.margin_log_p(bk, ck, n, design.margin_points / 100)
        log_q = margins.reverse_margin_log_p(bk, ck, n, (design.margin_points + design.gap_points) / 100)
        fail = alive & (log_p <= float(distributions.log_normal_sf(bounds.efficacy[k])))
        if k == len(design.looks) - 1:
            stop = alive
        else:
            stop = fail | (alive & (-distributions.z_from_log_p(log_q) <= bounds.futility[k]))
        used[alive & stop] = n
        failed |= fail
        alive &= ~stop
    return failed, used


def sequential_table(args: argparse.Namespace, gate: Gate, rng: np.random.Generator) -> list[str]:
    looks = sequential.looks_for(ACC.sequential.max_questions, ACC.sequential.looks)
    runs = args.sequential_runs
    lines = ["", f"ACCURACY, group-sequential (looks at {', '.join(map(str, looks))}; the fixed design needs "
             f"{ACC.questions}): E[questions] / {ACC.questions} and P(fail) %; {runs} simulated comparisons each",
             "check (margin)   flips     drop   E[n]/fixed    P(fail) %   CLI agrees (decision and look)"]
    for kind, margin in (("fp8_accuracy", ACC.fp8_tax_points), ("baseline_accuracy", ACC.baseline_margin_points)):
        design = sequential.design(looks, alpha=ACC.alpha, beta=1 - ACC.power, rho=ACC.sequential.beta_spending_rho,
                                   margin_points=margin, gap_points=ACC.gap_points)
        drops = (0.0, 1.6, margin, margin + ACC.gap_points) if kind == "fp8_accuracy" else \
            (0.0, margin / 2, margin, margin + ACC.gap_points)
        for flips in FLIPS:
            model = QuestionModel(n=looks[-1], flips=flips, seed=looks[-1])
            questions = model.questions()
            for drop in drops:
                failed = used = 0.0
                agree = total = 0
                for start in range(0, runs, args.chunk):
                    size = min(args.chunk, runs - start)
                    ref, cand = model.runs(size, drop_points=drop, rng=rng, questions=questions)
                    fail, n_used = sequential_decisions(design, ref, cand)
                    failed += float(fail.sum())
                    used += float(n_used.sum())
                    if start == 0 and flips == 0.10:
                        record = {"design": sequential.DESIGN_NAME, "looks": list(looks)}
                        order = list(range(looks[-1]))  # the arrays are already in the seeded order
                        for i in range(min(args.cli_runs // 2, size)):
                            run = gate.folder()
                            stop = int(n_used[i])
                            write_pair(run, kind, ref[i], cand[i, :stop], rng, reference_ids=order,
                                       candidate_ids=order[:stop], record=record)
                            check = check_of(gate.judge(run), kind)
                            agree += (check["status"] == ("fail" if fail[i] else "pass")
                                      and check["figures"].get("look") == looks.index(stop) + 1)
                            total += 1
                rate = failed / runs
                cli = f"{agree}/{total}" if total else ""
                lines.append(f"{kind[:-9]:>8} ({margin:g})  {100 * flips:4.0f} %  {drop:6.2f}   "
                             f"{used / runs / ACC.questions:10.3f}   {pct(rate, runs)}   {cli:>8}")
    return lines


# ---------------------------------------------------------------------------------------------- throughput

def throughput_samples(rng: np.random.Generator, *, rounds: int, slowdown: float, interleaved: bool,
                       repeat_sd: float, round_sd: float, run_sd: float) -> tuple[np.ndarray, np.ndarray]:
    """(baseline, current) repeats in req/s. Interleaved: one run, a drift shared by each round's two repeats.
    Stored: two runs, each with its own level (run_sd) and its own drifts."""
    level = 3.22
    if interleaved:
        common = rng.normal(0, run_sd) + rng.normal(0, round_sd, rounds)
        base = level * np.exp(common + rng.normal(0, repeat_sd, rounds))
        head = level * (1 - slowdown) * np.exp(common + rng.normal(0, repeat_sd, rounds))
        return base, head
    base = level * np.exp(rng.normal(0, run_sd) + rng.normal(0, round_sd, rounds) + rng.normal(0, repeat_sd, rounds))
    head = level * (1 - slowdown) * np.exp(rng.normal(0, run_sd) + rng.normal(0, round_sd, rounds)
                                           + rng.normal(0, repeat_sd, rounds))
    return base, head


def throughput_decision(base: np.ndarray, head: np.ndarray, interleaved: bool) -> bool:
    rounds = range(1, base.size + 1)
    if interleaved:
        test = margins.paired_ratio_test(dict(zip(rounds, base, strict=True)), dict(zip(rounds, head, strict=True)),
                                       min_ratio=1 - TPUT.tolerance, alpha=TPUT.alpha)
    else:
        test = margins.unpaired_ratio_test(base, head, min_ratio=1 - TPUT.tolerance, alpha=TPUT.alpha_unpaired,
                                         run_to_run_sd=TPUT.run_to_run_sd)
    return test.regressed


def judge_throughput(gate: Gate, base: np.ndarray, head: np.ndarray, interleaved: bool) -> str:
    """Through the gate: a stored baseline with `kvgate gate --baseline`; interleaved A/B repeats through the
    throughput check on loaded folders (evaluate() does not pass the interleaved flag yet)."""
    run, stored = gate.folder(), gate.folder()
    for folder, values in ((stored, base), (run, head)):
        cell = write_cell(folder, backend=BACKEND, kv_cache_dtype="auto", arch=ARCH, model=MODEL)
        write_throughput(cell, [float(v) for v in values])
    if not interleaved:
        status = check_of(gate.judge(run, "--baseline", str(stored)), "throughput", subject=None)["status"]
        shutil.rmtree(stored)
        return status
    matrix = matrix_module.load()
    known = KnownNames.from_matrix(matrix)
    started = time.perf_counter()
    head_run, base_run = load_run(run, known), load_run(stored, known)
    check, pending = throughput_checks.throughput_check(head_run.cells[0], base_run, POLICY, (), ab=True, interleaved=True)
    decided = pending_checks.decide(pending, None) if pending else check
    gate.seconds += time.perf_counter() - started
    gate.calls += 1
    shutil.rmtree(run)
    shutil.rmtree(stored)
    return decided.status


def throughput_table(args: argparse.Namespace, gate: Gate, rng: np.random.Generator) -> list[str]:
    runs = args.throughput_runs
    rounds = TPUT.rounds
    lines = ["", f"THROUGHPUT, per cell: P(fail) in % at the true slowdown; tolerance {100 * TPUT.tolerance:g} %, "
             f"alpha {TPUT.alpha:g} interleaved / {TPUT.alpha_unpaired:g} not, {rounds} repeats a side; {runs} "
             "simulated comparisons per figure",
             "mode                          SD    slow 0   slow tol/2   slow tol   power 10 %   CLI agrees"]
    scenarios = []
    for sd in (0.02, 0.03):  # interleaved: every repeat its own noise at sd, a 2 % drift shared by each round
        scenarios.append(("interleaved A/B (repeat SD)", sd, True, dict(repeat_sd=sd, round_sd=0.02, run_sd=0.03)))
    for sd in (0.02, 0.03):  # stored: each run its own level at sd, repeats 1 % apart, 1 % drift
        scenarios.append(("stored baseline (run SD)", sd, False, dict(repeat_sd=0.01, round_sd=0.01, run_sd=sd)))
    for label, sd, interleaved, noise in scenarios:
        rates, agree, total = [], 0, 0
        for slowdown in (0.0, TPUT.tolerance / 2, TPUT.tolerance, 0.10):
            failed = 0
            for i in range(runs):
                base, head = throughput_samples(rng, rounds=rounds, slowdown=slowdown, interleaved=interleaved, **noise)
                decision = throughput_decision(base, head, interleaved)
                failed += decision
                if i < args.cli_runs and slowdown in (TPUT.tolerance, 0.10):
                    agree += judge_throughput(gate, base, head, interleaved) == ("fail" if decision else "pass")
                    total += 1
            rates.append(failed / runs)
        lines.append(f"{label:<28} {100 * sd:2.0f} %  " + "  ".join(pct(r, runs) for r in rates)
                     + f"  {agree}/{total:<4}")
    # run level: 32 cells on unchanged code, A/B at 3 % repeat SD and stored at 3 % run SD
    cells = 32
    for label, interleaved, noise in (("interleaved A/B, 3 %", True, dict(repeat_sd=0.03, round_sd=0.02, run_sd=0.03)),
                                      ("stored baseline, 3 %", False, dict(repeat_sd=0.01, round_sd=0.01,
                                                                         run_sd=0.03))):
        level_runs = max(200, runs // 8)
        any_failed = 0
        for _ in range(level_runs):
            any_failed += any(throughput_decision(*throughput_samples(rng, rounds=rounds, slowdown=0.0,
                                                                      interleaved=interleaved, **noise), interleaved)
                              for _ in range(cells))
        lines.append(f"run level, {cells} unchanged cells, {label}: P(run fails) {pct(any_failed / level_runs, level_runs)} %"
                     f" ({level_runs} runs)")
    return lines


def engine_table(args: argparse.Namespace, gate: Gate, rng: np.random.Generator) -> list[str]:
    """The design every workload runs today (matrix/workloads.toml: one engine a side, a warm-up, then `repeats`
    repeats), at each [[throughput.measured_noise]] figure of the policy that has an engine SD: an engine's level
    drawn once per side (the true engine SD: the policy's, then 2x and 4x it, what a lucky measurement would hide),
    repeats around it at the measured repeat SD. The test is the gate's (margins.engine_ratio_test with the policy's
    engine SD); a subset goes through `kvgate gate --require-baseline` on A/B folders as the runners write them."""
    runs = args.throughput_runs
    workloads = matrix_module.load().workloads
    lines = ["", f"THROUGHPUT, the engine design (one engine a side): P(fail) in % at the true slowdown; tolerance "
             f"{100 * TPUT.tolerance:g} %, alpha {TPUT.alpha:g}; {runs} simulated A/B runs per figure",
             "cell (workload)                             true engine SD    slow 0   slow tol   power 10 %   CLI agrees"]
    level = 5.11
    for noise in TPUT.measured_noise:
        if noise.engine_sd is None or noise.workload not in workloads:
            continue
        repeats = int(workloads[noise.workload].throughput["repeats"])
        model = workloads[noise.workload].model
        backend, dtype = noise.cell.rsplit("-", 2)[0].upper(), noise.cell.rsplit("-", 2)[1]
        for factor in (1, 2, 4):
            true_sd = noise.engine_sd * factor
            rates, agree, total = [], 0, 0
            for slowdown in (0.0, TPUT.tolerance, 0.10):
                levels = rng.normal(0, true_sd, (runs, 2))
                failed = 0
                for i in range(runs):
                    sides = [level * (1 - s) * np.exp(levels[i, k] + rng.normal(0, noise.repeat_sd, repeats))
                             for k, s in enumerate((0.0, slowdown))]
                    test = margins.engine_ratio_test([sides[0]], [sides[1]], min_ratio=1 - TPUT.tolerance,
                                                     alpha=TPUT.alpha, engine_sd=(noise.engine_sd, noise.engine_sd))
                    decision = margins.throughput_regressed(test, alpha=TPUT.alpha)
                    failed += decision
                    if factor == 1 and i < args.cli_runs and slowdown in (TPUT.tolerance, 0.10):
                        run = write_engines_ab_run(gate.folder(), [list(map(float, sides[0]))],
                                                   [list(map(float, sides[1]))], backend=backend,
                                                   kv_cache_dtype=dtype, arch=noise.arch, model=model)
                        status = check_of(gate.judge(run, "--require-baseline"), "throughput", cell=noise.cell,
                                          subject=None)["status"]
                        agree += status == ("fail" if decision else "pass")
                        total += 1
                rates.append(failed / runs)
            label = f"{noise.cell} ({noise.workload})"
            agreed = f"{agree}/{total}" if total else "-"
            lines.append(f"{label:<43} {100 * true_sd:5.2f} % (x{factor})  " + "  ".join(pct(r, runs) for r in rates)
                         + f"  {agreed}")
    return lines


# ---------------------------------------------------------------------------------------------- main

def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20000, help="simulated comparisons per accuracy figure")
    parser.add_argument("--run-level-runs", type=int, default=4000)
    parser.add_argument("--sequential-runs", type=int, default=10000)
    parser.add_argument("--throughput-runs", type=int, default=20000)
    parser.add_argument("--cli-runs", type=int, default=25, help="of those, judged through `kvgate gate` per row")
    parser.add_argument("--cli-run-level", type=int, default=2, help="whole 32-cell runs through `kvgate gate`")
    parser.add_argument("--chunk", type=int, default=2000)
    parser.add_argument("--quick", action="store_true", help="a few hundred runs per figure (a smoke test)")
    parser.add_argument("--seed", type=int, default=20261130)
    parser.add_argument("--only", nargs="+", default=None, metavar="SECTION",
                        help="run these sections only (accuracy, run, sequential, throughput, engines)")
    args = parser.parse_args()
    if args.quick:
        args.runs = args.sequential_runs = args.throughput_runs = 400
        args.run_level_runs, args.cli_runs, args.cli_run_level, args.chunk = 200, 4, 1, 400
    rng = np.random.default_rng(args.seed)
    gate = Gate()
    started = time.perf_counter()
    print(f"kvgate gate simulation: policy {POLICY.source}; accuracy alpha {ACC.alpha:g} per check at the margin, "
          f"primary filter {ACC.primary_filter}; questions: accuracy 0.65, difficulty logit SD 2, fragile flips; "
          f"seed {args.seed}")
    sections: list[tuple[str, Callable[..., list[str]]]] = [
        ("accuracy per cell", accuracy_cell_table), ("run level", run_level_table),
        ("sequential", sequential_table), ("throughput", throughput_table), ("engines", engine_table)]
    try:
        for name, section in sections:
            if args.only and name.split()[0] not in args.only:
                continue
            t0 = time.perf_counter()
            for line in section(args, gate, rng):
                print(line, flush=True)
            print(f"({name}: {time.perf_counter() - t0:.0f} s)", flush=True)
    finally:
        gate.close()
    print(f"\n{gate.calls} verdicts through the gate ({gate.seconds:.0f} s of it); total {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
