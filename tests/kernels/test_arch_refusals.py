"""Where the matrix says a backend does not run on this arch, its kernel library must refuse clearly.

FlashInfer's MLA wrapper refuses SM90 at plan time, before compiling or launching anything; these tests
pin the exact messages so a FlashInfer update that starts launching (or hanging, or crashing) there is
caught. kvgate's own guard for the trtllm-gen decode function is pinned too: that function has no arch
check and hangs ~56 s off SM100, so it must never be reached on another arch.

The message depends on the FlashInfer series (chosen by ``flashinfer.__version__``):
- 0.7.x (0.7.2.post1 on the H200, docs/facts/h200.md#flashinfers-mla-decode-on-sm90-fa2-and-fa3-only): each
  backend's own arch check.
- 0.6.x (0.6.14: what vLLM 0.26.0 pins and ci/locks/gpu-py312-x86_64.txt installs). Its wrapper has no
  arch check for these names because it has no such backends: ``BatchMLAPagedAttentionWrapper.__init__``
  takes any name (flashinfer/mla/_core.py:1544-1548; "cutlass" returns early at 1526-1528), and ``plan``
  hands it to ``get_batch_mla_module`` (mla/_core.py:1638), whose ``gen_batch_mla_module`` knows fa2 and
  fa3 only and raises ``ValueError("Unsupported backend: <name>")`` (flashinfer/jit/attention/modules.py:193)
  before it writes a source file or calls nvcc. An FP8 cache is refused earlier, at mla/_core.py:1610-1614
  ("FP8 kv_data_type for MLA is only supported with the fa3 backend on SM90, got backend='trtllm-gen'.").
  So on 0.6.14 these calls are as cheap as on 0.7.x (no JIT, no download, no launch). 0.6.14's real
  trtllm-gen MLA path is the function ``trtllm_batch_decode_with_kv_cache_mla``, which has no arch check
  for ``backend="trtllm-gen"`` (mla/_core.py:2752-2757 resolves only "auto"; 2810 accepts "trtllm-gen"; the
  autotuned runner loads the trtllm-gen cubins, mla/_core.py:2252): the trap of
  docs/facts/h200.md#trtllm-gen-mla-decode-has-no-arch-check-and-hangs-off-sm100,
  which only kvgate's guard keeps away (`test_trtllm_decode_is_never_called_off_sm100`).
On the H200 on 2026-12-01 (FlashInfer 0.6.14) all six refusal tests failed because kvgate planned with
0.7.x's API (``flashinfer.mla.MLAPlanMetadata`` does not exist in 0.6.14); the adapter now plans with
either API (kvgate.kernels.adapters.flashinfer_mla).
"""

from __future__ import annotations

import re

import pytest
import torch

from kvgate.kernels.adapters import KernelUnavailable, flashinfer_trtllm_mla
from kvgate.kernels.cases import BATCH_SPECS, DecodeCase, make_inputs
from kvgate.matrix import cells as matrix

FI06_FP8_NOT_FA3 = "FP8 kv_data_type for MLA is only supported with the fa3 backend on SM90, got backend={!r}."
FI06_UNKNOWN = "Unsupported backend: {}"

# (matrix backend whose kernel this is, FlashInfer wrapper backend, kv dtype,
#  exact SM90 refusal of FlashInfer 0.7.x, exact refusal of FlashInfer 0.6.x)
SM90_REFUSALS = [
    pytest.param("FLASHINFER_MLA", "trtllm-gen", "auto",
                 "trtllm-gen MLA requires SM100/SM103/SM107, got compute capability SM90.",
                 FI06_UNKNOWN.format("trtllm-gen"), id="trtllm-gen"),
    pytest.param("FLASHINFER_MLA", "trtllm-gen", "fp8_e4m3",
                 "trtllm-gen MLA requires SM100/SM103/SM107, got compute capability SM90.",
                 FI06_FP8_NOT_FA3.format("trtllm-gen"), id="trtllm-gen-fp8"),
    pytest.param("CUTLASS_MLA", "cutlass", "auto",
                 "cutlass backend supports only compute capability major versions 10 and 11, got SM90.",
                 FI06_UNKNOWN.format("cutlass"), id="cutlass"),
    pytest.param(None, "cute-dsl", "auto",
                 "cute-dsl backend requires SM100/SM103/SM107, got compute capability SM90.",
                 FI06_UNKNOWN.format("cute-dsl"), id="cute-dsl"),
    pytest.param(None, "cutile", "auto",
                 "cutile backend supports only the validated Blackwell targets SM100, SM103, SM107, SM120, "
                 "and SM121, got SM90.", FI06_UNKNOWN.format("cutile"), id="cutile"),
    pytest.param(None, "xqa", "auto",
                 "XQA MLA wrapper requires SM120a (CUDA >= 12.8) or SM12x minor >= 1 (CUDA >= 12.9), "
                 f"got compute capability SM90 with CUDA {torch.version.cuda}.", FI06_UNKNOWN.format("xqa"),
                 id="xqa"),
]


def flashinfer_series(version: str) -> tuple[int, int]:
    """(major, minor) of a FlashInfer version string: '0.6.14' -> (0, 6), '0.7.2.post1' -> (0, 7)."""
    found = re.match(r"(\d+)\.(\d+)", version)
    if not found:
        raise ValueError(f"not a FlashInfer version: {version!r}")
    return int(found.group(1)), int(found.group(2))


def expected_refusal(version: str, message_07: str, message_06: str) -> str:
    """The refusal the installed FlashInfer documents: 0.6.x's, or 0.7.x's (also for anything newer)."""
    return message_06 if flashinfer_series(version) < (0, 7) else message_07


def _is_sm90() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)


@pytest.mark.gpu
@pytest.mark.parametrize(("backend", "flashinfer_backend", "kv", "message_07", "message_06"), SM90_REFUSALS)
def test_flashinfer_mla_refuses_sm90(backend, flashinfer_backend, kv, message_07, message_06) -> None:
    if not _is_sm90():
        pytest.skip("pins FlashInfer's SM90 refusals; this GPU is not SM90")
    flashinfer = pytest.importorskip("flashinfer", reason="FlashInfer is not installed")
    from kvgate.kernels.adapters import flashinfer_mla

    message = expected_refusal(flashinfer.__version__, message_07, message_06)

    if backend is not None:
        declared = matrix.load().backends[backend]
        assert "sm90" not in declared.archs, f"the matrix now declares {backend} on sm90; update this test"
    case = DecodeCase(spec=BATCH_SPECS["ragged_short"], num_heads=128, page_size=64, kv_cache_dtype=kv)
    inputs = make_inputs(case, "cuda")
    with pytest.raises(ValueError) as raised:
        flashinfer_mla.plan_only(inputs, flashinfer_backend, packed=True)
    print(f"flashinfer {flashinfer.__version__} {flashinfer_backend}: {type(raised.value).__name__}: {raised.value}")
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


def test_the_refusal_follows_the_flashinfer_series() -> None:
    """On CPU: 0.6.x (vLLM 0.26.0's pin) expects 0.6.14's messages; 0.7.x and later the 0.7.2 ones."""
    assert flashinfer_series("0.6.14") == (0, 6) and flashinfer_series("0.7.2.post1") == (0, 7)
    assert flashinfer_series("1.0.0rc1") == (1, 0)
    by_id = {p.id: p.values for p in SM90_REFUSALS}
    assert expected_refusal("0.6.14", *by_id["trtllm-gen"][3:]) == "Unsupported backend: trtllm-gen"
    assert expected_refusal("0.6.14", *by_id["trtllm-gen-fp8"][3:]) == (
        "FP8 kv_data_type for MLA is only supported with the fa3 backend on SM90, got backend='trtllm-gen'.")
    assert expected_refusal("0.7.2.post1", *by_id["cutlass"][3:]).startswith("cutlass backend supports only")
    assert {expected_refusal("0.6.14", *v[3:]) for k, v in by_id.items() if k != "trtllm-gen-fp8"} == {
        f"Unsupported backend: {name}" for name in ("trtllm-gen", "cutlass", "cute-dsl", "cutile", "xqa")}
    with pytest.raises(ValueError, match="not a FlashInfer version"):
        flashinfer_series("unknown")
