"""`kvgate gate RUN_DIR [--baseline DIR]`: judge a results folder; write verdict.json, report.md/.html, junit.xml.

Exit status: 0 every required check passed (waived ones included); 1 a regression, or a required cell or
stage missing, failed or errored; 2 unusable input (one `ERROR <file>: ...` line per problem).
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import sys
from pathlib import Path

from kvgate import InputError, InputErrors, problems_of
from kvgate.gate import checks as gate
from kvgate.gate import policy as policy_module
from kvgate.gate import probe_agreement
from kvgate.matrix import cells as matrix_module
from kvgate.report import headline, write_all
from kvgate.results.records import STAGES
from kvgate.results.run_loader import GATE_FOLDER, KnownNames, load_run

HELP = "judge a results folder: verdict, report (md/html), junit.xml; exit 0 pass, 1 regression, 2 bad input"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", type=Path, metavar="RUN_DIR", help="the results folder (docs/results-folder.md)")
    parser.add_argument("--baseline", type=Path, metavar="DIR", help="a results folder to compare every cell with")
    parser.add_argument("--out", type=Path, metavar="DIR", help=f"where the outputs go (default RUN_DIR/{GATE_FOLDER}/)")
    parser.add_argument("--require", default="", metavar="STAGES",
                        help=f"comma-separated stages every cell must have run ({', '.join(STAGES)}, or all)")
    parser.add_argument("--policy", type=Path, metavar="FILE", help="thresholds (default: matrix/policy.toml)")
    parser.add_argument("--matrix-dir", type=Path, metavar="DIR", help="default: the repository's matrix/")
    parser.add_argument("--today", metavar="YYYY-MM-DD", help="the date waivers expire against (default: today, UTC)")


def parse_require(value: str) -> tuple[str, ...]:
    names = [v.strip() for v in value.split(",") if v.strip()]
    if names == ["all"]:
        return STAGES
    unknown = [n for n in names if n not in STAGES]
    if unknown:
        raise InputError("--require", f"unknown stage '{unknown[0]}'",
                         hint=f"Stages: {', '.join(STAGES)} (comma-separated), or all")
    return tuple(names)


def parse_today(value: str | None) -> dt.date:
    if value is None:
        return dt.datetime.now(dt.timezone.utc).date()
    try:
        return dt.date.fromisoformat(value)
    except ValueError:
        raise InputError("--today", f"bad date '{value}'", hint="Write YYYY-MM-DD, e.g. 2026-11-30") from None


def run(args: argparse.Namespace) -> int:
    require = parse_require(args.require)
    today = parse_today(args.today)
    matrix = matrix_module.load(args.matrix_dir)
    policy = policy_module.load(args.policy, matrix=matrix)
    known = KnownNames.from_matrix(matrix)
    problems: list[InputError] = []
    results = baseline = None
    for which, folder in (("run", args.run_dir), ("baseline", args.baseline)):
        if folder is None:
            continue
        try:
            loaded = load_run(folder, known)
        except (InputError, InputErrors) as error:
            problems.extend(problems_of(error))
            continue
        except OSError as error:  # an unreadable folder met while walking the run (files are read safely)
            problems.append(InputError(str(error.filename or folder), f"cannot read: {error.strerror}",
                                       hint=f"Check the permissions of the {which} folder"))
            continue
        if which == "run":
            results = loaded
        else:
            baseline = loaded
    if problems:
        raise InputErrors(problems)
    assert results is not None
    verdict = gate.evaluate(results, policy=policy, baseline=baseline, waiver_for=matrix.waiver_for, today=today,
                            require=require, probe_compare=probe_agreement.compare)
    out_dir = args.out if args.out is not None else args.run_dir / GATE_FOLDER
    paths = write_all(verdict, out_dir)
    print(headline(verdict))
    print(f"kvgate gate: wrote {', '.join(str(p) for p in paths.values())}", file=sys.stderr)
    summary = os.environ.get("GITHUB_STEP_SUMMARY")
    if summary:
        try:
            with open(summary, "a", encoding="utf-8") as handle:
                handle.write(paths["report.md"].read_text(encoding="utf-8"))
        except OSError as error:
            print(f"kvgate gate: could not append to $GITHUB_STEP_SUMMARY: {error}", file=sys.stderr)
    return verdict.exit_status
