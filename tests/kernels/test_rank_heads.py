"""The heads a tensor-parallel rank runs its decode kernel with (kvgate.kernels.cases MLA_RANK_HEADS,
GQA_RANK_HEADS): each entry is the split vLLM makes, kvgate's own tiny models are declared as they are shipped and as
the matrix's tp2 feature runs them, and the kernel tests run every such shape on every family."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import test_attention_decode
import test_mla_decode

from kvgate.kernels.cases import (
    GQA_RANK_HEADS,
    HEAD_COUNTS,
    MLA_HEAD_COUNTS,
    MLA_RANK_HEADS,
    RankHeads,
    rank_heads_of,
)
from kvgate.kernels.families import FAMILIES
from kvgate.matrix import cells

MODELS = Path(__file__).resolve().parents[2] / "src" / "kvgate" / "workloads" / "models"


def _shipped(model: str) -> dict:
    return json.loads((MODELS / model.removeprefix("kvgate:") / "config.json").read_text())


@pytest.mark.parametrize("rank", [*MLA_RANK_HEADS, *GQA_RANK_HEADS], ids=lambda rank: rank.label)
def test_each_rank_holds_an_even_share(rank: RankHeads) -> None:
    assert rank.heads % rank.tensor_parallel_size == 0, "vLLM refuses a head count its TP size does not divide"
    assert rank.num_heads * rank.tensor_parallel_size == rank.heads
    assert rank.num_heads % rank.num_kv_heads == 0  # whole query groups a KV head
    assert rank.tensor_parallel_size > 1


def test_kvgate_tiny_models_are_declared_at_the_tp2_features_size() -> None:
    tp2 = cells.load().features["tp2"].engine_args["tensor_parallel_size"]
    tiny = [rank for rank in (*MLA_RANK_HEADS, *GQA_RANK_HEADS) if rank.model.startswith("kvgate:")]
    assert {rank.model for rank in tiny} == {"kvgate:tiny-deepseek-v2", "kvgate:tiny-llama"}
    for rank in tiny:
        config = _shipped(rank.model)
        assert rank.tensor_parallel_size == tp2
        assert rank.heads == config["num_attention_heads"], f"{rank.model}'s config.json says otherwise"
        if rank in GQA_RANK_HEADS:
            assert (rank.kv_heads, rank.head_dim) == (config["num_key_value_heads"], config["head_dim"])
    mla = next(rank for rank in tiny if rank in MLA_RANK_HEADS)
    assert mla.num_heads == 1  # the shape the tp2 cells' FLASHMLA decode runs: one query head a rank


def test_mla_head_counts_cover_the_ranks_and_a_count_that_does_not_divide_16() -> None:
    assert set(HEAD_COUNTS) <= set(MLA_HEAD_COUNTS)
    assert {rank.num_heads for rank in MLA_RANK_HEADS} <= set(MLA_HEAD_COUNTS)
    assert any(16 % heads for heads in MLA_HEAD_COUNTS if heads < 16)  # 12: kernels that pad to 16 need divisors
    assert rank_heads_of(12) == "Kimi-K3 (96 heads) at TP 8"
    assert rank_heads_of(128) == ""
    assert rank_heads_of(4, 1, 128) == "Llama-3.1-8B (32 heads) at TP 8"
    assert rank_heads_of(32, 8, 128) == ""  # TP 1's GQA_HEADS


def _param_cases(params) -> list:
    return [param.values for param in params]


def test_every_mla_family_runs_every_rank_head_count() -> None:
    cases = _param_cases(test_mla_decode._accuracy_params())
    for family in (f for f in FAMILIES.values() if f.mla):
        for kv in ("auto", "fp8_e4m3"):
            if kv not in family.kv_cache_dtypes:
                continue
            heads = {case.num_heads for fam, case in cases if fam is family and case.kv_cache_dtype == kv}
            assert heads == set(MLA_HEAD_COUNTS), f"{family.name} {kv}: {sorted(heads)}"


def test_every_grouped_query_gpu_family_runs_every_rank_shape() -> None:
    cases = _param_cases(test_attention_decode._accuracy_params())
    wanted = {(rank.num_heads, rank.num_kv_heads, rank.head_dim) for rank in GQA_RANK_HEADS}
    for family in test_attention_decode.GPU_FAMILIES:
        for kv in {case.kv_cache_dtype for fam, case in cases if fam is family}:
            shapes = {(case.num_heads, case.num_kv_heads, case.head_dim)
                      for fam, case in cases if fam is family and case.kv_cache_dtype == kv}
            assert wanted <= shapes, f"{family.name} {kv}: missing {sorted(wanted - shapes)}"
            assert len(shapes) == len(wanted) + 1  # and TP 1's GQA_HEADS
