"""The gate's fp8_kv_cache check: an FP8 cell whose FP8 was silently ignored fails.

On a real H200 run of kvgate's sm90 cells (tests/fixtures/h200_run, see its README), its copies edited to show an
ignored FP8 setting, malformed evidence, or none; and on the real CPU run of contract 1.3 (tests/fixtures/cpu_run),
written before the evidence existed.
"""

from __future__ import annotations

import datetime as dt
import json
import shutil
from pathlib import Path

import pytest

import archives
from cpu_run_fixture import extract, matrix_of_the_run
from h200_matrix import local_mla_model, matrix_folder
from kvgate import InputErrors
from kvgate.cli import main
from kvgate.gate import evaluation as gate
from kvgate.gate import policy as policy_module
from kvgate.matrix import cells as matrix_module
from kvgate.results.parsers.contract import parse_kv_cache, parse_status
from kvgate.results.records import (
    CONTRACT_VERSION,
    KV_CACHE_EVIDENCE_SINCE,
    KvCacheEvidence,
    contract_version_tuple,
)
from kvgate.results.run_loader import KnownNames, load_run

FIXTURES = Path(__file__).parent / "fixtures"
H200_ARCHIVE = FIXTURES / "h200_run" / "run.tar.xz"
ROOT = Path(__file__).resolve().parents[1]
TODAY = "2026-12-01"

# (FP8 tokens, auto tokens) of the H200 run's FP8 cells that ran (status.json accuracy.kv_cache.tokens)
H200_TOKENS = {
    "flash_attn-fp8-sm90": (3_771_712, 1_891_648),
    "flashinfer-fp8-sm90": (3_783_312, 1_732_320),
    "flashmla-fp8-sm90": (3_324_864, 1_662_400),
    "triton_attn-fp8-sm90": (3_772_384, 1_893_360),
    "triton_mla-fp8-sm90": (3_324_912, 1_662_448),
}
AUTO_TOKENS_TRITON = 1_893_360


@pytest.fixture(scope="module")
def h200_matrix(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The matrix the H200 run was judged with: matrix/*.toml, benchmarks/h200_engine/workloads.toml in place of
    workloads.toml with the MLA model at the run's local path, no per-model tax for DeepSeek-V2-Lite (absent)."""
    return matrix_folder(tmp_path_factory.mktemp("h200-matrix"), local_mla_model)


@pytest.fixture(scope="module")
def h200_unpacked(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("h200-run")
    archives.extract(H200_ARCHIVE, folder)
    return folder / "run"


@pytest.fixture
def h200_run(h200_unpacked: Path, tmp_path: Path) -> Path:
    """A copy of the whole run, to edit."""
    return Path(shutil.copytree(h200_unpacked, tmp_path / "run"))


def pair_run(h200_unpacked: Path, tmp_path: Path, backend: str = "triton_attn") -> Path:
    """A copy of the run's auto and fp8 cells of one backend only (a fast gate)."""
    run = tmp_path / f"run-{backend}"
    for dtype in ("auto", "fp8"):
        shutil.copytree(h200_unpacked / f"{backend}-{dtype}-sm90", run / f"{backend}-{dtype}-sm90")
    return run


def gate_cli(run: Path, matrix: Path, out: Path, *extra: str) -> int:
    return main(["gate", str(run), "--matrix-dir", str(matrix), "--policy", str(matrix / "policy.toml"),
                 "--out", str(out), "--today", TODAY, *extra])


def verdict_checks(out: Path, kind: str = "fp8_kv_cache") -> dict[str, dict]:
    verdict = json.loads((out / "verdict.json").read_text())
    return {c["cell"]: c for c in verdict["checks"] if c["kind"] == kind}


def judge(run: Path, matrix: Path, policy_file: Path | None = None) -> dict[str, gate.Check]:
    """The gate through its public functions: the fp8_kv_cache checks by cell."""
    loaded_matrix = matrix_module.load(matrix)
    policy = policy_module.load(policy_file or matrix / "policy.toml", matrix=loaded_matrix)
    results = load_run(run, KnownNames.from_matrix(loaded_matrix))
    verdict = gate.evaluate(results, policy=policy, today=dt.date.fromisoformat(TODAY))
    return {c.cell: c for c in verdict.checks if c.kind == "fp8_kv_cache"}


def edit_status(cell_dir: Path, **kv_cache: object) -> None:
    """Replace keys of the cell's accuracy.kv_cache (a value of ... deletes the key)."""
    path = cell_dir / "status.json"
    status = json.loads(path.read_text())
    evidence = status["accuracy"].setdefault("kv_cache", {})
    for key, value in kv_cache.items():
        if value is ...:
            evidence.pop(key, None)
        else:
            evidence[key] = value
    path.write_text(json.dumps(status))


def set_kv_cache(cell_dir: Path, value: object) -> None:
    path = cell_dir / "status.json"
    status = json.loads(path.read_text())
    if value is ...:
        status["accuracy"].pop("kv_cache", None)
    else:
        status["accuracy"]["kv_cache"] = value
    path.write_text(json.dumps(status))


def set_contract(run: Path, version: object) -> None:
    """Rewrite contract_version in every cell.json and run.json of the copy (... deletes it)."""
    for path in [*run.glob("*/cell.json"), run / "run.json"]:
        if not path.exists():
            continue
        data = json.loads(path.read_text())
        if version is ...:
            data.pop("contract_version", None)
        else:
            data["contract_version"] = version
        path.write_text(json.dumps(data))


# ---------------------------------------------------------------------------------------------- the real run

def test_the_real_h200_fp8_cells_held_an_fp8_cache(h200_run, h200_matrix, tmp_path, capsys):
    out = tmp_path / "out"
    gate_cli(h200_run, h200_matrix, out)
    found = verdict_checks(out)
    assert sorted(found) == sorted([*H200_TOKENS, "flashinfer-fp8_e5m2-sm90", "triton_attn-fp8_e5m2-sm90"])
    for cell, (tokens, auto) in H200_TOKENS.items():
        check = found[cell]
        assert check["status"] == "pass", check
        assert check["reference"] == "auto cell"
        figures = check["figures"]
        assert (figures["tokens"], figures["auto_tokens"]) == (tokens, auto)
        assert figures["token_ratio"] == pytest.approx(tokens / auto, abs=1e-6)
        assert figures["element_bytes"] == [1] and figures["tensor_dtypes"] == ["uint8"]
        assert figures["layer_kv_cache_dtypes"] == ["fp8"] and figures["layers"] == 6
        assert figures["auto_element_bytes"] == [2]
        assert check["threshold"] == {"element_bytes": 1, "min_token_ratio": 1.5}
    ratios = {cell: round(c["figures"]["token_ratio"], 2) for cell, c in found.items() if cell in H200_TOKENS}
    assert ratios == {"flash_attn-fp8-sm90": 1.99, "flashinfer-fp8-sm90": 2.18, "flashmla-fp8-sm90": 2.0,
                      "triton_attn-fp8-sm90": 1.99, "triton_mla-fp8-sm90": 2.0}
    assert found["triton_attn-fp8-sm90"]["detail"] == "1-byte cache elements (uint8), 6 layers built for fp8"
    # the size in tokens is what the free memory allowed: reported, never judged (contract 1.9)
    assert "KV cache size 3,772,384 tokens = 1.99x the auto cell's (1,893,360): reported, not judged (the size is " \
           "what the free memory at engine start allowed)" in found["triton_attn-fp8-sm90"]["notes"]
    # the e5m2 cells' accuracy stage failed before the engine was up: the accuracy checks fail them
    for cell in ("flashinfer-fp8_e5m2-sm90", "triton_attn-fp8_e5m2-sm90"):
        assert found[cell]["status"] == "not_run" and "accuracy stage is error" in found[cell]["detail"]
    verdict = json.loads((out / "verdict.json").read_text())
    assert verdict["verdict_version"] == "1.6"
    assert verdict["policy"]["fp8_kv_cache_min_token_ratio"] == 1.5
    report = (out / "report.md").read_text()
    assert "| `triton_attn-fp8-sm90` | fp8_kv_cache | 1-byte cache elements (uint8), 6 layers built for fp8" in report
    assert 'classname="kvgate.fp8_kv_cache"' in (out / "junit.xml").read_text()
    assert "fp8_kv_cache" in (out / "report.html").read_text()


@pytest.mark.parametrize(("edit", "expected"), [
    ({"element_bytes": [2], "tensor_dtypes": ["bfloat16"], "layer_kv_cache_dtypes": ["auto"],
      "tokens": AUTO_TOKENS_TRITON},
     "2-byte cache elements (bfloat16): the fp8 KV cache setting was ignored; the attention layers' kv_cache_dtype "
     "is auto, not an FP8 type"),
    ({"element_bytes": [2], "tensor_dtypes": ["bfloat16"]},
     "2-byte cache elements (bfloat16): the fp8 KV cache setting was ignored"),
    ({"bytes_per_token": 1536},  # the auto cell's (set below): the engine's KV cache spec laid out 2-byte tokens
     "1,536 bytes a token in the KV cache spec against the auto cell's 1,536: 1.00x fewer, below 1.5x (an FP8 cache "
     "takes about half the bytes)"),
    ({"element_bytes": [1, 2], "tensor_dtypes": ["bfloat16", "uint8"]},
     "1/2-byte cache elements (bfloat16, uint8): the fp8 KV cache setting was ignored"),
    ({"layer_kv_cache_dtypes": ["auto"]}, "the attention layers' kv_cache_dtype is auto, not an FP8 type"),
])
def test_an_fp8_cell_whose_fp8_was_ignored_fails_named(h200_run, h200_matrix, tmp_path, capsys, edit, expected):
    edit_status(h200_run / "triton_attn-auto-sm90", bytes_per_token=1536)
    edit_status(h200_run / "triton_attn-fp8-sm90", **edit)
    out = tmp_path / "out"
    assert gate_cli(h200_run, h200_matrix, out) == 1
    check = verdict_checks(out)["triton_attn-fp8-sm90"]
    assert check["status"] == "fail"
    assert check["headline"] == expected
    assert check["detail"] == f"{expected} ({h200_run}/triton_attn-fp8-sm90/status.json accuracy.kv_cache)"
    # the first line of the report names the cell and the check (an ignored FP8 setting is named first)
    first = capsys.readouterr().out.splitlines()[0]
    # (its reason shortened at a clause to fit a commit status's 140 characters; the report holds it whole)
    assert first.startswith("❌ kvgate: ") and f"— triton_attn-fp8-sm90 fp8_kv_cache {expected[:25]}" in first
    assert len(first) <= 140
    assert expected in (out / "report.md").read_text(encoding="utf-8")
    others = verdict_checks(out)
    assert all(others[cell]["status"] == "pass" for cell in H200_TOKENS if cell != "triton_attn-fp8-sm90")


def test_the_policy_sets_the_token_ratio(h200_unpacked, h200_matrix, tmp_path):
    policy = tmp_path / "policy.toml"
    policy.write_text((h200_matrix / "policy.toml").read_text() + "\n[kv_cache]\nfp8_min_token_ratio = 2.1\n")
    run = tmp_path / "run"
    for backend, fp8_bytes in (("triton_attn", 771.9), ("flashinfer", 704.6)):  # 1.99x and 2.18x fewer than 1536
        shutil.copytree(pair_run(h200_unpacked, tmp_path, backend), run, dirs_exist_ok=True)
        edit_status(run / f"{backend}-auto-sm90", bytes_per_token=1536)
        edit_status(run / f"{backend}-fp8-sm90", bytes_per_token=fp8_bytes)
    found = judge(run, h200_matrix, policy)
    assert found["flashinfer-fp8-sm90"].status == "pass"  # 2.18x
    assert found["triton_attn-fp8-sm90"].status == "fail"  # 1.99x
    assert "below 2.1x" in found["triton_attn-fp8-sm90"].detail
    assert found["triton_attn-fp8-sm90"].threshold_text == ("1-byte elements, an FP8 layer dtype, ≥ 2.1x auto's "
                                                            "tokens a byte (KV cache spec)")


def test_attack_a_shared_gpu_does_not_fail_an_unchanged_fp8_cell(h200_unpacked, h200_matrix, tmp_path):
    """Two A/B runs on one H200: the FP8 engine started while another held the memory, so its cache held 0.12x the
    auto cell's tokens. The layout decides (bytes per token from the engine's KV cache spec), never the size."""
    run = pair_run(h200_unpacked, tmp_path)
    edit_status(run / "triton_attn-auto-sm90", bytes_per_token=1536)
    edit_status(run / "triton_attn-fp8-sm90", tokens=227_203, bytes_per_token=768)  # 0.12x auto's 1,893,360
    check = judge(run, h200_matrix)["triton_attn-fp8-sm90"]
    assert check.status == "pass", check.detail
    assert check.detail == ("1-byte cache elements (uint8), 768 bytes a token in the KV cache spec, 2.00x fewer than "
                            "the auto cell's 1,536, 6 layers built for fp8")
    assert check.figures["bytes_ratio"] == 2.0 and round(check.figures["token_ratio"], 2) == 0.12
    assert ("KV cache size 227,203 tokens = 0.12x the auto cell's (1,893,360): reported, not judged (the size is what "
            "the free memory at engine start allowed)") in check.notes


def test_a_cell_of_contract_1_9_must_record_its_bytes_per_token(h200_unpacked, h200_matrix, tmp_path):
    run = pair_run(h200_unpacked, tmp_path)
    set_contract(run, "1.9")
    check = judge(run, h200_matrix)["triton_attn-fp8-sm90"]
    assert check.status == "fail"
    assert check.headline == ("accuracy.kv_cache records no bytes_per_token (the engine's KV cache spec; a writer of "
                              "contract 1.9 records it)")
    edit_status(run / "triton_attn-fp8-sm90", bytes_per_token=768)
    check = judge(run, h200_matrix)["triton_attn-fp8-sm90"]
    assert check.status == "pass"
    assert check.notes[0] == "KV cache layout not compared with the auto cell's: the auto cell recorded no bytes_per_token"


@pytest.mark.parametrize("value", ['"x"', "0", "-1", "true", "{}"])
def test_a_malformed_policy_ratio_is_an_input_error(h200_matrix, tmp_path, value):
    from kvgate import InputErrors

    matrix = matrix_module.load(h200_matrix)
    policy = tmp_path / "policy.toml"
    policy.write_text((h200_matrix / "policy.toml").read_text() + f"\n[kv_cache]\nfp8_min_token_ratio = {value}\n")
    with pytest.raises(InputErrors) as error:
        policy_module.load(policy, matrix=matrix)
    assert "kv_cache.fp8_min_token_ratio" in str(error.value)


def test_an_unknown_policy_key_under_kv_cache_is_an_input_error(h200_matrix, tmp_path):
    from kvgate import InputErrors

    policy = tmp_path / "policy.toml"
    policy.write_text((h200_matrix / "policy.toml").read_text() + "\n[kv_cache]\nfp8_min_tokens_ratio = 1.5\n")
    with pytest.raises(InputErrors, match="unknown key 'fp8_min_tokens_ratio'"):
        policy_module.load(policy, matrix=matrix_module.load(h200_matrix))


# ---------------------------------------------------------------------------------------------- malformed evidence

HUGE = 10**40
MALFORMED = [
    ("fp8", "accuracy.kv_cache: expected an object, got string 'fp8'"),
    (None, "accuracy.kv_cache: expected an object, got null"),
    ([1, 2], "accuracy.kv_cache: expected an object, got a list"),
    ({"tokens": -5}, "accuracy.kv_cache.tokens: expected a whole number from 1 to 999,999,999,999,999, got number -5"),
    ({"tokens": 0}, "accuracy.kv_cache.tokens: expected a whole number from 1 to 999,999,999,999,999, got number 0"),
    ({"tokens": HUGE}, "accuracy.kv_cache.tokens: expected a whole number from 1 to 999,999,999,999,999, got an "
                       "integer of about 41 digits"),
    ({"tokens": 3.5}, "accuracy.kv_cache.tokens: expected a whole number from 1 to 999,999,999,999,999, got number "
                      "3.5"),
    ({"tokens": True}, "accuracy.kv_cache.tokens: expected a whole number from 1 to 999,999,999,999,999, got "
                       "boolean true"),
    ({"tokens": "3771712"}, "accuracy.kv_cache.tokens: expected a whole number from 1 to 999,999,999,999,999, got "
                            "string '3771712'"),
    ({"element_bytes": ["x", None, 2]},
     "accuracy.kv_cache.element_bytes[0]: expected a whole number from 1 to 64, got string 'x'; "
     "accuracy.kv_cache.element_bytes[1]: expected a whole number from 1 to 64, got null"),
    ({"element_bytes": 1}, "accuracy.kv_cache.element_bytes: expected a list, got number 1"),
    ({"element_bytes": [0]}, "accuracy.kv_cache.element_bytes[0]: expected a whole number from 1 to 64, got number 0"),
    ({"element_bytes": [HUGE]}, "accuracy.kv_cache.element_bytes[0]: expected a whole number from 1 to 64, got an "
                                "integer of about 41 digits"),
    ({"element_bytes": [1] * 65}, "accuracy.kv_cache.element_bytes: 65 entries, more than 64"),
    ({"layer_kv_cache_dtypes": [{"fp8": 1}, ["fp8"], 8]},
     "accuracy.kv_cache.layer_kv_cache_dtypes[0]: expected a dtype name (letters, digits, _ . : -; at most 64), got "
     "an object; accuracy.kv_cache.layer_kv_cache_dtypes[1]: expected a dtype name (letters, digits, _ . : -; at "
     "most 64), got a list; accuracy.kv_cache.layer_kv_cache_dtypes[2]: expected a dtype name (letters, digits, _ . "
     ": -; at most 64), got number 8"),
    ({"tensor_dtypes": ["\x1b[31muint8\nFAIL"]},
     "accuracy.kv_cache.tensor_dtypes[0]: expected a dtype name (letters, digits, _ . : -; at most 64), got string "
     "'\\x1b[31muint8\\nFAIL'"),
    ({"tensor_dtypes": ["u" * 5000]},
     "accuracy.kv_cache.tensor_dtypes[0]: expected a dtype name (letters, digits, _ . : -; at most 64), got string "
     f"'{'u' * 40}'…"),
    ({"tensor_dtypes": "uint8"}, "accuracy.kv_cache.tensor_dtypes: expected a list, got string 'uint8'"),
    ({"layers": -1, "tokens": -1, "element_bytes": [-1], "tensor_dtypes": [1]},
     "accuracy.kv_cache.layers: expected a whole number from 0 to 100,000, got number -1; "
     "accuracy.kv_cache.tensor_dtypes[0]: expected a dtype name (letters, digits, _ . : -; at most 64), got number 1; "
     "accuracy.kv_cache.element_bytes[0]: expected a whole number from 1 to 64, got number -1 (+1 more)"),
]


@pytest.mark.parametrize(("value", "problem"), MALFORMED)
def test_malformed_evidence_is_named_by_the_reader(value, problem):
    status = parse_status(json.dumps({"accuracy": {"status": "ok", "kv_cache": value}}), "status.json")
    evidence = status["accuracy"].kv_cache
    assert evidence == KvCacheEvidence(problem=problem)


def test_good_evidence_reads_and_unknown_keys_are_ignored():
    status = parse_status(json.dumps({"accuracy": {"status": "ok", "kv_cache": {
        "layers": 6, "layer_kv_cache_dtypes": ["fp8"], "tensor_dtypes": ["uint8"], "element_bytes": [1],
        "tokens": 3771712, "from_a_newer_minor": {"x": 1}}}, "kernels": {"status": "ok", "kv_cache": "free"}}),
        "status.json")
    assert status["accuracy"].kv_cache == KvCacheEvidence(layers=6, layer_kv_cache_dtypes=("fp8",),
                                                          tensor_dtypes=("uint8",), element_bytes=(1,), tokens=3771712)
    assert status["kernels"].kv_cache is None  # only the accuracy stage's entry carries the evidence
    assert parse_kv_cache({}, "k") == KvCacheEvidence()


@pytest.mark.parametrize(("value", "problem"), [MALFORMED[0], MALFORMED[5], MALFORMED[9], MALFORMED[15]])
def test_malformed_evidence_errors_the_check_cleanly(h200_unpacked, h200_matrix, tmp_path, capsys, value, problem):
    run = pair_run(h200_unpacked, tmp_path)
    set_kv_cache(run / "triton_attn-fp8-sm90", value)
    out = tmp_path / "out"
    assert gate_cli(run, h200_matrix, out) == 1
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err + captured.out
    check = verdict_checks(out)["triton_attn-fp8-sm90"]
    assert check["status"] == "error"
    assert check["headline"] == f"unreadable KV cache evidence: {problem}"
    assert check["detail"] == f"unreadable KV cache evidence: {problem} ({run}/triton_attn-fp8-sm90/status.json)"
    # the rest of the cell was still read and judged
    assert verdict_checks(out, "accuracy")["triton_attn-fp8-sm90"]["status"] == "pass"


def test_malformed_evidence_of_the_auto_cell_errors_the_comparison(h200_unpacked, h200_matrix, tmp_path):
    run = pair_run(h200_unpacked, tmp_path)
    set_kv_cache(run / "triton_attn-auto-sm90", {"tokens": -3})
    check = judge(run, h200_matrix)["triton_attn-fp8-sm90"]
    assert check.status == "error"
    assert check.detail.startswith("the auto cell's KV cache evidence is unreadable: accuracy.kv_cache.tokens: "
                                   "expected a whole number")


def test_an_integer_beyond_json_readers_is_an_input_error_not_a_traceback(h200_unpacked, h200_matrix, tmp_path,
                                                                          capsys):
    run = pair_run(h200_unpacked, tmp_path)
    path = run / "triton_attn-fp8-sm90" / "status.json"
    path.write_text(path.read_text().replace('"tokens": 3772384', '"tokens": ' + "9" * 5000))
    assert gate_cli(run, h200_matrix, tmp_path / "out") == 1  # that cell's file: the cell errors, not the run
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert f"{run}/triton_attn-fp8-sm90/status.json" in err and "4300 digits" in err


# ---------------------------------------------------------------------------------------------- contract versions

def test_the_contract_is_1_18_and_the_evidence_is_required_from_1_4():
    assert CONTRACT_VERSION == "1.18"
    assert contract_version_tuple(CONTRACT_VERSION) == (1, 18)
    assert KV_CACHE_EVIDENCE_SINCE == (1, 4)


@pytest.mark.parametrize(("value", "parsed"), [
    ("1.4", (1, 4)), ("1.3", (1, 3)), ("1.10", (1, 10)), ("1", (1, 0)), (1, (1, 0)), (1.0, (1, 0)),
    ("1.4.2", (1, 4)), ("1.x", None), ("1.²", None), (True, None), (None, None), ([1], None), ("1." + "9" * 50, None),
])
def test_contract_versions_read(value, parsed):
    assert contract_version_tuple(value) == parsed


@pytest.mark.parametrize("where", ["cell.json", "run.json"])
def test_a_1_4_cell_without_evidence_errors(h200_unpacked, h200_matrix, tmp_path, where):
    run = pair_run(h200_unpacked, tmp_path)
    (run / "run.json").write_text(json.dumps({"contract_version": "1.4"}))
    set_contract(run, "1.4")
    if where == "run.json":  # cell.json silent: run.json's version applies
        for path in run.glob("*/cell.json"):
            data = json.loads(path.read_text())
            del data["contract_version"]
            path.write_text(json.dumps(data))
    set_kv_cache(run / "triton_attn-fp8-sm90", ...)
    check = judge(run, h200_matrix)["triton_attn-fp8-sm90"]
    assert check.status == "error"
    assert check.headline == "no evidence the KV cache was FP8: status.json accuracy has no kv_cache"
    assert check.detail == (f"no evidence the KV cache was FP8: {run}/triton_attn-fp8-sm90/status.json accuracy has "
                            "no kv_cache; from contract 1.4 on the accuracy stage must record it")


def test_a_1_4_cell_with_only_a_size_and_nothing_to_compare_it_with_errors(h200_unpacked, h200_matrix, tmp_path):
    run = pair_run(h200_unpacked, tmp_path)
    set_contract(run, "1.4")
    set_kv_cache(run / "triton_attn-fp8-sm90", {"tokens": 3772384})
    set_kv_cache(run / "triton_attn-auto-sm90", ...)
    check = judge(run, h200_matrix)["triton_attn-fp8-sm90"]
    assert check.status == "error"
    assert check.headline == ("no evidence the KV cache was FP8: status.json accuracy.kv_cache has no element_bytes "
                              "or layer_kv_cache_dtypes, and no bytes_per_token to compare with the auto cell's")
    assert check.notes == ("KV cache layout not compared with the auto cell's: this cell recorded no bytes_per_token",
                           "KV cache size 3,772,384 tokens: reported, not judged (the size is what the free memory at "
                           "engine start allowed)")


def test_a_1_4_cell_judged_on_partial_evidence(h200_unpacked, h200_matrix, tmp_path):
    run = pair_run(h200_unpacked, tmp_path)
    set_contract(run, "1.4")
    edit_status(run / "triton_attn-fp8-sm90", tokens=...)  # no size in the log: the element size still decides
    check = judge(run, h200_matrix)["triton_attn-fp8-sm90"]
    assert check.status == "pass"
    assert check.detail == "1-byte cache elements (uint8), 6 layers built for fp8"
    assert check.notes == ("KV cache layout not compared with the auto cell's: this cell recorded no bytes_per_token",)
    edit_status(run / "triton_attn-auto-sm90", bytes_per_token=1536)
    set_kv_cache(run / "triton_attn-fp8-sm90", {"bytes_per_token": 768})  # the layout alone, against auto's
    check = judge(run, h200_matrix)["triton_attn-fp8-sm90"]
    assert check.status == "pass" and check.detail == ("768 bytes a token in the KV cache spec, 2.00x fewer than the "
                                                       "auto cell's 1,536")


def test_a_1_4_cell_with_an_unreadable_minor_version_fails_closed(h200_unpacked, h200_matrix, tmp_path):
    """A version the readers cannot place is against the schemas (contract 1.9): each cell saying it is that cell's
    error, never judged as some version; a run.json saying it makes the run unusable."""
    run = pair_run(h200_unpacked, tmp_path)
    set_contract(run, "1.x")
    set_kv_cache(run / "triton_attn-fp8-sm90", ...)
    loaded = load_run(run, KnownNames.from_matrix(matrix_module.load(h200_matrix)))
    assert loaded.cells == ()
    assert [cell.problems for cell in loaded.unreadable] == [
        (f"{run}/triton_attn-{dtype}-sm90/cell.json: expected a version number like 1 or \"1.9\", got string '1.x' "
         "in contract_version",) for dtype in ("auto", "fp8")]
    (run / "run.json").write_text(json.dumps({"contract_version": "1.x"}))
    with pytest.raises(InputErrors) as raised:
        judge(run, h200_matrix)
    assert [str(e) for e in raised.value.errors] == [
        f"{run}/run.json: expected a version number like 1 or \"1.9\", got string '1.x' in contract_version"]


@pytest.mark.parametrize(("version", "shown"), [("1.3", "contract 1.3"), (1, "contract 1"),
                                                (..., "no contract_version (1)")])
def test_older_results_without_evidence_are_not_judged(h200_unpacked, h200_matrix, tmp_path, version, shown):
    run = pair_run(h200_unpacked, tmp_path)
    set_contract(run, version)
    set_kv_cache(run / "triton_attn-fp8-sm90", ...)
    check = judge(run, h200_matrix)["triton_attn-fp8-sm90"]
    assert check.status == "not_run"
    assert check.detail == (f"not judged: the results predate the KV cache evidence ({shown}, before 1.4; {run}/"
                            "triton_attn-fp8-sm90/status.json accuracy has no kv_cache)")


def test_older_results_with_evidence_are_judged(h200_unpacked, h200_matrix, tmp_path):
    run = pair_run(h200_unpacked, tmp_path)
    set_contract(run, "1.3")
    edit_status(run / "triton_attn-fp8-sm90", element_bytes=[2])
    assert judge(run, h200_matrix)["triton_attn-fp8-sm90"].status == "fail"


def test_no_auto_cell_the_layers_still_decide(h200_unpacked, h200_matrix, tmp_path):
    run = pair_run(h200_unpacked, tmp_path)
    shutil.rmtree(run / "triton_attn-auto-sm90")
    check = judge(run, h200_matrix)["triton_attn-fp8-sm90"]
    assert check.status == "pass"
    assert check.detail == "1-byte cache elements (uint8), 6 layers built for fp8"
    assert check.notes == ("KV cache layout not compared with the auto cell's: no auto cell of the same backend, arch "
                           "and model in this run", "KV cache size 3,772,384 tokens: reported, not judged (the size is "
                           "what the free memory at engine start allowed)")


# ---------------------------------------------------------------------------------------------- the CPU run (1.3)

def test_the_real_cpu_run_of_contract_1_3_is_not_judged(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("KVGATE_MATRIX_DIR", str(matrix_of_the_run(tmp_path / "matrix")))
    run = extract(tmp_path)
    assert json.loads((run / "cpu_attn-fp8-cpu" / "cell.json").read_text())["contract_version"] == "1.3"
    assert main(["gate", str(run), "--today", "2026-11-30"]) == 0  # its verdict is unchanged
    check = verdict_checks(run / "gate")["cpu_attn-fp8-cpu"]
    assert check["status"] == "not_run"
    assert check["detail"] == (f"not judged: the results predate the KV cache evidence (contract 1.3, before 1.4; "
                               f"{run}/cpu_attn-fp8-cpu/status.json accuracy has no kv_cache)")
    assert list(verdict_checks(run / "gate")) == ["cpu_attn-fp8-cpu"]  # auto cells have no such check


# ------------------------------------------------------------------------- the passkey task's engine of its own (1.14)
# The fifth H200 round's long-context base side (tests/fixtures/h200_canaries/features-round5-runs.tar.xz): FLASH_ATTN
# with CUDA graphs, gsm8k on the tiny Llama and the passkey task in an engine of kvgate:tiny-llama-long, whose KV
# cache status.json records as long_context.engine.kv_cache (FP8: 1-byte elements, 512 bytes a token; auto: bf16,
# 1024).

ROUND5 = FIXTURES / "h200_canaries" / "features-round5-runs.tar.xz"
LONG_FP8 = "flash_attn-fp8-sm90"


@pytest.fixture(scope="module")
def long_context_base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("round5")
    archives.extract(ROUND5, folder)
    return folder / "h200l" / "base-FLASH_ATTN"


def judge_long(base: Path, tmp_path: Path, edit=None) -> dict:
    """The fp8_kv_cache check of the long-context FP8 cell, on a copy of the base side edited by edit(status of the
    FP8 cell, its cell.json)."""
    from gate_in_process import gate as gate_in_process
    from h200_matrix import cuda_graphs

    run = Path(shutil.copytree(base, tmp_path / "run"))
    if edit is not None:
        status_path, cell_path = run / LONG_FP8 / "status.json", run / LONG_FP8 / "cell.json"
        status, cell = json.loads(status_path.read_text()), json.loads(cell_path.read_text())
        edit(status, cell)
        status_path.write_text(json.dumps(status))
        cell_path.write_text(json.dumps(cell))
    matrix = matrix_folder(tmp_path / "matrix", cuda_graphs)
    code, printed = gate_in_process(str(run), "--matrix-dir", str(matrix), "--policy", str(matrix / "policy.toml"),
                                    "--today", "2026-12-03")
    assert code in (0, 1), printed
    verdict = json.loads((run / "gate" / "verdict.json").read_text())
    return next(c for c in verdict["checks"] if c["cell"] == LONG_FP8 and c["kind"] == "fp8_kv_cache")


def test_the_passkey_engine_of_its_own_is_judged_fp8_beside_the_gsm8k_engine(long_context_base, tmp_path):
    check = judge_long(long_context_base, tmp_path)
    assert check["status"] == "pass"
    assert ("the passkey task's engine (kvgate:tiny-llama-long): 1-byte cache elements, layers built for fp8, 2.00x "
            "fewer bytes a token than the auto cell's (1,024)") in check["detail"]
    assert check["figures"]["long_context_engine"] == {
        "model": "kvgate:tiny-llama-long", "layers": 2, "layer_kv_cache_dtypes": ["fp8"], "element_bytes": [1],
        "bytes_per_token": 512, "auto_bytes_per_token": 1024, "bytes_ratio": 2.0}


def test_a_passkey_engine_that_ignored_fp8_fails_the_check_its_gsm8k_engine_passes(long_context_base, tmp_path):
    """The FP8 cell's passkey engine recorded the auto cell's bf16 cache: its gsm8k engine's evidence is untouched
    and passes; the check fails, naming the second engine and the file."""
    def bf16_passkey_engine(status: dict, cell: dict) -> None:
        status["long_context"]["engine"]["kv_cache"] = {
            "bytes_per_token": 1024, "element_bytes": [2], "layer_kv_cache_dtypes": ["auto"], "layers": 2,
            "tensor_dtypes": ["bfloat16"], "k_scales": [1.0], "v_scales": [1.0]}

    check = judge_long(long_context_base, tmp_path, bf16_passkey_engine)
    assert check["status"] == "fail"
    where = f"{LONG_FP8}/status.json long_context.engine.kv_cache"
    for part in ("the passkey task's engine (kvgate:tiny-llama-long): 2-byte cache elements: the fp8 KV cache "
                 "setting was ignored", "the attention layers' kv_cache_dtype is auto, not an FP8 type",
                 "1,024 bytes a token in its KV cache spec against the auto cell's passkey engine's 1,024: 1.00x "
                 "fewer, below 1.5x", where):
        assert part in check["detail"], part
    assert check["figures"]["element_bytes"] == [1]  # the gsm8k engine's, which held FP8


@pytest.mark.parametrize(("engine", "contract", "status", "said"), [
    ("FLASH_ATTN", "1.12", "error", "long_context.engine: expected an object, got string 'FLASH_ATTN'"),
    (None, "1.14", "error", "no evidence the passkey task's engine (kvgate:tiny-llama-long) held an FP8 KV cache"),
    (None, "1.13", "pass", None),
    ({"kv_cache": {"element_bytes": "one"}}, "1.12", "error", "long_context.engine.kv_cache.element_bytes"),
])
def test_a_passkey_engine_without_readable_evidence(long_context_base, tmp_path, engine, contract, status, said):
    """A malformed engine entry errors the check; none at all errors it from contract 1.14 on and is a note before."""
    def edit(status_doc: dict, cell: dict) -> None:
        if engine is None:
            del status_doc["long_context"]["engine"]
        else:
            status_doc["long_context"]["engine"] = engine
        cell["contract_version"] = contract

    check = judge_long(long_context_base, tmp_path, edit)
    assert check["status"] == status
    if said is not None:
        assert said in check["detail"]
    else:
        assert "recorded no KV cache evidence" in " ".join(check.get("notes", []))
