"""`kvgate history`: the history of main per cell (text, SVG) and its change points (`--detect`).

Exit status: 0 printed (and, with --detect, no change point that is not acknowledged); 1 --detect flagged one;
2 unusable input (a store that cannot be opened, no such cell, Otava missing for --detect).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from kvgate import EXIT_FAILED, EXIT_OK, InputError
from kvgate.history import detect, store, trends
from kvgate.history.record import HISTORY_BRANCH

HELP = "the history of main per cell: trends (text, --svg) and e-divisive change points (--detect)"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--db", metavar="PATH|URL",
                        help=f"the history: a SQLite file or a postgresql:// URL (default ${store.URL_ENV}, "
                             f"else {store.DEFAULT_SQLITE})")
    parser.add_argument("--branch", default=HISTORY_BRANCH, help=f"whose history (default {HISTORY_BRANCH})")
    parser.add_argument("--cell", nargs="+", default=[], metavar="CELL", help="only these cells (default all)")
    parser.add_argument("--measure", nargs="+", default=[], metavar="MEASURE",
                        help="only these measures, e.g. throughput:requests_per_second (default all)")
    parser.add_argument("--detect", action="store_true",
                        help="find change points (Apache Otava's e-divisive); exit 1 when one is not acknowledged")
    parser.add_argument("--max-p-value", type=float, default=detect.MAX_P_VALUE,
                        help=f"a change point's t-test p-value is below this (default {detect.MAX_P_VALUE:g})")
    parser.add_argument("--svg", type=Path, metavar="FILE", help="write the trends as one SVG file")
    parser.add_argument("--last", type=int, default=20, metavar="N", help="runs per table (default 20)")
    parser.add_argument("--acknowledge", nargs=3, metavar=("CELL", "MEASURE", "COMMIT"),
                        help="accept a change point as intended (a known change): --detect no longer fails on it")


def run(args: argparse.Namespace) -> int:
    if not 0 < args.max_p_value < 1:
        raise InputError("--max-p-value", f"{args.max_p_value} is not between 0 and 1", hint="e.g. 1e-5")
    if args.last < 1:
        raise InputError("--last", f"{args.last} is not a count of runs of 1 or more", hint="e.g. 20")
    with store.open_store(store.location(args.db), create=False) as history:  # a reader: a missing file is no history
        if args.acknowledge:
            cell, measure, commit = args.acknowledge
            series = f"{trends.shown(cell)} {trends.shown(measure)}"
            if (cell, measure) not in history.series_names(args.branch):  # a typo would acknowledge nothing
                raise InputError("--acknowledge", f"no series {series} of {args.branch} in {history.shown}",
                                 hint="`kvgate history` lists the series recorded")
            if commit not in {point.commit or "" for point in history.series(args.branch, cell, measure)}:  # "": none
                raise InputError("--acknowledge", f"{trends.shown(commit)} is no commit of a run of {series} on "
                                 f"{args.branch} in {history.shown}", hint="Name the whole commit of the change "
                                 "point's first run (`kvgate history --detect` prints its first 12 characters)")
            history.acknowledge(cell, measure, commit)
            print(f"kvgate history: acknowledged the change point of {trends.shown(cell)} {trends.shown(measure)} at "
                  f"{trends.shown(commit)}")
            return EXIT_OK
        names = history.series_names(args.branch)
        selected = _select(names, args.cell, args.measure, history.shown, args.branch)
        acknowledged = history.acknowledged() if args.detect else set()
        plots, flagged = [], []
        for cell, measure in selected:
            points = history.series(args.branch, cell, measure)
            found = (detect.change_points([p.value for p in points], max_p_value=args.max_p_value)
                     if args.detect else [])
            print(trends.table(cell, measure, points, found, last=args.last))
            for point in found:
                known = (cell, measure, points[point.index].commit or "") in acknowledged
                print(("  acknowledged: " if known else "  CHANGE POINT ") + trends.describe(cell, measure, points, point))
                if not known:
                    flagged.append(point)
            plots.append(trends.svg(cell, measure, points, found))
        if args.svg is not None:
            try:
                args.svg.parent.mkdir(parents=True, exist_ok=True)
                args.svg.write_text(trends.stacked(plots), encoding="utf-8")
            except OSError as error:
                raise InputError("--svg", f"cannot write {args.svg} ({error.strerror})",
                                 hint="Name a file in a folder kvgate can write") from None
            print(f"kvgate history: wrote {args.svg}", file=sys.stderr)
        if args.detect:
            print(f"kvgate history: {len(flagged)} change point(s) not acknowledged over {len(selected)} series "
                  f"of {history.runs(args.branch)} runs on {args.branch} (p < {args.max_p_value:g})")
    return EXIT_FAILED if flagged else EXIT_OK


def _select(names: list[tuple[str, str]], cells: list[str], measures: list[str], shown: str,
            branch: str) -> list[tuple[str, str]]:
    if not names:
        raise InputError(shown, f"no runs of {branch} recorded",
                         hint="The gate records a run whose run.json names the branch `main` (kvgate gate)")
    known_cells = sorted({c for c, _ in names})
    known_measures = sorted({m for _, m in names})
    for flag, wanted, known in (("--cell", cells, known_cells), ("--measure", measures, known_measures)):
        unknown = [w for w in wanted if w not in known]
        if unknown:
            raise InputError(flag, f"no series for '{unknown[0]}' in {shown}", hint=f"Recorded: {', '.join(map(trends.shown, known))}")
    return [(c, m) for c, m in names if (not cells or c in cells) and (not measures or m in measures)]
