"""The GPU canary table from the A/B runs of benchmarks/h200_canaries/run.sh (their gate/verdict.json and each
cell's status.json): per run, what the gate said, the head FP8 cell's drop against the base side with its bounds,
the question it stopped at, the head-vs-base probe, and the minutes per cell. A run of several FP8 cells (a feature's
cells beside the plain ones: flashmla-fp8-sm90-spec_decode) has a row per FP8 cell, each with its auto cell and the
checks of those two that failed; the gate's exit and whether the canary got its verdict are the run's.

    python3 benchmarks/h200_canaries/table.py /tmp/h200c      (run.sh gate prints it into $OUT/table.md)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from kvgate.cli.canaries_command import judge, load_canaries

REPO = Path(__file__).resolve().parents[2]


def load(path: Path) -> dict:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


def check(verdict: dict, cell: str, kind: str, subject: str | None = None) -> dict:
    return next((c for c in verdict.get("checks", []) if c.get("cell") == cell and c.get("kind") == kind
                 and (subject is None or c.get("subject") == subject)), {})


def fmt(value, spec: str = ".3f") -> str:
    return format(value, spec) if isinstance(value, (int, float)) and not isinstance(value, bool) else "-"


def prompt_moved(probe: dict) -> str:
    """The prompt's divergence from auto, base -> head, where that (not decode) is what failed probe_ab."""
    f = probe.get("figures", {})
    grew = f.get("mean_abs_logprob_diff_growth")
    if probe.get("status") != "fail" or not isinstance(grew, (int, float)) or grew <= f.get(
            "decode_mean_abs_logprob_diff_growth", float("inf")):
        return ""
    return (f"; prompt {fmt(f.get('base_mean_abs_logprob_diff'), '.4f')} -> "
            f"{fmt(f.get('head_mean_abs_logprob_diff'), '.4f')} (x{fmt(grew, '.2f')})")


def main(root: Path) -> int:
    canaries = {c.name: c for c in load_canaries(REPO / "canaries")}
    rows = ["| run | expected | gate exit | as expected | head FP8 vs base: strict drop [lower, upper] pts, p | "
            "decided at (questions) | FP8 vs auto drop | probe A/B: decode divergence base -> head, greedy prefix | "
            "minutes per cell (auto, fp8 head) | failing checks |",
            "|---|---|---|---|---|---|---|---|---|---|"]
    for run in sorted(p for p in (root / "ab").iterdir() if p.is_dir()):
        backend, _, name = run.name.partition("-")
        backend = backend.lower()
        verdict = load(run / "gate" / "verdict.json")
        arch = next((json.loads((c / "cell.json").read_text()).get("arch") for c in run.iterdir()
                     if (c / "cell.json").is_file()), "sm90")
        plain = f"{backend}-fp8-{arch}"
        heads = sorted(c.name for c in run.iterdir() if (c / "cell.json").is_file() and "-fp8-" in c.name
                       and not c.name.endswith("--base")) or [plain]
        for fp8 in heads:
            label = run.name if heads == [plain] else f"{run.name} `{fp8}`"
            rows.append(row(run, label, name, verdict, canaries, fp8, fp8.replace("-fp8-", "-auto-"), len(heads) > 1))
    print("\n".join(rows))
    return 0


def row(run: Path, label: str, name: str, verdict: dict, canaries: dict, fp8: str, auto: str, own_cells: bool) -> str:
    """One FP8 head cell's row; own_cells: list the failing checks of this cell and its auto cell only."""
    canary = canaries.get(name)
    expect = canary.expect if canary else ("pass" if name.startswith("aa") else "measured")
    exit_status = verdict.get("exit_status", "-")
    ok = "-"
    if canary is not None and verdict:
        ok = "yes" if judge(canary, verdict, int(exit_status))[0] else "NO"
    elif verdict and expect == "pass":
        ok = "yes" if exit_status == 0 else "NO"
    elif verdict:
        ok = "caught" if exit_status == 1 else "not caught"
    base = check(verdict, fp8, "baseline_accuracy", "strict-match")
    f = base.get("figures", {})
    drop = (f"{fmt(f.get('drop_points'), '.2f')} [{fmt(f.get('lower_bound_points'), '.2f')}, "
            f"{fmt(f.get('upper_bound_points'), '.2f')}], p={fmt(base.get('p_value'), '.3g')}") if f else "-"
    look = f"look {f.get('look')} ({f.get('n')})" if f.get("look") else (f"fixed ({f.get('n')})" if f else "-")
    tax = check(verdict, fp8, "fp8_accuracy", "strict-match").get("figures", {})
    probe = check(verdict, fp8, "probe_ab")
    pf = probe.get("figures", {})
    moved = ("head ≡ base" if pf.get("head_equals_base") else
             f"{fmt(pf.get('base_decode_mean_abs_logprob_diff'), '.4f')} -> "
             f"{fmt(pf.get('head_decode_mean_abs_logprob_diff'), '.4f')}, "
             f"{fmt(pf.get('base_greedy_prefix_match'))} -> {fmt(pf.get('head_greedy_prefix_match'))}"
             f"{prompt_moved(probe)} ({probe.get('status', '-')})") if pf else "-"
    minutes = []
    for cell in (auto, fp8):
        status = load(run / cell / "status.json").get("accuracy", {})
        minutes.append(fmt(status.get("elapsed_s", 0) / 60, ".1f") if status.get("elapsed_s") else "-")
    failing = sorted({f"{c['cell']} {c['kind']}" for c in verdict.get("checks", [])
                      if c.get("status") in ("fail", "error", "missing")
                      and (not own_cells or c.get("cell") in (auto, fp8))})
    return (f"| {label} | {expect} | {exit_status} | {ok} | {drop} | {look} | "
            f"{fmt(tax.get('drop_points'), '.2f')} | {moved} | {', '.join(minutes)} | "
            f"{'; '.join(failing) or 'none'} |")


if __name__ == "__main__":
    raise SystemExit(main(Path(sys.argv[1])))
