"""`kvgate` command line: the only place that prints errors and exits.

Each subcommand lives in its own module under kvgate.cli, exposing
    HELP: str                                   one line for `kvgate -h`
    configure(parser: argparse.ArgumentParser)  its flags
    run(args: argparse.Namespace) -> int        the exit status (kvgate.EXIT_*)
    PASSES_THROUGH: bool (optional)             unknown flags go to args.passthrough (e.g. lm_eval's)
and raising kvgate.InputError / InputErrors for bad input, which this module prints as
`ERROR <file>: <what> in <where>. <hint>` (one line per problem) with exit status 2.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence

from kvgate import EXIT_BAD_INPUT, InputError, InputErrors, one_line

EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE: what a command a closed pipe stops exits with in a shell

# subcommand -> module under kvgate.cli
SUBCOMMANDS = {
    "matrix": "kvgate.cli.matrix_command",
    "run": "kvgate.cli.run_command",
    "kernels": "kvgate.cli.kernels_command",
    "gate": "kvgate.cli.gate_command",
    "power": "kvgate.cli.power_command",
    "canaries": "kvgate.cli.canaries_command",
    "prefetch": "kvgate.cli.prefetch_command",
    "history": "kvgate.cli.history_command",
}


DESCRIPTION = """Does FP8 KV cache still work on every vLLM attention backend and GPU it claims?
kvgate runs the cells of its matrix (backend x kv_cache_dtype x arch) with the real tools (kernel tests,
lm-eval + vLLM, vllm bench throughput) and gates the results."""
EPILOG = """typical use:
  kvgate matrix --arch sm90                       the cells an H100/H200 runs
  kvgate run cell --cell flashmla-fp8-sm90 --run-dir reports/runs/x
  kvgate gate reports/runs/x [--baseline DIR]     verdict, report.md/.html, junit.xml
exit status: 0 pass, 1 a regression or a failed/missing check, 2 unusable input (one ERROR line each)"""


class _ArgumentParser(argparse.ArgumentParser):
    """argparse, but a usage error is one `ERROR` line and exit status 2, like every other bad input."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise InputError(self.prog, message, hint=f"See `{self.prog} --help`")


def build_parser() -> argparse.ArgumentParser:
    parser = _ArgumentParser(prog="kvgate", description=DESCRIPTION, epilog=EPILOG,
                             formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND",
                                     parser_class=_ArgumentParser)
    for name, module_name in SUBCOMMANDS.items():
        module = _import(module_name)
        if module is None:
            continue
        sub = commands.add_parser(name, help=module.HELP, description=module.HELP)
        module.configure(sub)
        sub.set_defaults(_module=module)
    return parser


def _import(module_name: str):
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as error:
        if error.name == module_name:  # that subcommand is not built yet
            return None
        raise


def main(argv: Sequence[str] | None = None) -> int:
    try:
        parser = build_parser()
        args, extra = parser.parse_known_args(argv)
        if extra and not getattr(args._module, "PASSES_THROUGH", False):
            raise InputError(f"kvgate {args.command}", f"unrecognized arguments: {' '.join(extra)}",
                             hint=f"See `kvgate {args.command} --help`")
        args.passthrough = extra
        status = args._module.run(args)
        sys.stdout.flush()  # a reader that went away is met here, not at exit
        return status
    except BrokenPipeError:  # `kvgate matrix | head -3`: the reader has what it wanted; no traceback
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # Python's own flush at exit would fail again
        return EXIT_BROKEN_PIPE
    except InputErrors as errors:
        for error in errors.errors:
            print(f"ERROR {one_line(error)}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except InputError as error:
        print(f"ERROR {one_line(error)}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        print("kvgate: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
