"""Which vLLM a run tests: the `--vllm SPEC` (and `--base-vllm SPEC`) of `kvgate run` and the engine sessions.

    release[:VERSION]        the engine environment's installed release (the default); VERSION, when given,
                             must be that release
    wheel:PATH               a vLLM wheel (vLLM publishes one per commit), unpacked over nothing: all its files
    source:PATH[@BASE]       a vLLM git checkout: its changes since BASE (default: the release's tag vX.Y.Z) in
                             Python over the release's compiled parts; compiled changes are refused
    patch:PATH               a unified diff applied to the release's Python sources

Pure: parsing only. kvgate.change.overlay builds what a spec names.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from kvgate import InputError

KINDS = ("release", "wheel", "source", "patch")
DEFAULT_SPEC = "release"


@dataclass(frozen=True, kw_only=True, slots=True)
class VllmSpec:
    kind: str  # release | wheel | source | patch
    text: str  # as the user wrote it, for messages and run.json
    path: Path | None = None  # wheel, source, patch
    version: str | None = None  # release:VERSION
    base_rev: str | None = None  # source:PATH@BASE

    @property
    def is_release(self) -> bool:
        return self.kind == "release"


def parse_spec(text: str, flag: str = "--vllm") -> VllmSpec:
    """`release`, `release:0.32.0`, `wheel:PATH`, `source:PATH[@REV]`, `patch:PATH` -> VllmSpec (no disk access)."""
    spec = text.strip()
    kind, colon, rest = spec.partition(":")
    if kind not in KINDS:
        raise InputError(flag, f"unknown vLLM spec '{text}'",
                         hint="Write release[:VERSION], wheel:PATH, source:PATH[@BASE] or patch:PATH")
    if kind == "release":
        if colon and not rest.strip():
            raise InputError(flag, f"'{text}' names no version", hint="Write release or release:VERSION, e.g. release:0.32.0")
        return VllmSpec(kind=kind, text=spec, version=rest.strip() or None)
    if not rest.strip():
        raise InputError(flag, f"'{text}' names no path", hint=f"Write {kind}:PATH")
    base_rev = None
    if kind == "source" and "@" in rest:
        rest, _, base_rev = rest.rpartition("@")
        if not base_rev.strip() or not rest.strip():
            raise InputError(flag, f"'{text}': expected source:PATH@BASE with both parts",
                             hint="e.g. source:../vllm@v0.32.0, or source:../vllm for the release's tag")
    try:
        path = Path(rest.strip()).expanduser()
    except RuntimeError:  # ~USER of no such user, or ~ with no home directory
        raise InputError(flag, f"'{text}': cannot expand {rest.strip().split('/', 1)[0]!r} (no such user or home "
                               "directory)", hint=f"Write {kind}:PATH with the folder spelled out") from None
    return VllmSpec(kind=kind, text=spec, path=path, base_rev=base_rev)
