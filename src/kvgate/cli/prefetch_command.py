"""`kvgate prefetch`: fill the Hugging Face cache GPU runners read offline (models, lm-eval datasets).

    HF_HOME=/srv/kvgate-hf HF_TOKEN=hf_... kvgate prefetch            every GPU cell's models and datasets
    kvgate prefetch --arch sm90 --dry-run                               what it would fetch, and where

On a trusted machine with network access; the runners get a copy of that HF_HOME (without any token file).
"""

from __future__ import annotations

import argparse
import os
import sys

from kvgate import EXIT_FAILED, EXIT_OK, InputError
from kvgate.cli.matrix_command import add_filter_arguments, selected_cells
from kvgate.runners.environment.hub_cache import environment_summary, hub_is_offline, token_file
from kvgate.runners.environment.prefetch import prefetch, prefetch_plan

HELP = "fill the Hugging Face cache GPU runners read offline: the selected cells' models and lm-eval datasets"


def configure(parser: argparse.ArgumentParser) -> None:
    add_filter_arguments(parser)
    parser.add_argument("--dry-run", action="store_true", help="say what would be fetched and where; fetch nothing")


def run(args: argparse.Namespace) -> int:
    filtered = bool(args.arch or args.backend or args.kv_cache_dtype or args.cell)
    matrix, cells, _ = selected_cells(args)
    if not filtered:
        cells = [cell for cell in cells if matrix.archs[cell.arch].is_gpu]
    plan = prefetch_plan(cells)
    places = environment_summary(os.environ)
    print(f"kvgate prefetch: HF_HOME {places['HF_HOME']} (models in {places['hub']}, datasets in {places['datasets']})")
    if not plan.models and not plan.datasets:
        print("kvgate prefetch: nothing to fetch: these cells run kvgate's own models and data")
        return EXIT_OK
    for model in plan.models:
        print(f"  model    {model}")
    for dataset in plan.datasets:
        print(f"  dataset  {dataset.path}" + (f" ({dataset.name})" if dataset.name else ""))
    if args.dry_run:
        return EXIT_OK
    if hub_is_offline(os.environ):
        raise InputError("kvgate prefetch", f"HF_HUB_OFFLINE={os.environ['HF_HUB_OFFLINE']} is set, but prefetch "
                         "downloads from the hub", hint="Run it where the hub is reachable, without HF_HUB_OFFLINE")
    problems = prefetch(plan)
    token = token_file(os.environ)
    if token is not None:
        print(f"kvgate prefetch: WARNING {token} holds a login token: copy the cache to the runners without it "
              f"(e.g. rsync --exclude token --exclude stored_tokens), or fill it with HF_TOKEN instead of a login",
              file=sys.stderr)
    for problem in problems:
        print(f"kvgate prefetch: FAILED {problem}", file=sys.stderr)
    if problems:
        return EXIT_FAILED
    print(f"kvgate prefetch: done; give the runners a copy of {places['HF_HOME']} as their HF_HOME")
    return EXIT_OK
