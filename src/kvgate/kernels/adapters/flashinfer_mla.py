"""FlashInfer's ``BatchMLAPagedAttentionWrapper`` with the fa3 / fa2 backends (SM90; fa2 also SM80+).

Families ``flashinfer_mla_fa3`` and ``flashinfer_mla_fa2``. bf16 KV, and FP8 e4m3 KV with a bf16
query: planned with ``scale_mode="kv-per-tensor"`` and run with ``ckv_scale = kpe_scale = k_scale``
(kvgate.kernels.fp8.to_flashinfer). This is the kernel vLLM's FLASHINFER_MLA_SPARSE_SM90 backend calls
(fa3, ``ckv_scale = k_scale``); vLLM's dense FLASHINFER_MLA uses trtllm-gen on SM100 instead
(adapters/flashinfer_trtllm_mla.py).

`plan_only` plans a wrapper with any FlashInfer backend name without running it: the arch-refusal
tests use it to pin the error FlashInfer raises on an arch the matrix says is unsupported
(trtllm-gen, cute-dsl, cutile, xqa, cutlass all refuse SM90 at plan time).

Two wrapper APIs. FlashInfer 0.7.x plans with ``metadata=MLAPlanMetadata...``, ``query_layout``,
``kv_cache_layout`` and ``scale_mode`` and runs with ``run(query=(q_nope, q_pe), kv_cache=(ckv, kpe))``.
FlashInfer 0.6.x (0.6.14 is what vLLM 0.26.0 pins and ci/locks/gpu-py312-x86_64.txt installs) has no
``MLAPlanMetadata``: ``plan(qo_indptr, kv_indptr, kv_indices, kv_len_arr, num_heads, head_dim_ckv,
head_dim_kpe, page_size, causal, sm_scale, q_data_type, kv_data_type)`` and ``run(q_nope, q_pe, ckv, kpe,
out=..., ckv_scale=..., kpe_scale=...)`` (flashinfer/mla/_core.py:1551, 1725 in 0.6.14). The adapter picks
by whether ``flashinfer.mla.MLAPlanMetadata`` exists. In 0.6.x the FP8 KV path is fa3 only (plan raises
"FP8 kv_data_type for MLA is only supported with the fa3 backend on SM90", mla/_core.py:1610-1614), so
fa2 FP8 is unavailable there.
"""

from __future__ import annotations

import torch

from kvgate.kernels import fp8
from kvgate.kernels.adapters import KernelUnavailable, PreparedDecode, import_quietly, require_cuda
from kvgate.kernels.cases import DecodeInputs

WORKSPACE_BYTES = 128 * 1024 * 1024
BACKEND_OF_FAMILY = {"flashinfer_mla_fa3": "fa3", "flashinfer_mla_fa2": "fa2"}
_WORKSPACES: dict[torch.device, torch.Tensor] = {}


def _flashinfer():
    """(flashinfer, flashinfer.mla); `mla.MLAPlanMetadata` exists from 0.7 on (see `has_plan_metadata`)."""
    try:
        flashinfer, import_warnings = import_quietly("flashinfer")
        mla, more = import_quietly("flashinfer.mla")
    except ImportError as error:
        raise KernelUnavailable(f"FlashInfer is not installed ({error})") from None
    IMPORT_WARNINGS[:] = sorted({*import_warnings, *more})
    return flashinfer, mla


def has_plan_metadata(mla) -> bool:
    """True for FlashInfer 0.7.x's wrapper API (plan(metadata=...)); False for 0.6.x's positional plan."""
    return hasattr(mla, "MLAPlanMetadata")


IMPORT_WARNINGS: list[str] = []


def _workspace(device: torch.device) -> torch.Tensor:
    if device not in _WORKSPACES:
        _WORKSPACES[device] = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=device)
    return _WORKSPACES[device]


def plan_only(inputs: DecodeInputs, backend: str, *, packed: bool = False):
    """A planned wrapper for `backend` ('fa3', 'trtllm-gen', ...); raises what FlashInfer raises.

    fa2/fa3 are planned as kvgate runs them: split query and cache, CSR metadata, FP8 with
    scale_mode="kv-per-tensor". `packed=True` plans the contract the other backends accept (packed
    query and cache, CSR + dense metadata, FP8 with "bmm-scalar"), so that what a refusal test meets
    is the backend's arch check rather than a layout or scale-contract rejection. FlashInfer 0.6.x has
    one plan contract (split, CSR, FP8 scales passed to run), so `packed` changes nothing there.
    """
    device = require_cuda(f"FlashInfer MLA ({backend})")
    _, mla = _flashinfer()
    cache = inputs.cache
    kv_indptr, kv_indices, kv_lens = (t.to(device) for t in cache.csr())
    batch = cache.batch
    qo_indptr = torch.arange(batch + 1, dtype=torch.int32, device=device)
    wrapper = mla.BatchMLAPagedAttentionWrapper(_workspace(device), backend=backend)
    if not has_plan_metadata(mla):  # FlashInfer 0.6.x: flashinfer/mla/_core.py:1551 in 0.6.14
        wrapper.plan(qo_indptr, kv_indptr, kv_indices, kv_lens, inputs.case.num_heads, cache.kv_lora_rank,
                     cache.rope_dim, cache.page_size, False, _scales(inputs).sm_scale, inputs.query.dtype,
                     inputs.kv_dtype)
        return wrapper
    metadata_type = mla.MLAPlanMetadata
    if packed:
        metadata = metadata_type.dual(qo_indptr, kv_indptr, kv_indices, kv_lens, cum_seq_lens_q=qo_indptr,
                                      block_tables=cache.block_table.to(device), seq_lens=kv_lens, max_q_len=1)
        scale_mode = "bmm-scalar" if inputs.is_fp8 else "default"
    else:
        metadata = metadata_type.csr(qo_indptr, kv_indptr, kv_indices, kv_lens)
        scale_mode = "kv-per-tensor" if inputs.is_fp8 else "default"
    wrapper.plan(
        metadata=metadata,
        num_heads=inputs.case.num_heads,
        head_dim_ckv=cache.kv_lora_rank,
        head_dim_kpe=cache.rope_dim,
        page_size=cache.page_size,
        causal=False,
        sm_scale=_scales(inputs).sm_scale,
        q_data_type=inputs.query.dtype,
        kv_data_type=inputs.kv_dtype,
        query_layout="packed" if packed else "split",
        kv_cache_layout="packed" if packed else "split",
        scale_mode=scale_mode,
    )
    return wrapper


def _scales(inputs: DecodeInputs) -> fp8.FlashInferKvScales:
    vllm = inputs.scales
    return fp8.to_flashinfer(vllm.bmm1_scale, vllm.bmm2_scale)


def prepare(inputs: DecodeInputs, family: str) -> PreparedDecode:
    backend = BACKEND_OF_FAMILY[family]
    if inputs.kv_dtype not in (torch.bfloat16, torch.float8_e4m3fn):
        raise KernelUnavailable(f"FlashInfer MLA {backend} takes bf16 or FP8 e4m3 KV, not {inputs.kv_dtype}")
    flashinfer, mla = _flashinfer()
    legacy = not has_plan_metadata(mla)
    if legacy and inputs.is_fp8 and backend != "fa3":
        raise KernelUnavailable(f"FlashInfer {flashinfer.__version__}'s MLA wrapper takes FP8 KV with fa3 only "
                                f"(flashinfer/mla/_core.py:1610-1614 in 0.6.14), not {backend}")
    wrapper = plan_only(inputs, backend)
    kv_lora_rank = inputs.cache.kv_lora_rank
    q_nope = inputs.query[..., :kv_lora_rank]
    q_pe = inputs.query[..., kv_lora_rank:]
    ckv, kpe = inputs.cache.ckv, inputs.cache.kpe
    out = torch.empty(*inputs.query.shape[:2], kv_lora_rank, dtype=inputs.query.dtype, device=inputs.query.device)
    extra = {}
    if inputs.is_fp8:
        scales = _scales(inputs)
        extra = {"ckv_scale": scales.ckv_scale, "kpe_scale": scales.kpe_scale}

    def run() -> torch.Tensor:
        if legacy:
            return wrapper.run(q_nope, q_pe, ckv, kpe, out=out, **extra)
        return wrapper.run(query=(q_nope, q_pe), kv_cache=(ckv, kpe), out=out, **extra)

    provenance = f"flashinfer {flashinfer.__version__} BatchMLAPagedAttentionWrapper backend={backend}"
    if IMPORT_WARNINGS:
        provenance += f" (import warnings: {'; '.join(IMPORT_WARNINGS)})"
    return PreparedDecode(run=run, provenance=provenance)
