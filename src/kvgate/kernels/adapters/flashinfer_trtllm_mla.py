"""FlashInfer's trtllm-gen MLA decode, the kernel vLLM's FLASHINFER_MLA calls (SM100 family only).

Family ``flashinfer_trtllm_mla``. Called exactly as vllm/v1/attention/backends/mla/flashinfer_mla.py
calls it: query ``[batch, 1, heads, 576]``, cache ``kv.unsqueeze(1)``, ``bmm1_scale = sm_scale * q_scale
* k_scale`` and ``bmm2_scale = k_scale`` for an FP8 cache (kvgate.kernels.fp8.VllmMlaScales).

Guarded before any FlashInfer call: ``trtllm_batch_decode_with_kv_cache_mla(backend="trtllm-gen")`` has
no arch check of its own; off SM100 it tries to download cubins and, with no network, hangs about 56 s
before an AssertionError (docs/facts/h200.md#trtllm-gen-mla-decode-has-no-arch-check-and-hangs-off-sm100). So this
adapter refuses every non-SM10x GPU itself.
Not yet run on an SM100 GPU (none was lent); the SM90 refusal is tested.
"""

from __future__ import annotations

import torch

from kvgate.kernels.adapters import KernelUnavailable, PreparedDecode, import_quietly, require_capability
from kvgate.kernels.cases import QK_NOPE_HEAD_DIM, DecodeInputs

WORKSPACE_BYTES = 128 * 1024 * 1024
SUPPORTED_PAGE_SIZES = (32, 64)  # FLASHINFER_MLA's kernel block sizes


def prepare(inputs: DecodeInputs, family: str) -> PreparedDecode:
    require_capability("FlashInfer trtllm-gen MLA decode", (10,), "SM100/SM103/SM107")
    if inputs.cache.page_size not in SUPPORTED_PAGE_SIZES:
        raise KernelUnavailable(f"trtllm-gen MLA takes page sizes {SUPPORTED_PAGE_SIZES}, "
                                f"not {inputs.cache.page_size}")
    if inputs.kv_dtype not in (torch.bfloat16, torch.float8_e4m3fn):
        raise KernelUnavailable(f"trtllm-gen MLA takes bf16 or FP8 e4m3 KV, not {inputs.kv_dtype}")
    try:
        flashinfer, _ = import_quietly("flashinfer")
        decode, _ = import_quietly("flashinfer.decode")
        trtllm_batch_decode_with_kv_cache_mla = decode.trtllm_batch_decode_with_kv_cache_mla
    except ImportError as error:
        raise KernelUnavailable(f"FlashInfer is not installed ({error})") from None
    device = inputs.query.device
    workspace = torch.zeros(WORKSPACE_BYTES, dtype=torch.uint8, device=device)
    query = inputs.query.unsqueeze(1)
    kv_cache = inputs.cache.kv.unsqueeze(1)
    scales = inputs.scales
    max_seq_len = inputs.max_seq_len()
    out = torch.empty(inputs.query.shape[0], 1, inputs.query.shape[1], inputs.cache.kv_lora_rank,
                      dtype=inputs.query.dtype, device=device)

    def run() -> torch.Tensor:
        result = trtllm_batch_decode_with_kv_cache_mla(
            query=query, kv_cache=kv_cache, workspace_buffer=workspace,
            qk_nope_head_dim=QK_NOPE_HEAD_DIM, kv_lora_rank=inputs.cache.kv_lora_rank,
            qk_rope_head_dim=inputs.cache.rope_dim, block_tables=inputs.cache.block_table,
            seq_lens=inputs.cache.seq_lens, max_seq_len=max_seq_len, out=out,
            bmm1_scale=scales.bmm1_scale, bmm2_scale=scales.bmm2_scale, backend="trtllm-gen",
        )
        return result.view(-1, result.shape[-2], result.shape[-1])

    return PreparedDecode(run=run, provenance=f"flashinfer {flashinfer.__version__} "
                                              "trtllm_batch_decode_with_kv_cache_mla backend=trtllm-gen")
