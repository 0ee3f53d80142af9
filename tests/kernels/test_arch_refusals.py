"""Where the matrix says a backend does not run on this arch, its kernel library must refuse clearly.

FlashInfer's MLA wrapper refuses SM90 at plan time, before compiling or launching anything; these tests
pin the exact messages (../shared/facts/h200.md) so a FlashInfer update that starts launching (or hanging,
or crashing) there is caught. kvgate's own guard for the trtllm-gen decode function is pinned too: that
function has no arch check and hangs ~56 s off SM100, so it must never be reached on another arch.
"""

from __future__ import annotations

import pytest
import torch

from kvgate.kernels.adapters import KernelUnavailable, flashinfer_trtllm_mla
from kvgate.kernels.cases import BATCH_SPECS, DecodeCase, make_inputs
from kvgate.matrix import cells as matrix

# (matrix backend whose kernel this is, FlashInfer wrapper backend, kv dtype, exact SM90 refusal)
SM90_REFUSALS = [
    pytest.param("FLASHINFER_MLA", "trtllm-gen", "auto",
                 "trtllm-gen MLA requires SM100/SM103/SM107, got compute capability SM90.", id="trtllm-gen"),
    pytest.param("FLASHINFER_MLA", "trtllm-gen", "fp8_e4m3",
                 "trtllm-gen MLA requires SM100/SM103/SM107, got compute capability SM90.", id="trtllm-gen-fp8"),
    pytest.param("CUTLASS_MLA", "cutlass", "auto",
                 "cutlass backend supports only compute capability major versions 10 and 11, got SM90.",
                 id="cutlass"),
    pytest.param(None, "cute-dsl", "auto",
                 "cute-dsl backend requires SM100/SM103/SM107, got compute capability SM90.", id="cute-dsl"),
    pytest.param(None, "cutile", "auto",
                 "cutile backend supports only the validated Blackwell targets SM100, SM103, SM107, SM120, "
                 "and SM121, got SM90.", id="cutile"),
    pytest.param(None, "xqa", "auto",
                 "XQA MLA wrapper requires SM120a (CUDA >= 12.8) or SM12x minor >= 1 (CUDA >= 12.9), "
                 f"got compute capability SM90 with CUDA {torch.version.cuda}.", id="xqa"),
]


def _is_sm90() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)


@pytest.mark.gpu
@pytest.mark.parametrize(("backend", "flashinfer_backend", "kv", "message"), SM90_REFUSALS)
def test_flashinfer_mla_refuses_sm90(backend, flashinfer_backend, kv, message) -> None:
    if not _is_sm90():
        pytest.skip("pins FlashInfer's SM90 refusals; this GPU is not SM90")
    pytest.importorskip("flashinfer", reason="FlashInfer is not installed")
    from kvgate.kernels.adapters import flashinfer_mla

    if backend is not None:
        declared = matrix.load().backends[backend]
        assert "sm90" not in declared.archs, f"the matrix now declares {backend} on sm90; update this test"
    case = DecodeCase(spec=BATCH_SPECS["ragged_short"], num_heads=128, page_size=64, kv_cache_dtype=kv)
    inputs = make_inputs(case, "cuda")
    with pytest.raises(ValueError) as raised:
        flashinfer_mla.plan_only(inputs, flashinfer_backend, packed=True)
    print(f"{flashinfer_backend}: {type(raised.value).__name__}: {raised.value}")
    # "in", not "==": the cute-dsl family alias joins its members' refusals ("<member>: <message>; ...")
    assert message in str(raised.value)


def test_trtllm_decode_is_never_called_off_sm100(monkeypatch) -> None:
    """kvgate refuses before touching FlashInfer: on CPU, and on any GPU that is not SM10x."""
    if torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 10:
        pytest.skip("this GPU is SM10x, where the trtllm-gen decode is meant to run")
    case = DecodeCase(spec=BATCH_SPECS["one_token"], num_heads=16, page_size=64, kv_cache_dtype="auto")
    inputs = make_inputs(case, "cuda" if torch.cuda.is_available() else "cpu")
    with pytest.raises(KernelUnavailable) as raised:
        flashinfer_trtllm_mla.prepare(inputs, "flashinfer_trtllm_mla")
    if torch.cuda.is_available():
        major, minor = torch.cuda.get_device_capability()
        expected = (f"FlashInfer trtllm-gen MLA decode runs on SM100/SM103/SM107 only; "
                    f"this GPU is SM{major}{minor}")
    else:
        expected = "FlashInfer trtllm-gen MLA decode needs a CUDA GPU; none is visible here"
    assert str(raised.value) == expected
