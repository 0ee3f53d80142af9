"""The sides of a run: `head` (the vLLM under test) and, in an A/B run, `base` (what it is compared with).

    kvgate run ... --vllm SPEC                    one side, head (default spec: release)
    kvgate run ... --vllm SPEC --base-vllm SPEC   both sides of each cell on this machine, base first; a
                                                  source: head against a wheel: base goes over that wheel

Both specs are checked and their overlays built before anything is written, so bad input (a patch that does
not apply, a wheel for another Python) leaves every results folder as it was.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from kvgate.change.overlay import VllmUnderTest, installed_release, prepare
from kvgate.change.spec import DEFAULT_SPEC, parse_spec
from kvgate.results.records import BASE, HEAD


@dataclass(frozen=True, kw_only=True, slots=True)
class Side:
    name: str  # head | base
    vllm: VllmUnderTest | None  # None: not asked for (kvgate does not look at the vLLM it runs)
    ab: bool = False  # part of an A/B run: cell.json says which side, the base folder is <id>--base

    def record(self, cell_record: dict) -> dict:
        return {**cell_record, "side": self.name} if self.ab else dict(cell_record)


def add_vllm_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--vllm", metavar="SPEC", default=None,
                        help="the vLLM under test: release[:VERSION] (default), wheel:PATH, source:PATH[@BASE] "
                             "(a vLLM git checkout) or patch:PATH (a unified diff against the release)")
    parser.add_argument("--base-vllm", metavar="SPEC", default=None,
                        help="run every selected cell a second time with this vLLM (A/B on this machine) and "
                             "judge the head against it; e.g. --vllm patch:fix.diff --base-vllm release")


def prepare_sides(vllm: str | None, base_vllm: str | None) -> list[Side]:
    """[head] or [base, head]; InputError for a bad spec, before anything runs."""
    if vllm is None and base_vllm is None:
        return [Side(name=HEAD, vllm=None)]
    release = installed_release()
    head_spec = parse_spec(vllm or DEFAULT_SPEC, "--vllm")
    if base_vllm is None:
        return [Side(name=HEAD, vllm=prepare(head_spec, release))]
    base = prepare(parse_spec(base_vllm, "--base-vllm"), release)
    # A source head against a wheel base (vLLM's per-commit wheel of the merge base): the head's Python changes go
    # over that wheel, so both sides run the same compiled kernels, the merge base's
    head = prepare(head_spec, release, over=base if head_spec.kind == "source" and base.kind == "wheel" else None)
    return [Side(name=BASE, vllm=base, ab=True), Side(name=HEAD, vllm=head, ab=True)]


def sides_record(sides: list[Side]) -> dict:
    """run.json's `vllm_under_test`: side -> what it ran (only the sides kvgate was asked about)."""
    return {side.name: side.vllm.as_record() for side in sides if side.vllm is not None}
