"""The results contract's JSON Schemas (kvgate.results.schema, docs/schemas/): valid draft 2020-12, published unchanged,
met by every file kvgate's real runs and its writers made, and refusing hostile files with one line naming the file
and the place."""

from __future__ import annotations

import functools
import json
import operator
from pathlib import Path

import pytest
from jsonschema import Draft202012Validator

import archives
import synthetic_run
from cpu_run_fixture import extract, matrix_of_the_run
from kvgate import InputError
from kvgate.cli import main
from kvgate.gate.evaluation import KIND_ORDER
from kvgate.gate.verdict import STATUSES
from kvgate.kernels import timings
from kvgate.results import cell_folder, probe_file, schema
from kvgate.results.records import CONTRACT_VERSION, STAGE_STATUSES
from kvgate.runners.run_record import run_record, write_run_record

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = Path(__file__).parent / "fixtures"
FILE_KINDS = {"cell.json": "cell", "status.json": "status", "run.json": "run", "probe.json": "probe",
              "timings.json": "timings", "verdict.json": "verdict"}
# the real runs kvgate's runners wrote (fixture READMEs say where and with what)
ARCHIVES = {"cpu_run": FIXTURES / "cpu_run" / "test1.tar.xz", "h200_run": FIXTURES / "h200_run" / "run.tar.xz",
            "ci_canaries": FIXTURES / "canaries" / "ci-canaries.tar.xz",
            "h200_canaries": FIXTURES / "h200_canaries" / "runs.tar.xz",
            "h200_canaries_paths": FIXTURES / "h200_canaries" / "paths-runs.tar.xz"}
PROBES_CHECKED_PER_ARCHIVE = 6  # a probe file takes about 0.25 s to validate; the canary runs hold ~80 alike


# ---------------------------------------------------------------------------------------------- the schemas

@pytest.mark.parametrize("kind", schema.KINDS)
def test_each_schema_is_valid_draft_2020_12_and_names_this_contract(kind):
    document = json.loads(schema.schema_text(kind))
    Draft202012Validator.check_schema(document)
    assert document["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert document["$id"] == schema.schema_id(kind) == f"urn:kvgate:results-folder:{CONTRACT_VERSION}:{kind}.schema.json"


def test_docs_publish_the_packaged_schemas_unchanged_and_link_each():
    published = ROOT / "docs" / "schemas"
    assert sorted(p.name for p in published.iterdir()) == sorted(schema.file_name(k) for k in schema.KINDS)
    contract = (ROOT / "docs" / "results-folder.md").read_text(encoding="utf-8")
    for kind in schema.KINDS:
        assert (published / schema.file_name(kind)).read_text(encoding="utf-8") == schema.schema_text(kind), (
            f"docs/schemas/{schema.file_name(kind)} differs from the packaged schema: copy "
            f"src/kvgate/results/schemas/{schema.file_name(kind)} over it")
        assert f"(schemas/{schema.file_name(kind)})" in contract
    assert f"# The results folder (contract version {CONTRACT_VERSION})" in contract


def test_the_enums_are_the_codes_own_names():
    """Statuses and check kinds in the schemas are those the code knows: a new one is added to both."""
    status = json.loads(schema.schema_text("status"))
    assert tuple(status["$defs"]["entry"]["properties"]["status"]["enum"]) == STAGE_STATUSES
    check = json.loads(schema.schema_text("verdict"))["$defs"]["check"]["properties"]
    assert tuple(check["kind"]["enum"]) == KIND_ORDER
    assert sorted(check["status"]["enum"]) == sorted(STATUSES)


# ---------------------------------------------------------------------------------------------- real files

@pytest.fixture(scope="module")
def real_runs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("real_runs")
    out = {}
    for name, archive in ARCHIVES.items():
        archives.extract(archive, root / name)
        out[name] = root / name
    return out


def validate_folder(folder: Path, probes: int | None = None) -> dict[str, int]:
    """Every contract file under `folder` against its schema; how many of each kind were checked."""
    counts = dict.fromkeys(FILE_KINDS.values(), 0)
    for name, kind in FILE_KINDS.items():
        paths = sorted(folder.rglob(name))
        for path in paths[:probes] if kind == "probe" and probes is not None else paths:
            schema.read_file(path, kind)
            counts[kind] += 1
    return counts


@pytest.mark.parametrize("archive", list(ARCHIVES))
def test_every_file_of_a_real_run_meets_its_schema(real_runs, archive):
    counts = validate_folder(real_runs[archive], probes=PROBES_CHECKED_PER_ARCHIVE)
    print(archive, counts)
    assert counts["cell"] >= 3 and counts["status"] >= 3 and counts["run"] >= 1 and counts["probe"] >= 3
    versions = {json.loads(p.read_text())["contract_version"] for p in real_runs[archive].rglob("cell.json")}
    print(archive, "contract versions", sorted(versions))


def test_the_real_runs_hold_every_kind_and_every_contract_version_still_read(real_runs):
    """Together the real runs cover each schema, on files of contract 1.3, 1.6 and 1.7 (the gate reads all 1.x)."""
    versions = {json.loads(p.read_text())["contract_version"] for run in real_runs.values()
                for p in run.rglob("cell.json")}
    assert {"1.3", "1.6", "1.7"} <= versions
    found = {FILE_KINDS[p.name] for run in real_runs.values() for p in run.rglob("*.json") if p.name in FILE_KINDS}
    assert found == set(schema.KINDS)


def test_a_synthetic_run_and_the_verdict_the_gate_wrote_meet_their_schemas(tmp_path):
    run = synthetic_run.write_seed_run(tmp_path / "run", probes=True, contract=CONTRACT_VERSION)
    assert main(["gate", str(run), "--today", "2026-11-30"]) == 0
    counts = validate_folder(run)
    assert (counts["cell"], counts["status"], counts["probe"], counts["verdict"]) == (2, 2, 2, 1)


def test_kvgate_writers_write_files_that_meet_their_schemas(tmp_path):
    run = tmp_path / "run"
    cell = cell_folder.prepare_cell(run, {"cell_id": "triton_mla-fp8-sm90", "backend": "TRITON_MLA",
                                          "kv_cache_dtype": "fp8", "arch": "sm90", "model": "m", "task": "gsm8k",
                                          "workload": "w", "side": "base", "calculate_kv_scales": False})
    cell_folder.write_status(cell, "accuracy", "ok", elapsed_s=1.5, kv_cache={"layers": 2, "tokens": 10},
                             question_plan={"design": "fixed", "questions": 10, "looks": [10], "answered": 10})
    cell_folder.write_status(cell, "throughput", "error", reason="engine died", log_tail="...",
                             interleaved={"order": ["base", "head"], "rounds": 3})
    record = run_record(repo=ROOT, command=["kvgate", "run"], started_at="2026-12-02T00:00:00Z", finished_at=None,
                        arch="sm90", cells=["triton_mla-fp8-sm90"], stages=["accuracy"], sides=["base", "head"],
                        planned_stages={"triton_mla-fp8-sm90": ["accuracy", "probe"]},
                        not_planned={"triton_mla-fp8-sm90": {"kernels": "no GPU kernels test on this host"}},
                        planned_out=[{"cell": "flashmla-fp8-sm90", "reason": "needs sm90"}])
    write_run_record(run, record)
    entry = timings.TimingEntry(family="f", kv_cache_dtype="fp8", spec="b1", batch=1, num_heads=1, kv_len=16,
                                page_size=16, median_us=1.0, min_us=0.9, max_us=1.2, repeats=3, bytes=100,
                                achieved_gbps=0.1, fraction_of_copy=None, cuda_graph=True, provenance="test")
    cell_folder.write_json_atomic(cell / "kernels" / "timings.json",
                                  timings.document([entry], cell_id="triton_mla-fp8-sm90", device={}, method={}))
    assert validate_folder(run) == {"cell": 1, "status": 1, "run": 1, "probe": 0, "timings": 1, "verdict": 0}
    assert json.loads((cell / "cell.json").read_text())["contract_version"] == CONTRACT_VERSION


# ---------------------------------------------------------------------------------------------- hostile files

PROBE = {"format": "kvgate-probe", "version": 1, "settings": {}, "prompts": [
    {"prompt": "a", "prompt_token_ids": [1, 2], "prompt_logprobs": [None, -0.5], "prompt_top": [None, [[2, -0.5]]],
     "generated_token_ids": [3], "generated_logprobs": ["-inf"], "generated_top": [[[3, "-inf"]]]}]}
CELL = {"backend": "TRITON_MLA", "kv_cache_dtype": "fp8", "arch": "sm90", "model": "m"}


def _with(document: dict, change) -> dict:
    copy = json.loads(json.dumps(document))
    change(copy)
    return copy


def _nested(depth: int) -> list:
    value: list = []
    for _ in range(depth):
        value = [value]
    return value


HOSTILE = {
    "cell.json a list": ("cell", [], "expected an object, got a list in the top level"),
    "cell.json missing model": ("cell", _with(CELL, lambda d: d.pop("model")), "missing key 'model' in the top level"),
    "cell.json blank backend": ("cell", {**CELL, "backend": "  "}, "expected a non-blank string, got string '  ' in "
                                                                   "backend"),
    "cell.json a number for a name": ("cell", {**CELL, "arch": 90}, "expected a string, got number 90 in arch"),
    "cell.json a side of neither": ("cell", {**CELL, "side": "left"}, "expected \"head\" or \"base\", got string "
                                                                      "'left' in side"),
    "cell.json a string for a boolean": ("cell", {**CELL, "checkpoint_kv_scales": "yes"},
                                         "expected true or false, got string 'yes' in checkpoint_kv_scales"),
    "cell.json contract 0": ("cell", {**CELL, "contract_version": 0},
                             "expected a version number like 1 or \"1.9\", got number 0 in contract_version"),
    "cell.json deep nesting": ("cell", {**CELL, "model": _nested(500)}, "expected a string, got a list in model"),
    "cell.json nesting beyond Python's stack": ("cell", {**CELL, "model": _nested(5000)},
                                                "JSON nested too deeply in the file"),
    "status.json unknown stage": ("status", {"acuracy": {"status": "ok"}},
                                  "unknown key 'acuracy' in the top level. Did you mean accuracy?"),
    "status.json no status": ("status", {"probe": {"reason": "x"}}, "missing key 'status' in probe"),
    "status.json unknown status": ("status", {"kernels": {"status": "Ok"}},
                                   "expected \"ok\" or \"error\" or \"timeout\" or \"skipped\", got string 'Ok' in "
                                   "kernels.status. Did you mean ok?"),
    "status.json a number for a reason": ("status", {"kernels": {"status": "error", "reason": 3}},
                                          "expected a string, got number 3 in kernels.reason"),
    "status.json negative rounds": ("status", {"throughput": {"status": "ok", "interleaved": {"rounds": -1}}},
                                    "expected a number >= 0, got number -1 in throughput.interleaved.rounds"),
    "run.json unknown side": ("run", {"sides": ["head", "left"]}, "expected \"head\" or \"base\", got string 'left' "
                                                                  "in sides[1]"),
    "run.json a stage of no name": ("run", {"invocations": [{"planned_stages": {"a-b-c": ["speed"]}}]},
                                    "expected \"kernels\" or \"accuracy\" or \"throughput\" or \"probe\", got string "
                                    "'speed' in invocations[0].planned_stages['a-b-c'][0]"),
    "run.json an empty reason": ("run", {"not_planned": {"a-b-c": {"kernels": ""}}},
                                 "expected a reason (a string of 1-2000 characters), got string '' in "
                                 "not_planned['a-b-c'].kernels"),
    "probe.json a string for a token id": ("probe", _with(PROBE, lambda d: d["prompts"][0]["prompt_token_ids"]
                                                          .__setitem__(1, "2")),
                                           "expected a token id (a whole number >= 0), got string '2' in "
                                           "prompts[0].prompt_token_ids[1]"),
    "probe.json a word for a logprob": ("probe", _with(PROBE, lambda d: d["prompts"][0]["generated_logprobs"]
                                                       .__setitem__(0, "NaN")),
                                        "expected a logprob (a number, or \"nan\", \"inf\", \"-inf\"), got string "
                                        "'NaN' in prompts[0].generated_logprobs[0]"),
    "probe.json no prompts": ("probe", {**PROBE, "prompts": []}, "expected at least 1 entry, got 0 in prompts"),
    "timings.json a string for a time": ("timings", {"format": "kvgate-kernel-timings", "version": 1, "entries": [
        {"family": "f", "kv_cache_dtype": "fp8", "spec": "s", "batch": 1, "num_heads": 1, "kv_len": 1, "page_size": 1,
         "median_us": "1.5", "min_us": 1, "max_us": 2, "repeats": 3, "bytes": 1, "achieved_gbps": 1,
         "fraction_of_copy": None, "cuda_graph": True, "provenance": ""}]},
        "expected a number, got string '1.5' in entries[0].median_us"),
    "timings.json an entry missing its key": ("timings", {"format": "kvgate-kernel-timings", "version": 1,
                                                          "entries": [{"family": "f"}]},
                                              "missing key 'kv_cache_dtype' in entries[0]"),
    "verdict.json an unknown check status": ("verdict", {"verdict_version": "1.5", "passed": True, "neutral": False,
                                                         "exit_status": 0, "run": "r", "summary": {}, "checks": [
                                                             {"cell": "c", "kind": "probe", "status": "passed"}]},
                                             "expected \"pass\" or \"fail\" or \"waived\" or \"missing\" or \"error\" "
                                             "or \"not_run\" or \"info\", got string 'passed' in checks[0].status. "
                                             "Did you mean pass?"),
    "verdict.json a p-value of 0": ("verdict", {"verdict_version": "1.5", "passed": True, "neutral": False,
                                                "exit_status": 0, "run": "r", "summary": {}, "checks": [
                                                    {"cell": "c", "kind": "probe", "status": "pass", "p_value": 0}]},
                                    "expected a number > 0, got number 0 in checks[0].p_value"),
}


@pytest.mark.parametrize("case", list(HOSTILE))
def test_a_hostile_document_is_one_line_naming_the_file_and_the_place(case):
    kind, document, message = HOSTILE[case]
    source = f"run/cell/{kind}.json"
    with pytest.raises(InputError) as raised:
        schema.validate(document, kind, source)
    assert str(raised.value) == f"{source}: {message}"
    assert "\n" not in str(raised.value)


@pytest.mark.parametrize(("text", "message"), [
    ('{"backend": "A", "kv_cache_dtype": "fp8", "arch": "sm90", "model": NaN}',
     "NaN is not a number JSON allows in the file. Write a finite number or null"),
    ('{"backend": "A", "kv_cache_dtype": "fp8", "arch": "sm90", "model": "m', "truncated JSON in line 1 column 68"),
    ("[" * 100_000 + "]" * 100_000, "JSON nested too deeply in the file"),
    ('{"backend": "A", "kv_cache_dtype": "fp8", "arch": "sm90", "model": 1e999}',
     "number 1e999 is out of range (it reads as infinity) in model. Write a finite number or null"),
])
def test_a_hostile_file_is_one_line_naming_it(tmp_path, text, message):
    path = tmp_path / "cell.json"
    path.write_text(text)
    with pytest.raises(InputError) as raised:
        schema.read_file(path, "cell", "run/cell/cell.json")
    assert str(raised.value) == f"run/cell/cell.json: {message}"


TIMING = {"family": "f", "kv_cache_dtype": "fp8", "spec": "s", "batch": 1, "num_heads": 1, "kv_len": 1,
          "page_size": 1, "median_us": 1.5, "min_us": 1, "max_us": 2, "repeats": 3, "bytes": 1, "achieved_gbps": 1,
          "fraction_of_copy": None, "cuda_graph": True, "provenance": ""}


@pytest.mark.parametrize(("figure", "literal", "message"), [
    ("median_us", "1e999", "number 1e999 is out of range (it reads as infinity)"),
    ("achieved_gbps", "-1E400", "number -1E400 is out of range (it reads as -infinity)"),
    ("fraction_of_copy", "1.8e308", "number 1.8e308 is out of range (it reads as infinity)"),
    ("max_us", "NaN", "NaN is not a number JSON allows"),
    ("min_us", "-Infinity", "-Infinity is not a number JSON allows"),
])
def test_a_figure_json_has_no_number_for_is_one_line_naming_the_file_and_the_place(tmp_path, figure, literal,
                                                                                     message):
    """JSON has no NaN or infinity, but Python's json reads NaN, Infinity and 1e999 (as infinity); the gate refuses
    all of them in every contract file it reads, here kernels/timings.json, whose schema cannot say "finite"."""
    document = {"format": "kvgate-kernel-timings", "version": 1, "entries": [TIMING, {**TIMING, figure: 0}]}
    text = json.dumps(document).replace(f'"{figure}": 0', f'"{figure}": {literal}')
    path = tmp_path / "timings.json"
    path.write_text(text)
    with pytest.raises(InputError) as raised:
        schema.read_file(path, "timings", "run/cell/kernels/timings.json")
    place = f"entries[1].{figure}" if "out of range" in message else "the file"
    assert str(raised.value) == f"run/cell/kernels/timings.json: {message} in {place}. Write a finite number or null"


@pytest.mark.parametrize("figure", ["median_us", "batch"])
def test_a_whole_number_past_a_floats_range_is_one_line_naming_the_place(tmp_path, figure):
    """JSON reads 400 digits as an exact integer, which a schema's "number" and "integer" take: refused all the same."""
    path = tmp_path / "timings.json"
    path.write_text(json.dumps({"format": "kvgate-kernel-timings", "version": 1,
                                "entries": [TIMING, {**TIMING, figure: 10 ** 400}]}))
    with pytest.raises(InputError) as raised:
        schema.read_file(path, "timings", "run/cell/kernels/timings.json")
    assert str(raised.value) == ("run/cell/kernels/timings.json: expected a finite integer, got a whole number past a "
                                 f"float's range in entries[1].{figure}")


# The probe reader's checks of the rules the gate's structural pass leaves to it (schema.READER_CHECKED), one or more
# hostile entries each: (the entry's place, what is put there, the one line both the reader and the whole schema say)
PROBE_WITH_CACHE = _with(PROBE, lambda d: d.update(cached_context=[{
    "prompt": "b", "prompt_token_ids": [1, 2], "cached_tokens": 2, "generated_token_ids": [3],
    "generated_logprobs": [-0.1], "generated_top": [[[3, -0.1]]], "fresh_generated_token_ids": [3],
    "fresh_generated_logprobs": [-0.1], "fresh_cached_tokens": 0}]))
READER_CHECKED_CASES = {
    "/$defs/token_ids/items": [
        (("prompts", 0, "prompt_token_ids", 1), "2", "expected a token id (a whole number >= 0), got string '2'"),
        (("prompts", 0, "generated_token_ids", 0), -3, "expected a token id (a whole number >= 0), got number -3"),
        (("cached_context", 0, "fresh_generated_token_ids", 0), True,
         "expected a token id (a whole number >= 0), got boolean true"),
    ],
    "/$defs/logprobs/items": [
        (("prompts", 0, "generated_logprobs", 0), "NaN",
         'expected a logprob (a number, or "nan", "inf", "-inf"), got string \'NaN\''),
        (("cached_context", 0, "generated_logprobs", 0), [-0.1],
         'expected a logprob (a number, or "nan", "inf", "-inf"), got a list'),
        (("cached_context", 0, "fresh_generated_logprobs", 0), None,
         'expected a logprob (a number, or "nan", "inf", "-inf"), got null'),
    ],
    "/$defs/tops/items": [
        (("prompts", 0, "generated_top", 0), [], "expected at least 1 entry, got 0"),
        (("prompts", 0, "generated_top", 0), {"3": -0.1}, "expected a list, got an object"),
        (("prompts", 0, "generated_top", 0, 0), [3], "expected a [token id, logprob] pair, got a list"),
        (("cached_context", 0, "generated_top", 0, 0, 0), "3", "expected a whole number, got string '3'"),
        (("prompts", 0, "generated_top", 0, 0, 1), "-Infinity",
         'expected a logprob (a number, or "nan", "inf", "-inf"), got string \'-Infinity\''),
    ],
    "/$defs/prompt/properties/prompt_logprobs/items": [
        (("prompts", 0, "prompt_logprobs", 1), False,
         'expected a logprob (a number, or "nan", "inf", "-inf"), got boolean false'),
    ],
    "/$defs/prompt/properties/prompt_top/items": [
        (("prompts", 0, "prompt_top", 1), None, "expected a list, got null"),
        (("prompts", 0, "prompt_top", 1, 0), [2, -0.5, 1], "expected a [token id, logprob] pair, got a list"),
    ],
}


def test_every_rule_the_gates_structural_pass_leaves_out_has_hostile_cases():
    assert set(READER_CHECKED_CASES) == set(schema.READER_CHECKED["probe"])
    schema.validate_structure(PROBE_WITH_CACHE, "probe", "probe.json")  # each pointer names a rule of the schema
    schema.validate(PROBE_WITH_CACHE, "probe", "probe.json")


@pytest.mark.parametrize(("rule", "place", "value", "message"), [
    (rule, place, value, message) for rule, cases in READER_CHECKED_CASES.items() for place, value, message in cases])
def test_a_rule_left_to_the_probe_reader_is_enforced_by_it_in_the_schemas_words(tmp_path, rule, place, value,
                                                                                 message):
    """The whole schema refuses the entry, the gate's structural pass lets it through (the rule is left out) and
    the reader the gate reads probe.json with refuses it in one line, as the whole schema would."""
    *parents, last = place
    document = _with(PROBE_WITH_CACHE,
                     lambda d: functools.reduce(operator.getitem, parents, d).__setitem__(last, value))
    where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in place).lstrip(".")
    path = tmp_path / "probe.json"
    path.write_text(json.dumps(document))
    with pytest.raises(InputError) as whole:
        schema.validate(document, "probe", str(path))
    schema.validate_structure(document, "probe", str(path))
    with pytest.raises(InputError) as read:
        probe_file.read(path)
    assert str(read.value) == str(whole.value) == f"{path}: {message} in {where}"


# ---------------------------------------------------------------------------------------------- the gate

def test_the_gate_on_a_real_run_with_one_cell_cut_mid_write_errors_that_cell_only(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("KVGATE_MATRIX_DIR", str(matrix_of_the_run(tmp_path / "matrix")))
    run = extract(tmp_path)
    status = run / "cpu_attn-fp8-cpu" / "status.json"
    text = status.read_text()
    status.write_text(text[:len(text) // 2])  # what a job killed while writing status.json leaves
    probe = run / "cpu_mla-auto-cpu" / "probe" / "probe.json"
    probe.write_text(probe.read_text().replace('"generated_text"', '"generated_text": 7, "_"', 1))
    assert main(["gate", str(run), "--today", "2026-11-30"]) == 1
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("ERROR ")]
    print("\n".join(errors))
    assert len(errors) == 2
    assert errors[0].startswith(f"ERROR {run}/cpu_attn-fp8-cpu/status.json: truncated JSON in line ")
    assert errors[1] == f"ERROR {run}/cpu_mla-auto-cpu/probe/probe.json: expected a string, got number 7 in " \
                        "prompts[0].generated_text"
    verdict = json.loads((run / "gate" / "verdict.json").read_text())
    by_cell: dict[str, dict[str, str]] = {}
    for check in verdict["checks"]:
        by_cell.setdefault(check["cell"], {})[check["kind"]] = check["status"]
    assert by_cell["cpu_attn-fp8-cpu"] == {"cell": "error"}
    assert by_cell["cpu_mla-auto-cpu"]["probe"] == "error"
    assert by_cell["cpu_mla-auto-cpu"]["accuracy"] == "pass"  # the rest of the report stands
    assert by_cell["cpu_attn-auto-cpu"]["accuracy"] == by_cell["cpu_attn-auto-cpu"]["accuracy_floor"] == "pass"
    report = (run / "gate" / "report.md").read_text()
    assert f"{run}/cpu_attn-fp8-cpu/status.json" in report
