"""Loading vLLM's Triton MLA decode kernel from its source file (no GPU needed to load it)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from kvgate.kernels.adapters import KernelUnavailable, vllm_triton_mla


def _installed_source() -> Path:
    pytest.importorskip("triton", reason="Triton is not installed")
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("no vLLM installed to take triton_decode_attention.py from")
    path = Path(next(iter(spec.submodule_search_locations))) / "v1/attention/ops/triton_decode_attention.py"
    if not path.exists():
        pytest.skip(f"{path} is not in this vLLM")
    return path


def test_loads_vllms_kernel_source_standalone() -> None:
    source = _installed_source()
    decode, provenance = vllm_triton_mla._load_source(source)
    assert callable(decode) and decode.__name__ == "decode_attention_fwd"
    assert provenance.startswith("vllm source triton_decode_attention.py sha256:")
    assert provenance.endswith("(standalone load)")


def test_refuses_a_source_needing_more_of_vllm(tmp_path: Path) -> None:
    source = _installed_source()
    text = source.read_text(encoding="utf-8").replace(
        "import torch\n", "import torch\nfrom vllm.utils import cdiv\n", 1)
    copy = tmp_path / "triton_decode_attention.py"
    copy.write_text(text, encoding="utf-8")
    with pytest.raises(KernelUnavailable) as raised:
        vllm_triton_mla._load_source(copy)
    assert str(raised.value) == (f"{copy}: imports 'from vllm.utils import cdiv', which a standalone load "
                                 "cannot provide")


def test_missing_source_file_is_a_clear_skip(tmp_path: Path) -> None:
    with pytest.raises(KernelUnavailable, match=r"KVGATE_VLLM_TRITON_DECODE=.*nope\.py: cannot read"):
        vllm_triton_mla._load_source(tmp_path / "nope.py")


@pytest.mark.parametrize(("max_seq_len", "sm_count", "splits"),
                         [(1, 132, 1), (1023, 132, 1), (1024, 132, 2), (3000, 132, 8), (8192, 132, 16),
                          (1 << 20, 4, 8)])
def test_num_kv_splits_follows_triton_mla(max_seq_len: int, sm_count: int, splits: int) -> None:
    """next_power_of_2(max(1, max_seq_len // 512)), capped at 2 x SMs (vLLM triton_mla.py)."""
    assert vllm_triton_mla.num_kv_splits(max_seq_len, sm_count) == splits
