"""The gate's outputs before and after a change to kvgate.statistics: capture them, then compare.

    PYTHONPATH=src python benchmarks/scipy_parity.py capture OUT [--quick]
    python benchmarks/scipy_parity.py --compare BEFORE AFTER

`capture` judges every results folder the tests judge (tests/fixtures: the real CPU run, the H200 run, the H200
canary and path runs, the recorded CI canaries), each with the matrix and policy its tests use, and generated runs
(tests/synthetic_run.QuestionModel through benchmarks/gate_simulation's writers: FP8-vs-auto and A/B comparisons
at several sizes, drops and seeds, sequential comparisons stopped where the runner stops, throughput against a
stored baseline) with `kvgate gate` in-process; it keeps each case's verdict.json and report.md, the output of
`kvgate power` for a few settings, and a grid of kvgate.statistics' values over a wide range of inputs, extreme
tails included (grid.json).

`--compare` exits 0 when every decision and every string is identical and every number agrees to 6 significant
digits (relative difference <= 1e-6, or both within 1e-12 of 0); else 1, naming the first difference of each file
(and of each function of the grid). It prints the cases compared and the largest relative difference. Log-space
values are compared as the gate reports them: clamped at log(TINY_P), since no p-value below TINY_P is ever
reported (kvgate.statistics.margins.reported_p).

Run `capture` in a checkout of the code before a change and in one after it, then `--compare`. Written for issue
24's move from kvgate's hand-written special functions to scipy.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import itertools
import json
import math
import re
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures"
RELATIVE = 1e-6  # 6 significant digits
ABSOLUTE = 1e-12  # figures that are 0 on one side and rounding noise on the other
LOG_TINY_P = math.log(sys.float_info.min)
TINY = "kvgate:tiny-llama"  # kvgate's local task holds the policy's questions: its plan is 1331 in 4 looks
_NUMBER = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")


# ---------------------------------------------------------------------------------------------- capture

def _matrix(folder: Path, *, workloads: Path | None = None, policy: Path | None = None,
            edit: Callable[[Path], None] | None = None) -> Path:
    folder.mkdir(parents=True)
    for toml in (ROOT / "matrix").glob("*.toml"):
        shutil.copy(toml, folder / toml.name)
    if workloads:
        shutil.copy(workloads, folder / "workloads.toml")
    if policy:
        shutil.copy(policy, folder / "policy.toml")
    if edit:
        edit(folder)
    return folder


def _without_lite_tax(folder: Path) -> None:
    policy = folder / "policy.toml"
    policy.write_text("".join(line for line in policy.read_text().splitlines(keepends=True)
                              if not line.startswith('"deepseek-ai/DeepSeek-V2-Lite-Chat" = ')))


def _h200_local_mla(folder: Path) -> None:
    workloads = folder / "workloads.toml"
    workloads.write_text(workloads.read_text().replace('model = "kvgate:tiny-deepseek-v2"',
                                                       'model = "/tmp/h200/models/tiny-deepseek-v2"'))
    _without_lite_tax(folder)


def _calculated(folder: Path) -> None:
    workloads = folder / "workloads.toml"
    text = workloads.read_text()
    for name in ("tiny-llama-any", "tiny-deepseek-v2-any"):
        text = text.replace(f"[workloads.{name}]\n", f"[workloads.{name}]\ncalculate_kv_scales = true\n")
    workloads.write_text(text)
    _without_lite_tax(folder)


def _unpack(archive: Path, folder: Path) -> Path:
    sys.path.insert(0, str(ROOT / "tests"))
    from archives import extract  # safe on every declared Python (3.11.2 has no tarfile data filter)

    return extract(archive, folder)


def fixture_cases(scratch: Path) -> Iterator[tuple[str, Path, list[str]]]:
    """(case name, results folder, the gate's options) for every recorded run the tests judge."""
    sys.path.insert(0, str(ROOT / "tests"))
    from cpu_run_fixture import extract, matrix_of_the_run

    scratch.mkdir(parents=True)
    cpu_matrix = matrix_of_the_run(scratch / "cpu-matrix")
    yield "cpu_run", extract(scratch / "cpu"), ["--matrix-dir", str(cpu_matrix), "--policy",
                                                str(cpu_matrix / "policy.toml"), "--today", "2026-11-30"]
    h200_workloads = ROOT / "benchmarks" / "h200_engine" / "workloads.toml"
    h200 = _matrix(scratch / "h200-matrix", workloads=h200_workloads, edit=_h200_local_mla)
    yield "h200_run", _unpack(FIXTURES / "h200_run" / "run.tar.xz", scratch / "h200") / "run", [
        "--matrix-dir", str(h200), "--policy", str(h200 / "policy.toml"), "--today", "2026-12-01"]
    canaries = _matrix(scratch / "canaries-matrix", workloads=h200_workloads,
                       policy=FIXTURES / "h200_canaries" / "policy.toml")
    for run in sorted((_unpack(FIXTURES / "h200_canaries" / "runs.tar.xz", scratch / "canaries") / "ab").iterdir()):
        yield f"h200_canaries/{run.name}", run, ["--require-baseline", "--matrix-dir", str(canaries), "--policy",
                                                 str(canaries / "policy.toml"), "--today", "2026-12-01"]
    paths = _unpack(FIXTURES / "h200_canaries" / "paths-runs.tar.xz", scratch / "paths")
    for name, edit in (("context", _without_lite_tax), ("calculated", _calculated)):
        matrix = _matrix(scratch / f"paths-matrix-{name}", workloads=h200_workloads, edit=edit)
        for run in sorted((paths / name / "ab").iterdir()):
            yield f"h200_paths/{name}/{run.name}", run, ["--require-baseline", "--matrix-dir", str(matrix),
                                                         "--policy", str(matrix / "policy.toml"), "--today",
                                                         "2026-12-02"]
    recorded = _unpack(FIXTURES / "canaries" / "ci-canaries.tar.xz", scratch / "ci-canaries")
    for name in ("fp8-scale-mismatch", "harmless-refactor"):
        started = json.loads((recorded / name / "run.json").read_text())["started_at"][:10]
        yield f"ci_canaries/{name}", recorded / name, ["--require-baseline", "--today", started]


def generated_cases(scratch: Path, quick: bool) -> Iterator[tuple[str, Path, list[str]]]:
    """Runs written by the simulation's writers: every accuracy kind, sizes, drops and seeds; sequential stops;
    throughput against a stored baseline."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import gate_simulation as sim

    from kvgate.matrix.cells import cell_id
    from kvgate.statistics import sequential
    from synthetic_run import QuestionModel, ab_run_axes, write_ab_run, write_status

    acc = sim.ACC
    seeds = (1, 2) if quick else (1, 2, 3)
    for kind, margin in (("fp8_accuracy", acc.fp8_tax_points), ("baseline_accuracy", acc.baseline_margin_points)):
        for n in (240, 1319):
            for seed in seeds:
                model = QuestionModel(n=n, flips=0.10, seed=seed)
                questions = model.questions()
                rng = np.random.default_rng(seed)
                for drop in (0.0, margin, margin + acc.gap_points):
                    ref, cand = model.runs(1, drop_points=drop, rng=rng, questions=questions)
                    run = scratch / f"{kind[:-9]}-{n}-{seed}-{drop:g}"
                    sim.write_pair(run, kind, ref[0], cand[0], rng)
                    yield f"generated/{run.name}", run, ["--today", sim.TODAY]
    # sequential comparisons as tests/test_sequential.py writes them: the tiny model's plan, the FP8 cell stopped
    # where the runner stops (sim.sequential_decisions is the runner's procedure, vectorised)
    plan = {"design": sequential.DESIGN_NAME, "questions": 1331, "looks": [333, 666, 999, 1331]}
    design = sequential.design(plan["looks"], alpha=acc.alpha, beta=1 - acc.power,
                               rho=acc.sequential.beta_spending_rho, margin_points=acc.fp8_tax_points,
                               gap_points=acc.gap_points)
    model = QuestionModel(n=plan["questions"], flips=0.05, seed=11)
    questions = model.questions()
    for seed in seeds:
        rng = np.random.default_rng(100 + seed)
        for drop in (0.0, 2.0, acc.fp8_tax_points, acc.fp8_tax_points + acc.gap_points):
            ref, cand = model.runs(1, drop_points=drop, rng=rng, questions=questions)
            _, used = sim.sequential_decisions(design, ref, cand)
            stop = int(used[0])
            run = scratch / f"sequential-{seed}-{drop:g}"
            for dtype, outcomes, record in (("auto", ref[0], {**plan, "answered": plan["questions"]}),
                                            ("fp8", cand[0, :stop], {**plan, "answered": stop})):
                cell = sim.write_cell(run, backend="FLASHMLA", kv_cache_dtype=dtype, arch="sm90", model=TINY,
                                      task="kvgate_gsm8k_local", extra={"contract_version": "1.6"})
                sim.write_accuracy(cell, {"strict-match": outcomes.tolist(), "flexible-extract": outcomes.tolist()},
                                   task="kvgate_gsm8k_local", model=TINY)
                evidence = {"element_bytes": [1], "layer_kv_cache_dtypes": ["fp8"]} if dtype == "fp8" else None
                write_status(cell, {"accuracy": {"status": "ok", "question_plan": record,
                                                 **({"kv_cache": evidence} if evidence else {})}})
            yield f"generated/{run.name}", run, ["--today", sim.TODAY]
    # whole A/B runs: base and head of every cell, interleaved throughput, kernels
    for seed in seeds:
        axes = ab_run_axes(8, ("FLASH_ATTN", "FLASHINFER"))
        run = write_ab_run(scratch / f"ab-{seed}", axes, n=400, seed=seed,
                           head_drop={cell_id(*axes[seed]): 20 * seed}, slower={cell_id(*axes[seed + 1]): 0.9})
        yield f"generated/{run.name}", run, ["--require-baseline", "--today", sim.TODAY]
    for seed in seeds:
        rng = np.random.default_rng(200 + seed)
        for slowdown in (0.0, sim.TPUT.tolerance, 0.10):
            base, head = sim.throughput_samples(rng, rounds=sim.TPUT.rounds, slowdown=slowdown, interleaved=False,
                                                repeat_sd=0.01, round_sd=0.01, run_sd=0.02)
            run, stored = scratch / f"throughput-{seed}-{slowdown:g}", scratch / f"stored-{seed}-{slowdown:g}"
            for folder, values in ((stored, base), (run, head)):
                cell = sim.write_cell(folder, backend=sim.BACKEND, kv_cache_dtype="auto", arch=sim.ARCH,
                                      model=sim.MODEL)
                sim.write_throughput(cell, [float(v) for v in values])
            yield f"generated/{run.name}", run, ["--baseline", str(stored), "--today", sim.TODAY]


POWER_SETTINGS = {
    "policy": [],
    "readme": ["--discordance", "0.033", "--n", "240", "--margin", "3", "--target-drop", "12"],
    "baseline": ["--discordance", "0.01", "0.05", "--n", "1331", "--margin", "1", "--repeat-sd", "0.01", "0.05"],
}


def grid() -> dict[str, list]:
    """kvgate.statistics' values over wide inputs; a function the move deleted is looked up as its replacement."""
    from scipy import special, stats

    from kvgate.statistics import distributions as dist
    from kvgate.statistics import margins, power, sequential

    def old_or(name: str, replacement: Callable) -> Callable:
        return getattr(dist, name, None) or getattr(power, name, None) or replacement

    xs = [-37.0, -8.0, -1.5, -1e-3, 0.0, 1e-3, 0.5, 1.0, 2.326, 5.0, 8.0, 12.0, 29.99, 30.01, 37.5, 60.0, 1e3]
    dfs = [1.0, 2.0, 3.0, 4.5, 7.0, 12.0, 30.0, 200.0, 1e4, 1e6]
    ts = [-1e80, -1e5, -200.0, -40.0, -6.0, -2.0, -0.3, 0.0, 0.7, 3.0, 50.0]
    probabilities = [1e-300, 1e-12, 1e-4, 0.01, 0.05, 0.3, 0.5, 0.9, 0.975, 0.999, 1 - 1e-9]
    log_ps = [-5000.0, -709.0, -300.0, -40.0, -4.6, -0.7, -1e-6, 0.0]
    t_cdf = old_or("student_t_cdf", lambda t, df: float(special.stdtr(df, t)))
    t_ppf = old_or("student_t_ppf", lambda p, df: float(special.stdtrit(df, p)))
    beta = old_or("regularized_incomplete_beta", lambda a, b, x: float(special.betainc(a, b, x)))
    nct = old_or("noncentral_t_cdf", lambda x, df, ncp: float(special.nctdtr(df, ncp, x)))
    binomial = old_or("binomial_log_cdf", lambda k, n, p: float(stats.binom.logcdf(k, n, p)))
    out: dict[str, list] = {
        "log_normal_sf": [[x, float(dist.log_normal_sf(x))] for x in xs],
        "normal_mills_ratio": [[x, float(dist.normal_mills_ratio(x))] for x in xs],
        "normal_sf": [[x, dist.normal_sf(x)] for x in xs],
        "normal_quantile": [[p, dist.normal_quantile(p)] for p in probabilities],
        "z_from_log_p": [[lp, float(dist.z_from_log_p(lp))] for lp in log_ps],
        "t_log_cdf": [[t, df, dist.t_log_cdf(t, df)] for t in ts for df in dfs],
        "t_quantile": [[p, df, dist.t_quantile(p, df)] for p in probabilities[2:] for df in dfs],
        "student_t_cdf": [[t, df, t_cdf(t, df)] for t in ts for df in dfs],
        "student_t_ppf": [[p, df, t_ppf(p, df)] for p in probabilities[2:] for df in dfs],
        "regularized_incomplete_beta": [[a, b, x, beta(a, b, x)] for a in (0.5, 2.0, 15.0, 600.0)
                                        for b in (0.5, 3.0, 40.0) for x in (1e-6, 0.1, 0.5, 0.93, 1 - 1e-9)],
        "noncentral_t_cdf": [[x, df, ncp, nct(x, df, ncp)] for x in (-3.0, -1.8, 0.0, 2.5) for df in (1.0, 4.0, 19.0)
                             for ncp in (-4.0, -1.0, 0.0, 2.0)],
        "binomial_log_cdf": [[k, n, p, binomial(k, n, p)] for n in (1, 40, 240, 1319) for k in (0, n // 3, n - 1)
                             for p in (1e-3, 0.3, 0.85, 0.999)],
    }
    b, c, n = np.meshgrid([0, 3, 20, 60, 150], [0, 2, 15, 40], [240, 1319, 4000], indexing="ij")
    for margin in (0.0, 0.01, 0.03, 0.2):
        out[f"margin_log_p {margin}"] = np.column_stack(
            [b.ravel(), c.ravel(), n.ravel(), margins.margin_log_p(b.ravel(), c.ravel(), n.ravel(), margin)]).tolist()
    out["margin_test"] = [[bb, cc, nn, *(getattr(margins.margin_test(
        margins.PairedCounts(nn - bb - cc - 10, bb, cc, 10), margin_points=3, alpha=0.01), f)
        for f in ("p_value", "lower_points", "upper_points"))] for bb, cc, nn in ((0, 0, 240), (12, 3, 240),
                                                                                  (60, 2, 1319), (30, 29, 1319))]
    out["floor_test"] = [[k, nn, floor, test.p_value, test.upper] for k, nn, floor in
                         ((0, 240, 0.5), (150, 240, 0.7), (180, 300, 0.5), (1100, 1319, 0.85), (240, 240, 0.9))
                         for test in [margins.floor_test(k, nn, floor=floor, alpha=0.01)]]
    rng = np.random.default_rng(7)
    for scale in (0.01, 1e-7):
        base, cur = 3.2 * np.exp(rng.normal(0, scale, 7)), 3.0 * np.exp(rng.normal(0, scale, 7))
        paired = margins.paired_ratio_test(dict(enumerate(base)), dict(enumerate(cur)), min_ratio=0.95, alpha=0.01)
        unpaired = margins.unpaired_ratio_test(base, cur, min_ratio=0.95, alpha=0.001, run_to_run_sd=0.02)
        out[f"ratio_tests {scale}"] = [[t.p_value, t.lower, t.upper, t.df] for t in (paired, unpaired)]
    out["rejection_probability"] = [[nn, flips, drop, power.rejection_probability(
        nn, *power.paired_probabilities(flips=flips, drop_points=drop), margin_points=3, alpha=0.01)]
        for nn in (240, 1319) for flips in (0.0, 0.033, 0.15) for drop in (0.0, 3.0, 6.0, 12.0)]
    out["questions_needed"] = [[m, flips, power.questions_needed(margin_points=m, target_points=m + 3, flips=flips,
                                                                 alpha=0.01)] for m in (1, 3) for flips in (0.01, 0.1)]
    out["paired_rounds_power"] = [[r, sd, power.paired_rounds_power(r, repeat_sd=sd, tolerance=0.05, slowdown=0.1,
                                                                    alpha=0.01)] for r in (2, 3, 7, 20) for sd in (0.02, 0.05)]
    bounds = sequential.boundaries((0.25, 0.5, 0.75, 1.0), alpha=0.01, beta=0.1, rho=2.0)
    out["boundaries"] = [list(bounds.efficacy), list(bounds.futility), [bounds.drift, bounds.inflation]]
    out["stagewise_log_p"] = [[k, z, sequential.stagewise_log_p(bounds, k, z)] for k in (1, 2, 4) for z in (0.5, 3.0, 9.0)]
    out["operating"] = [list(sequential.operating(bounds, d).fail_at) for d in (-1.0, 0.0, 1.0)]
    return out


def capture(out: Path, quick: bool) -> None:
    from kvgate.cli import main as kvgate

    out.mkdir(parents=True, exist_ok=True)
    (out / "grid.json").write_text(json.dumps(grid(), indent=1) + "\n")
    for name, options in POWER_SETTINGS.items():
        text = io.StringIO()
        with contextlib.redirect_stdout(text):
            status = kvgate(["power", *options])
        (out / "power" / name).mkdir(parents=True, exist_ok=True)
        (out / "power" / name / "stdout.txt").write_text(f"exit {status}\n{text.getvalue()}")
    with tempfile.TemporaryDirectory(prefix="kvgate-parity-") as scratch:
        cases = [*fixture_cases(Path(scratch) / "fixtures"), *generated_cases(Path(scratch) / "generated", quick)]
        for name, run, options in cases:
            folder = out / "cases" / name
            with contextlib.redirect_stdout(io.StringIO()) as printed, contextlib.redirect_stderr(io.StringIO()):
                status = kvgate(["gate", str(run), "--out", str(folder), *options])
            if status not in (0, 1):
                raise SystemExit(f"kvgate gate exited {status} on {name}: {printed.getvalue()}")
            (folder / "stdout.txt").write_text(f"exit {status}\n{printed.getvalue()}")
            for extra in ("report.html", "junit.xml"):
                (folder / extra).unlink(missing_ok=True)
            for kept in folder.iterdir():  # where the scratch folder and the checkout lie is no output
                kept.write_text(kept.read_text().replace(scratch, "SCRATCH").replace(str(ROOT), "REPO"))
            print(f"{name}: exit {status}", flush=True)


# ---------------------------------------------------------------------------------------------- compare

class Comparison:
    def __init__(self) -> None:
        self.values = 0
        self.clamped = 0  # log-space values that differ only below log(TINY_P)
        self.largest: dict[str, tuple[float, str]] = {}  # "gate" (verdicts, reports, power) | "grid" -> (rel, where)

    def number(self, a: float, b: float, where: str, log_space: bool = False) -> str | None:
        self.values += 1
        if log_space and a != b and max(a, b) <= LOG_TINY_P:
            self.clamped += 1
        if log_space:
            a, b = max(a, LOG_TINY_P), max(b, LOG_TINY_P)
        if a == b or (math.isnan(a) and math.isnan(b)):
            return None
        difference = abs(a - b)
        relative = difference / max(abs(a), abs(b))
        group = "grid" if where.startswith("grid.json") else "gate"
        if relative > self.largest.get(group, (0.0, ""))[0] and difference > ABSOLUTE:
            self.largest[group] = (relative, where)
        if relative <= RELATIVE or difference <= ABSOLUTE:
            return None
        return f"{where}: {a!r} before, {b!r} after (relative difference {relative:.2e})"

    def value(self, a: Any, b: Any, where: str, log_space: bool = False) -> str | None:
        if isinstance(a, bool) or isinstance(b, bool) or isinstance(a, str) or a is None or b is None:
            return None if a == b else f"{where}: {a!r} before, {b!r} after"
        if isinstance(a, (int, float)) and isinstance(b, (int, float)):
            return self.number(float(a), float(b), where, log_space)
        if isinstance(a, dict) and isinstance(b, dict):
            if a.keys() != b.keys():
                return f"{where}: keys {sorted(a.keys() ^ b.keys())} on one side only"
            return next((d for k in a if (d := self.value(a[k], b[k], f"{where}.{k}", log_space))), None)
        if isinstance(a, list) and isinstance(b, list):
            if len(a) != len(b):
                return f"{where}: {len(a)} items before, {len(b)} after"
            return next((d for i, (x, y) in enumerate(zip(a, b, strict=True))
                         if (d := self.value(x, y, f"{where}[{i}]", log_space))), None)
        return f"{where}: {type(a).__name__} before, {type(b).__name__} after"

    def text(self, a: str, b: str, where: str) -> str | None:
        if _NUMBER.sub("#", a) != _NUMBER.sub("#", b):
            lines = itertools.zip_longest(a.splitlines(), b.splitlines(), fillvalue="")
            line = next(i for i, (x, y) in enumerate(lines) if _NUMBER.sub("#", x) != _NUMBER.sub("#", y))
            return f"{where}, line {line + 1}: the text differs (not only in its numbers)"
        return self.value([float(x) for x in _NUMBER.findall(a)], [float(x) for x in _NUMBER.findall(b)], where)


def compare(before: Path, after: Path) -> int:
    files = sorted(p.relative_to(before) for p in before.rglob("*") if p.is_file())
    missing = sorted({p.relative_to(after) for p in after.rglob("*") if p.is_file()} ^ set(files))
    if missing:
        print(f"DIFFERENT {missing[0]}: present on one side only")
        return 1
    comparison = Comparison()
    differences = []
    for path in files:
        a, b = (before / path).read_text(), (after / path).read_text()
        if path.name == "grid.json":  # each function's values apart; the log-space ones as the gate reports them
            old, new = json.loads(a), json.loads(b)
            differences += [d for k in old if (d := comparison.value(old[k], new[k], f"{path}:{k}",
                                                                     "log" in k.split()[0]))]
        elif path.suffix == ".json":
            differences.append(comparison.value(json.loads(a), json.loads(b), str(path)))
        else:
            differences.append(comparison.text(a, b, str(path)))
    differences = [d for d in differences if d]
    for difference in differences:
        print(f"DIFFERENT {difference}")
    cases = len({p.parent for p in files if p.parts[0] == "cases"})
    largest = "; ".join(f"{group} {relative:.2e} ({where})" for group, (relative, where) in
                        sorted(comparison.largest.items())) or "none"
    print(f"{'DIFFERENT' if differences else 'equal'}: {cases} gated cases, {len(files)} files, {comparison.values} "
          f"numbers ({comparison.clamped} log-space values differ only below log(TINY_P)); largest relative "
          f"difference: {largest}")
    return 1 if differences else 0

def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--compare", nargs=2, type=Path, metavar=("BEFORE", "AFTER"))
    parser.add_argument("action", nargs="?", choices=["capture"])
    parser.add_argument("out", nargs="?", type=Path)
    parser.add_argument("--quick", action="store_true", help="fewer generated runs")
    args = parser.parse_args()
    if args.compare:
        raise SystemExit(compare(*args.compare))
    if args.action != "capture" or args.out is None:
        parser.error("give `capture OUT` or `--compare BEFORE AFTER`")
    sys.path.insert(0, str(ROOT / "src"))
    capture(args.out, args.quick)


if __name__ == "__main__":
    main()
