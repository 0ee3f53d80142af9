"""timings.json (format version 1): writing, reading, refusing, comparing; on CPU."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from kvgate.kernels import runner, timings

FIXTURE = Path(__file__).parent / "fixtures" / "h200" / "timings-all.json"


def entry(**overrides) -> timings.TimingEntry:
    base = dict(family="flashinfer_mla_fa3", kv_cache_dtype="fp8_e4m3", spec="b32-h128-kv8192", batch=32,
                num_heads=128, kv_len=8192, page_size=64, median_us=470.96, min_us=467.26, max_us=496.13,
                repeats=30, bytes=159907840, achieved_gbps=339.5, fraction_of_copy=0.0839, cuda_graph=True,
                provenance="flashinfer 0.7.2.post1 BatchMLAPagedAttentionWrapper backend=fa3")
    return timings.TimingEntry(**{**base, **overrides})


def test_fragments_merge_into_a_versioned_document(tmp_path: Path) -> None:
    timings.write_fragment(tmp_path, "gw0", entry())
    timings.write_fragment(tmp_path, "gw1", entry(kv_cache_dtype="auto", median_us=142.51))
    timings.write_device_fragment(tmp_path, "gw0", {"name": "NVIDIA H200"}, {"repeats": 30})
    document = runner.timings_document(tmp_path, "triton_mla-fp8-sm90")
    assert (document["format"], document["version"], document["cell_id"]) == (
        "kvgate-kernel-timings", 1, "triton_mla-fp8-sm90")
    assert document["device"] == {"name": "NVIDIA H200"} and document["method"] == {"repeats": 30}
    parsed = timings.parse(json.loads(json.dumps(document)), "timings.json")
    assert [e.kv_cache_dtype for e in parsed] == ["auto", "fp8_e4m3"]
    assert runner.timings_document(tmp_path / "none", None) is None


def test_reads_the_h200_fixture() -> None:
    entries = timings.read(FIXTURE)
    assert len(entries) == 18
    fa3_bf16 = next(e for e in entries if e.key == ("flashinfer_mla_fa3", "auto", "b32-h128-kv8192"))
    fa3_fp8 = next(e for e in entries if e.key == ("flashinfer_mla_fa3", "fp8_e4m3", "b32-h128-kv8192"))
    assert fa3_bf16.cuda_graph and fa3_bf16.median_us < fa3_fp8.median_us  # on SM90 FP8 KV is slower


def test_a_newer_version_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "timings.json"
    path.write_text(json.dumps({"format": "kvgate-kernel-timings", "version": 2, "entries": []}))
    with pytest.raises(ValueError) as raised:
        timings.read(path)
    assert str(raised.value) == f"{path}: format version 2 is newer than this kvgate reads (1)"
    with pytest.raises(ValueError, match="not a kvgate-kernel-timings file"):
        timings.parse({"format": "other"}, "x.json")
    with pytest.raises(ValueError, match=r"x.json: bad entry in entries\[0\]"):
        timings.parse({"format": "kvgate-kernel-timings", "version": 1, "entries": [{"family": "a"}]}, "x.json")


def test_compare_pairs_by_family_dtype_and_spec() -> None:
    current = [entry(median_us=500.0), entry(spec="b64-h128-kv2048", median_us=250.0)]
    baseline = [entry(median_us=400.0), replace(entry(), kv_cache_dtype="auto", median_us=100.0)]
    [only] = timings.compare(current, baseline)
    assert only.key == ("flashinfer_mla_fa3", "fp8_e4m3", "b32-h128-kv8192") and only.ratio == pytest.approx(1.25)


JUNIT_FIXTURE = Path(__file__).parent / "fixtures" / "h200" / "junit-all.xml"


def test_h200_junit_fixture_counts_and_figures() -> None:
    """The real H200 run: every SM90 kernel passed, within the stated bounds, bf16 and FP8."""
    import xml.etree.ElementTree as ET

    from kvgate.kernels import tolerance

    counts = runner.read_junit(JUNIT_FIXTURE)
    assert (counts.tests, counts.passed, counts.failures, counts.errors, counts.skipped) == (196, 160, 0, 0, 36)
    worst: dict[tuple[str, str], float] = {}
    for case in ET.parse(JUNIT_FIXTURE).getroot().iter("testcase"):
        name = case.get("name", "")
        if not name.startswith("test_decode_matches_reference[") or case.find("skipped") is not None:
            continue
        props = {p.get("name"): p.get("value") for p in case.iter("property")}
        family, kv = name[name.index("[") + 1:].split("-")[0], name.rstrip("]").rsplit("-", 1)[1]
        worst[(family, kv)] = max(worst.get((family, kv), 0.0), float(props["rel_l2"]))
    assert set(worst) == {(f, kv) for f in ("flashinfer_mla_fa3", "flashinfer_mla_fa2", "vllm_triton_mla")
                          for kv in ("auto", "fp8_e4m3")}
    for (family, kv), rel_l2 in worst.items():
        bound = tolerance.FP8 if kv.startswith("fp8") else tolerance.BF16
        assert rel_l2 <= bound.max_rel_l2, (family, kv, rel_l2)


def test_h200_cell_folders_from_kvgate_kernels() -> None:
    """`kvgate kernels --arch-default sm90 --gpus 1` on the H200: one cell that ran, one skipped with a reason."""
    run = Path(__file__).parent / "fixtures" / "h200" / "run"
    ran = run / "triton_mla-fp8-sm90"
    assert json.loads((ran / "status.json").read_text())["kernels"] == {
        "failed": 0, "passed": 21, "seconds": 30.8, "skipped": 0, "status": "ok", "tests": 21}
    counts = runner.read_junit(ran / "kernels" / "junit.xml")
    assert (counts.tests, counts.passed) == (21, 21)
    document = json.loads((ran / "kernels" / "timings.json").read_text())
    assert document["cell_id"] == "triton_mla-fp8-sm90" and document["device"]["name"] == "NVIDIA H200"
    entries = timings.parse(document, "timings.json")
    assert {(e.family, e.kv_cache_dtype) for e in entries} == {("vllm_triton_mla", "fp8_e4m3")} and len(entries) == 3
    skipped = run / "flashmla-fp8-sm90"
    status = json.loads((skipped / "status.json").read_text())["kernels"]
    assert status["status"] == "skipped" and status["reason"].startswith("FlashMLA's decode kernel ships only")
    assert runner.read_junit(skipped / "kernels" / "junit.xml").skip_reasons == (status["reason"],)


def test_spread_of_three_runs_and_the_derived_tolerance(tmp_path: Path) -> None:
    runs = [[entry(median_us=m), entry(kv_cache_dtype="auto", median_us=a)] for m, a in
            ((470.0, 140.0), (480.0, 141.0), (475.0, 147.0))]
    runs[2].append(entry(spec="b64-h128-kv2048"))  # only in the third run: left out, and said so
    spreads, missing = timings.spread(runs)
    assert [s.key[1] for s in spreads] == ["auto", "fp8_e4m3"]
    assert missing == [("flashinfer_mla_fa3", "fp8_e4m3", "b64-h128-kv2048")]
    auto = spreads[0]
    assert (auto.min_us, auto.median_us, auto.max_us) == (140.0, 141.0, 147.0)
    assert auto.spread == pytest.approx(7 / 141)
    assert timings.tolerance_from_spreads(spreads) == 0.15  # 3 x 4.96 % = 14.9 %, rounded up
    assert timings.tolerance_from_spreads([spreads[1]]) == 0.07  # 3 x 10/475 = 6.3 %
    assert timings.tolerance_from_spreads([timings.TimingSpread(key=("a", "b", "c"), medians_us=(1.0, 1.001))]) == 0.05
    paths = []
    for index, run in enumerate(runs):
        path = tmp_path / f"timings-{index}.json"
        path.write_text(json.dumps(timings.document(run, cell_id=None, device={}, method={})))
        paths.append(path)
    report = timings.spread_report(paths)
    assert "| flashinfer_mla_fa3 | auto | b32-h128-kv8192 | 140.0, 141.0, 147.0 | 140.0 | 141.0 | 147.0 | 5.0 % |" in report
    assert report.endswith("Derived timing tolerance: max(5 %, 3 x 5.0 %) = 15 % (a ratio above 1.15 vs the baseline "
                           "is slower)")
    assert "Entries missing from some run (left out): flashinfer_mla_fa3/fp8_e4m3/b64-h128-kv2048" in report


def test_spread_refuses_too_few_runs_and_duplicates() -> None:
    with pytest.raises(ValueError, match="a spread needs at least two runs, got 1"):
        timings.spread([[entry()]])
    with pytest.raises(ValueError, match=r"run 2: two entries for \('flashinfer_mla_fa3', 'fp8_e4m3', 'b32-h128-kv8192'\)"):
        timings.spread([[entry()], [entry(), entry()]])


def test_regressions_use_the_tolerance() -> None:
    current = [entry(median_us=110.0), entry(kv_cache_dtype="auto", median_us=104.0)]
    baseline = [entry(median_us=100.0), entry(kv_cache_dtype="auto", median_us=100.0)]
    assert [c.key[1] for c in timings.regressions(timings.compare(current, baseline), 0.05)] == ["fp8_e4m3"]
    assert timings.regressions(timings.compare(current, baseline), 0.15) == []
    with pytest.raises(ValueError, match=r"a timing tolerance is a fraction such as 0\.05, got 15"):
        timings.regressions([], 15)
