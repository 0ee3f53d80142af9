"""One module per kernel family; each turns the inputs of a case into a launch the tests and the benchmark share.

An MLA adapter exposes ``prepare(inputs: DecodeInputs, family) -> PreparedDecode``; ``run()`` launches the
kernel once and returns its output ``[batch, heads, kv_lora_rank]``. A non-MLA adapter on a GPU exposes
``prepare(inputs: AttentionInputs, family) -> paged_kv.PreparedPagedDecode`` (output ``[batch, heads,
head_dim]``). ``run()`` never synchronises with the host, so the benchmark can capture it in a CUDA graph
(a kernel wrapper that allocates its output does so in the graph's pool). Where the kernel reads a
quantised query, the prepared launch says which (``reference_query``), so the reference is computed on
what the kernel read.

Two kinds of "cannot": an adapter raises `KernelUnavailable` (a skip, with the reason) when this machine
is not one the kernel runs on: no GPU, another arch, no vLLM installed at all. When the machine is the
kernel's but vLLM resolves something else than kvgate tests (another FlashAttention version, FlashMLA
unsupported on an SM90), it raises `KernelMismatch`, which fails the test: a skip there would hide that
the engine runs another kernel. So does `VllmImportError`: the vLLM under test is installed, but a module its
kernel needs does not import (`import_vllm`), which is what a change that breaks an FP8 kernel's import looks like.
"""

from __future__ import annotations

import importlib
import importlib.util
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType

import torch


class KernelUnavailable(Exception):
    """This kernel cannot run on this machine; the message says why (the test is skipped with it)."""


class KernelMismatch(RuntimeError):
    """This machine should run the kernel, but vLLM resolves another one; the test fails with the message."""


class VllmImportError(KernelMismatch):
    """The vLLM under test is installed, but a module its kernel needs does not import; the test fails, naming it."""


@dataclass(frozen=True, kw_only=True)
class PreparedDecode:
    run: Callable[[], torch.Tensor]
    provenance: str  # which library and version ran, for the JUnit properties and timings.json
    reference_query: torch.Tensor | None = None  # the query the kernel read, dequantised (None: inputs.query)


def adapter_module(module_name: str) -> ModuleType:
    return importlib.import_module(module_name)


def import_quietly(module_name: str) -> tuple[ModuleType, list[str]]:
    """Import a kernel library, collecting (not raising) the warnings its import emits.

    The import of a library is not what a kernel test checks; its warnings are reported in the
    provenance instead of failing every test under `filterwarnings = error`. Warnings the kernel
    call itself raises still fail the test.
    """
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        module = importlib.import_module(module_name)
    return module, sorted({f"{w.category.__name__}: {w.message}" for w in caught})


def import_vllm(*module_names: str) -> list[ModuleType]:
    """The vLLM modules a kernel needs, from the vLLM under test (the overlay first on PYTHONPATH, if any). No vLLM
    installed at all: KernelUnavailable (this machine cannot run it). Installed, but a module does not import:
    VllmImportError, naming the module and the error (never a skip: it would pass a change that breaks the import)."""
    if importlib.util.find_spec("vllm") is None:
        raise KernelUnavailable("vLLM is not installed here")
    modules = []
    for name in module_names:
        try:
            modules.append(import_quietly(name)[0])
        except Exception as error:  # any failure of the vLLM under test to import is that vLLM's, named
            raise VllmImportError(f"the vLLM under test does not import {name}: {type(error).__name__}: "
                                  f"{str(error).splitlines()[0][:300] if str(error) else ''}") from None
    return modules


def compute_capability() -> tuple[int, int] | None:
    if not torch.cuda.is_available():
        return None
    return torch.cuda.get_device_capability()


def require_cuda(what: str) -> torch.device:
    if not torch.cuda.is_available():
        raise KernelUnavailable(f"{what} needs a CUDA GPU; none is visible here")
    return torch.device("cuda", torch.cuda.current_device())


def require_capability(what: str, allowed_majors: tuple[int, ...], label: str) -> tuple[int, int]:
    """Refuse (KernelUnavailable) unless the visible GPU's major compute capability is allowed."""
    require_cuda(what)
    major, minor = torch.cuda.get_device_capability()
    if major not in allowed_majors:
        raise KernelUnavailable(f"{what} runs on {label} only; this GPU is SM{major}{minor}")
    return major, minor
