"""FlashInfer's BatchDecodeWithPagedKVCacheWrapper, the decode kernel vLLM's FLASHINFER runs on SM90 here.

Family ``flashinfer_decode``. Which decode kernel vLLM 0.26.0's FLASHINFER picks on SM90
(vllm/v1/attention/backends/flashinfer.py + vllm/utils/flashinfer.py): XQA through
``trtllm_batch_decode_with_kv_cache(backend="xqa")`` when ``supports_trtllm_attention()`` holds, which
needs NVIDIA's cubin artifactory to be reachable or flashinfer-cubin installed (``has_nvidia_artifactory``);
otherwise the native ``BatchDecodeWithPagedKVCacheWrapper``. The lent H200 reaches no network and the
bundle has no flashinfer-cubin, so the engine there runs the native wrapper, which is what this adapter
calls (XQA has no kernel test yet). Called as the backend does for a pure-decode batch:

- cache write ``torch.ops._C_cache_ops.reshape_and_cache_flash`` (vllm._custom_ops) with vLLM's
  ``kv_cache_dtype`` string and ``layer._k_scale`` / ``layer._v_scale``; the forward views the uint8 cache as
  e4m3 or e5m2 and splits K and V out of the NHD tensor;
- ``BatchDecodeWithPagedKVCacheWrapper(workspace, "NHD", use_cuda_graph=False, use_tensor_cores=True,
  backend="auto")`` (``_get_decode_wrapper``), planned as ``fast_plan_decode``'s first call does:
  ``plan(indptr (cpu), indices, last_page_len (cpu), num_qo_heads, num_kv_heads, head_dim, page_size,
  pos_encoding_mode="NONE", window_left=-1, logits_soft_cap=None, q_data_type, kv_data_type, o_data_type=bf16,
  sm_scale, fixed_split_size=-1, disable_split_kv=False)``;
- ``q_data_type`` is the model dtype on SM90 decode even with an FP8 cache (``get_q_data_type``: "On SM90,
  XQA decode requires BF16/FP16-Q"), so the query stays bf16 and FlashInfer's "auto" resolves to its fa2
  tensor-core kernel (fa3 needs an FP8 query, flashinfer.utils.is_fa3_backend_supported);
- ``run(query, (k_cache, v_cache), q_scale=layer._q_scale_float, k_scale=layer._k_scale_float,
  v_scale=layer._v_scale_float, out=...)``: FlashInfer multiplies sm_scale by q_scale and k_scale and the
  output by v_scale.

vLLM passes ``q_scale`` although the decode query is not quantised; it is 1.0 unless a checkpoint or
``calculate_kv_scales`` sets it. `prepare(..., q_scale=...)` passes another value (test_attention_decode.py
pins what that does). The first plan JIT-compiles the kernel (tens of seconds per kv dtype); warnings
raised while planning are kept in the provenance.

fp8_e5m2 is pinned, not tested (test_attention_decode.PINNED). On the H200 (FlashInfer 0.6.14) this decode
returned garbage against the same e5m2 bytes (rel-L2 0.82-0.87). vLLM's engine with an e5m2 cache fails
earlier still, in prefill: that query is quantised to e4m3 but planned as e5m2. The adapter's bf16 decode
query is not involved in that mismatch.
"""

from __future__ import annotations

import warnings

import torch

from kvgate.kernels import fp8
from kvgate.kernels.adapters import KernelUnavailable, import_quietly, paged_kv, require_capability
from kvgate.kernels.adapters.paged_kv import PreparedPagedDecode, build_cache, cuda_cache_write, vllm_ops
from kvgate.kernels.cases import AttentionInputs

WORKSPACE_BYTES = 256 * 1024 * 1024
_WORKSPACES: dict[torch.device, torch.Tensor] = {}


def _flashinfer():
    try:
        flashinfer, _ = import_quietly("flashinfer")
    except Exception as error:
        raise KernelUnavailable(f"FlashInfer did not import ({type(error).__name__}: {error})") from None
    return flashinfer


def _workspace(device: torch.device) -> torch.Tensor:
    if device not in _WORKSPACES:
        _WORKSPACES[device] = torch.zeros(WORKSPACE_BYTES, dtype=torch.uint8, device=device)
    return _WORKSPACES[device]


def prepare(inputs: AttentionInputs, family: str, *, k_scale_error: float = 1.0,
            q_scale: float = 1.0) -> PreparedPagedDecode:
    """`k_scale_error`: the kernel gets k_scale times this (negative controls); `q_scale`: vLLM's _q_scale_float."""
    major, minor = require_capability("FlashInfer's paged decode", (8, 9, 12), "SM80, SM89, SM90 and SM120")
    flashinfer = _flashinfer()
    ops = vllm_ops()
    case = inputs.case
    device = paged_kv.current_device()
    kv_dtype = fp8.kv_torch_dtype(case.kv_cache_dtype)
    cache = build_cache(inputs, device, cuda_cache_write(ops, case.kv_cache_dtype), read_dtype=kv_dtype)
    layout = cache.layout
    counts = [-(-n // layout.page_size) for n in case.spec.kv_lens]
    indptr = torch.tensor([0, *torch.tensor(counts).cumsum(0).tolist()], dtype=torch.int32)
    indices = torch.cat([layout.block_table[b, :c] for b, c in enumerate(counts)]).to(torch.int32).to(device)
    last_page_len = torch.tensor([n - (c - 1) * layout.page_size for n, c in zip(case.spec.kv_lens, counts,
                                                                               strict=True)], dtype=torch.int32)
    wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
        _workspace(device), "NHD", use_cuda_graph=False, use_tensor_cores=True, backend="auto")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        wrapper.plan(indptr=indptr, indices=indices, last_page_len=last_page_len, num_qo_heads=case.num_heads,
                     num_kv_heads=case.num_kv_heads, head_dim=case.head_dim, page_size=layout.page_size,
                     pos_encoding_mode="NONE", window_left=-1, logits_soft_cap=None, q_data_type=torch.bfloat16,
                     kv_data_type=kv_dtype, o_data_type=torch.bfloat16, sm_scale=inputs.scale,
                     fixed_split_size=-1, disable_split_kv=False)
    kv_caches = cache.views(kv_dtype)
    query = inputs.query.to(device)
    out = torch.empty(query.shape, dtype=torch.bfloat16, device=device)
    k_scale = inputs.k_scale * k_scale_error

    def run() -> torch.Tensor:
        return wrapper.run(query, kv_caches, q_scale=q_scale, k_scale=k_scale, v_scale=inputs.v_scale, out=out)

    resolved = getattr(wrapper, "_backend", "?")
    provenance = (f"flashinfer {flashinfer.__version__} BatchDecodeWithPagedKVCacheWrapper(NHD, "
                  f"use_tensor_cores=True) resolved backend={resolved} on SM{major}{minor}")
    planned = sorted({f"{w.category.__name__}: {w.message}" for w in caught})
    if planned:
        provenance += f" (plan warnings: {'; '.join(planned)})"
    return PreparedPagedDecode(run=run, cache=cache, query=query.float(), query_element_size=2,
                               provenance=provenance)
