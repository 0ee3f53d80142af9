"""The matrix: cells from matrix/*.toml, filters, changed-files selection, and every bad-input message."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kvgate import InputError, InputErrors
from kvgate.cli import main as kvgate_main
from kvgate.matrix import cells as kvmatrix

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def real_matrix() -> kvmatrix.Matrix:
    return kvmatrix.load(ROOT / "matrix")


@pytest.fixture
def matrix_copy(tmp_path: Path) -> Path:
    folder = tmp_path / "matrix"
    shutil.copytree(ROOT / "matrix", folder)
    return folder


def edit(folder: Path, name: str, old: str, new: str) -> None:
    path = folder / name
    text = path.read_text()
    assert old in text, f"{old!r} not in {name}"
    path.write_text(text.replace(old, new, 1))


def load_errors(folder: Path) -> list[str]:
    with pytest.raises(InputErrors) as info:
        kvmatrix.load(folder)
    return [str(e) for e in info.value.errors]


# ---------------------------------------------------------------------------------------- the real matrix

def ids(cells) -> set[str]:
    return {c.id for c in cells}


def test_sm100_has_flashinfer_mla_auto_and_fp8(real_matrix):
    cells = real_matrix.select(archs=["sm100"], backends=["FLASHINFER_MLA"])
    assert {"flashinfer_mla-auto-sm100", "flashinfer_mla-fp8-sm100"} <= ids(cells)


def test_sm90_has_no_sm100_mla_backends_but_flashmla_and_triton_mla_fp8(real_matrix):
    backends = {c.backend for c in real_matrix.select(archs=["sm90"])}
    assert "FLASHINFER_MLA" not in backends
    assert "CUTLASS_MLA" not in backends
    sm90 = ids(real_matrix.select(archs=["sm90"]))
    assert {"flashmla-fp8-sm90", "triton_mla-fp8-sm90"} <= sm90


def test_fp8_below_sm89_is_not_a_cell(real_matrix):
    sm80 = real_matrix.select(archs=["sm80"])
    assert not [c for c in sm80 if c.backend in ("TRITON_MLA", "TRITON_ATTN", "FLASH_ATTN") and c.is_fp8]


def test_cpu_default_is_the_three_embedded_cells(real_matrix):
    assert ids(real_matrix.select(archs=["cpu"])) == {"cpu_attn-auto-cpu", "cpu_attn-fp8-cpu", "cpu_mla-auto-cpu"}


GPU_ARCHS = ("sm80", "sm89", "sm90", "sm100", "sm120")


def test_cuda_runs_fp8_once_per_backend_not_its_e4m3_alias(real_matrix):
    gpu = [c for c in real_matrix.cells if c.arch in GPU_ARCHS]
    assert not [c.id for c in gpu if c.kv_cache_dtype == "fp8_e4m3"]
    for backend in real_matrix.backends.values():
        for arch in backend.archs:
            if arch in GPU_ARCHS and backend.supports(arch, "fp8_e4m3"):
                assert kvmatrix.cell_id(backend.name, "fp8", arch) in ids(gpu), (backend.name, arch)
    (alias,) = [e for e in real_matrix.exclusions if e.match.kv_cache_dtype == ("fp8_e4m3",) and e.match.arch]
    assert alias.match.arch == GPU_ARCHS and not alias.match.backend
    assert alias.link == "https://github.com/vllm-project/vllm/blob/v0.26.0/vllm/config/cache.py"


def test_the_matrix_counts_67_cells(real_matrix):
    """README says how many cells there are; 77 before fp8_e4m3 left CUDA (18 cells); 59 plain ones and 8 of the
    feature axis (spec_decode and tp2: FLASHMLA and FLASH_ATTN on sm90, auto and fp8 each)."""
    counts = {arch: len(cells) for arch, cells in real_matrix.cells_by_arch().items()}
    assert counts == {"sm80": 7, "sm89": 10, "sm90": 22, "sm100": 15, "sm120": 10, "cpu": 3}
    assert len(real_matrix.cells) == 67
    assert len([c for c in real_matrix.cells if c.feature is None]) == 59
    assert "(67 today)" in (ROOT / "README.md").read_text(encoding="utf-8")


def test_every_fp8_cell_has_an_auto_partner(real_matrix):
    all_ids = ids(real_matrix.cells)
    for cell in real_matrix.cells:
        if cell.is_fp8:
            assert kvmatrix.cell_id(cell.backend, "auto", cell.arch, cell.feature_name) in all_ids, cell.id


def test_cell_ids_are_unique_and_models_follow_mla(real_matrix):
    assert len(ids(real_matrix.cells)) == len(real_matrix.cells)
    for cell in real_matrix.cells:
        assert cell.workload.mla == real_matrix.backends[cell.backend].mla


@pytest.mark.parametrize(("pattern", "path", "expected"), [
    ("csrc/cpu/**", "csrc/cpu/attention.cpp", True),
    ("csrc/cpu/**", "csrc/cpu/sub/dir/x.cpp", True),
    ("vllm/**/flashmla*.py", "vllm/v1/attention/ops/flashmla.py", True),
    ("vllm/**/flashmla*.py", "vllm/flashmla.py", True),
    ("flashinfer/mla/**", "flashinfer/decode.py", False),
    ("vllm/v1/attention/backends/*.py", "vllm/v1/attention/backends/mla/x.py", False),
])
def test_glob_matches(pattern, path, expected):
    assert kvmatrix.glob_matches(pattern, path) is expected


def test_filters_report_unknown_names_with_did_you_mean(real_matrix):
    with pytest.raises(InputErrors) as info:
        real_matrix.select(archs=["sm9"], backends=["FLASHINFR"], cell_ids=["flashmla-fp8-sm91"])
    assert [str(e) for e in info.value.errors] == [
        "--arch: unknown value 'sm9'. Did you mean sm90?",
        "--backend: unknown value 'FLASHINFR'. Did you mean FLASHINFER?",
        "--cell: unknown cell 'flashmla-fp8-sm91'. Did you mean flashmla-fp8-sm90?",
    ]


def test_waiver_lookup(real_matrix):
    cell = real_matrix.cell("flashinfer-fp8-sm120")
    waiver = real_matrix.waiver_for(cell, "accuracy")
    assert waiver is not None and waiver.issue.endswith("/41651")
    assert real_matrix.waiver_for(real_matrix.cell("flashinfer-auto-sm120"), "accuracy") is None


# ---------------------------------------------------------------------------------------- bad input

def test_unknown_backend_in_exclusion(matrix_copy):
    edit(matrix_copy, "exclusions.toml", 'backend = "CPU_ATTN", kv_cache_dtype = "fp8_e4m3"',
         'backend = "CPU_ATN", kv_cache_dtype = "fp8_e4m3"')
    assert load_errors(matrix_copy) == [
        f"{matrix_copy}/exclusions.toml: unknown backend 'CPU_ATN' in exclude[0].match.backend. Did you mean CPU_ATTN?",
    ]


def test_unknown_dtype_in_backend(matrix_copy):
    edit(matrix_copy, "backends.toml", 'kv_cache_dtypes = ["auto", "fp8", "fp8_e4m3"]\narchs = ["sm100"]\nblock_sizes = [32, 64]',
         'kv_cache_dtypes = ["auto", "fp8", "fp8_e4m"]\narchs = ["sm100"]\nblock_sizes = [32, 64]')
    assert load_errors(matrix_copy) == [
        f"{matrix_copy}/backends.toml: unknown kv_cache_dtype 'fp8_e4m' in backends.FLASHINFER_MLA.kv_cache_dtypes[2]. "
        "Did you mean fp8_e4m3?",
    ]


def test_arch_a_backend_does_not_support_in_waiver(matrix_copy):
    edit(matrix_copy, "waivers.toml", 'backend = "FLASHINFER", arch = "sm120"', 'backend = "CUTLASS_MLA", arch = "sm90"')
    errors = load_errors(matrix_copy)
    assert errors[0] == (f"{matrix_copy}/waivers.toml: CUTLASS_MLA does not support arch 'sm90' "
                         "(backends.toml: archs = sm100) in waiver[0].match.arch")


def test_bad_date(matrix_copy):
    edit(matrix_copy, "waivers.toml", "expires = 2027-03-31", 'expires = "2027-02-30"')
    assert load_errors(matrix_copy) == [
        f"{matrix_copy}/waivers.toml: bad date the string '2027-02-30' in waiver[0].expires. "
        "Write YYYY-MM-DD, e.g. 2027-03-31",
    ]


def test_invalid_toml_date_names_line(matrix_copy):
    edit(matrix_copy, "waivers.toml", "expires = 2027-03-31", "expires = 2027-13-31")
    assert load_errors(matrix_copy) == [
        f"{matrix_copy}/waivers.toml: invalid TOML: Expected newline or end of document after a statement "
        "(at line 12, column 15). Strings need quotes, dates are YYYY-MM-DD, tables are declared once",
    ]


def test_duplicate_dtype(matrix_copy):
    edit(matrix_copy, "backends.toml", 'kv_cache_dtypes = ["auto"]\narchs = ["cpu"]',
         'kv_cache_dtypes = ["auto", "auto"]\narchs = ["cpu"]')
    assert load_errors(matrix_copy) == [
        f"{matrix_copy}/backends.toml: duplicate kv_cache_dtype 'auto' in backends.CPU_MLA.kv_cache_dtypes[1]",
    ]


@pytest.mark.parametrize(("name", "shown"), [("fp8 $(id)", "'fp8 $(id)'"), ("fp8-e4m3", "'fp8-e4m3'"),
                                             ("fp8\\n", "'fp8\\n'")])
def test_a_dtype_name_that_cannot_be_part_of_a_cell_id_is_refused(matrix_copy, name, shown):
    # it made cell ids with a space and `$(` (GitHub job names, results folders, the Buildkite step's shell words) or a
    # '-' that split_cell_id read as another backend
    edit(matrix_copy, "axes.toml", '"fp8_e5m2"]', f'"fp8_e5m2", "{name}"]')
    assert load_errors(matrix_copy) == [
        f"{matrix_copy}/axes.toml: kv_cache_dtype {shown} is not a name vLLM's --kv-cache-dtype takes in "
        "kv_cache_dtypes[4]. Use lower case, digits and _ (e.g. fp8_e4m3)",
    ]


def test_duplicate_backend_table_is_invalid_toml(matrix_copy):
    path = matrix_copy / "backends.toml"
    path.write_text(path.read_text() + '\n[backends.CPU_MLA]\nmla = true\n')
    (error,) = load_errors(matrix_copy)
    assert error.startswith(f"{matrix_copy}/backends.toml: invalid TOML: Cannot declare ('backends', 'CPU_MLA') twice")


def test_exclusion_matching_no_cell(matrix_copy):
    path = matrix_copy / "exclusions.toml"
    path.write_text(path.read_text() + (
        '\n[[exclude]]\nmatch = { backend = "FLASH_ATTN_MLA", arch = "sm90", kv_cache_dtype = "auto" }\n'
        'reason = "x"\nlink = "https://example.org/x"\n'
        '\n[[exclude]]\nmatch = { backend = "TRITON_MLA", arch = "sm80", kv_cache_dtype = "fp8" }\n'
        'reason = "already unsupported"\nlink = "https://example.org/y"\n'))
    errors = load_errors(matrix_copy)
    assert errors == [
        f"{matrix_copy}/exclusions.toml: exclusion matches no cell (the backend's declared support already leaves it "
        "out, or the names are stale) in exclude[4]. Delete it or fix its match",
    ]
    # exclude[3] matched flash_attn_mla-auto-sm90 and removed it, which is allowed


def test_unknown_key_with_did_you_mean(matrix_copy):
    edit(matrix_copy, "backends.toml", "block_sizes = [128]", "block_size = [128]")
    assert load_errors(matrix_copy) == [
        f"{matrix_copy}/backends.toml: unknown key 'block_size' in backends.CUTLASS_MLA. Did you mean block_sizes?",
    ]


def test_link_must_be_a_url(matrix_copy):
    edit(matrix_copy, "waivers.toml", 'issue = "https://github.com/vllm-project/vllm/issues/41651"', 'issue = "41651"')
    assert load_errors(matrix_copy) == [f"{matrix_copy}/waivers.toml: expected a URL, got '41651' in waiver[0].issue"]


def test_missing_file(matrix_copy):
    (matrix_copy / "workloads.toml").unlink()
    assert load_errors(matrix_copy) == [
        f"{matrix_copy}/workloads.toml: file is missing. kvgate reads axes.toml, backends.toml, exclusions.toml, "
        "waivers.toml, workloads.toml",
    ]


def test_backends_or_workloads_that_are_not_tables_are_one_line_each(capsys, matrix_copy):
    (matrix_copy / "backends.toml").write_text('backends = "FLASH_ATTN"\n')
    workloads = (matrix_copy / "workloads.toml").read_text()
    (matrix_copy / "workloads.toml").write_text("workloads = []\n" + workloads[:workloads.index("[workloads.")])
    code, out, err = run_cli(capsys, "matrix", "--matrix-dir", str(matrix_copy))
    assert (code, out) == (2, "")
    lines = err.splitlines()
    assert all(line.startswith("ERROR ") for line in lines), err  # the other files' names of backends follow, no traceback
    assert [line for line in lines if "/backends.toml:" in line or "/workloads.toml:" in line] == [
        f"ERROR {matrix_copy}/backends.toml: expected [backends.<name>] tables, got the string 'FLASH_ATTN' in backends. "
        "Declare each as a table: [backends.FLASH_ATTN]",
        f"ERROR {matrix_copy}/workloads.toml: expected [workloads.<name>] tables, got a list in workloads. Declare each "
        "as a table: [workloads.tiny-llama]",
    ]


@pytest.mark.parametrize(("value", "shown"), [('"32k"', "the string '32k'"), ("nan", "the number nan"),
                                              ("inf", "the number inf"), ("{ tokens = 1 }", "a table"),
                                              ("0", "the number 0"), ("true", "the boolean true")])
def test_a_max_model_len_kvgate_cannot_read_is_named_when_the_matrix_loads(matrix_copy, value, shown):
    # it was accepted, and int() of it was a ValueError, OverflowError or TypeError traceback where a stage or the gate
    # asked the workload its max_model_len
    edit(matrix_copy, "workloads.toml", "model_args = { trust_remote_code = true, max_model_len = 32784,",
         f"model_args = {{ trust_remote_code = true, max_model_len = {value},")
    assert load_errors(matrix_copy) == [
        f"{matrix_copy}/workloads.toml: expected a whole number of tokens >= 1, got {shown} in "
        "workloads.deepseek-v2-lite.model_args.max_model_len. Write e.g. max_model_len = 4096",
    ]


def test_trust_remote_code_as_a_string_is_refused_not_read_as_true(matrix_copy):
    edit(matrix_copy, "workloads.toml", "model_args = { trust_remote_code = true,",
         'model_args = { trust_remote_code = "false",')  # bool("false") is True: the engine would run the hub's code
    assert load_errors(matrix_copy) == [
        f"{matrix_copy}/workloads.toml: expected true or false, got the string 'false' in "
        "workloads.deepseek-v2-lite.model_args.trust_remote_code",
    ]


def test_workload_may_not_set_what_the_cell_sets(matrix_copy):
    edit(matrix_copy, "workloads.toml", "model_args = { max_model_len = 32784, enforce_eager = false }",
         'model_args = { max_model_len = 32784, kv_cache_dtype = "fp8" }')
    assert load_errors(matrix_copy) == [
        f"{matrix_copy}/workloads.toml: 'kv_cache_dtype' is set by kvgate from the cell in "
        "workloads.llama-3_1-8b.model_args.kv_cache_dtype. Delete it",
    ]


def test_arch_without_workload(matrix_copy):
    edit(matrix_copy, "workloads.toml", 'mla = false\narchs = ["cpu"]', 'mla = false\narchs = []')
    assert load_errors(matrix_copy) == [
        f"{matrix_copy}/workloads.toml: no workload for non-MLA backends on cpu (CPU_ATTN needs exactly one) in "
        "workloads. Give one workload with mla = false and 'cpu' in its archs",
    ]


def test_bad_integer_setting(matrix_copy):
    edit(matrix_copy, "workloads.toml", "num_prompts = 100", "num_prompts = -3")
    assert load_errors(matrix_copy) == [
        f"{matrix_copy}/workloads.toml: expected an integer >= 1, got the number -3 in defaults.throughput.num_prompts",
    ]


SEED_EXPECTED = ('expected_accuracy = { strict-match = 0.671, flexible-extract = 0.664, rtol = 0.08, source = "vLLM CI '
                 '(.buildkite/lm-eval-harness, DeepSeek-V2-Lite-Chat gsm8k 5-shot, limit 1000, rtol 0.08)" }')


def test_a_workload_declares_its_expected_accuracy(real_matrix):
    expected = real_matrix.workloads["deepseek-v2-lite"].expected_accuracy
    assert expected is not None
    assert (dict(expected.values), expected.rtol) == ({"strict-match": 0.671, "flexible-extract": 0.664}, 0.08)
    assert expected.source.startswith("vLLM CI")
    trained = real_matrix.workloads["tiny-llama"].expected_accuracy  # the trained CPU default has a floor too
    assert trained is not None and dict(trained.values)["strict-match"] == 0.85
    for name in ("tiny-deepseek-v2", "tiny-deepseek-v2-gpu"):  # trained: the MLA cells have a floor as well
        floor = real_matrix.workloads[name].expected_accuracy
        assert floor is not None and dict(floor.values)["strict-match"] == 0.767, name


BAD_EXPECTED_ACCURACY = {
    "filter with an underscore": (
        'expected_accuracy = { strict_match = 0.671, rtol = 0.08, source = "vLLM CI" }',
        ["unknown key 'strict_match' in workloads.deepseek-v2-lite.expected_accuracy. Did you mean strict-match?"]),
    "accuracy in percent": (
        'expected_accuracy = { strict-match = 67.1, rtol = 0.08, source = "vLLM CI" }',
        ["expected an accuracy as a fraction in (0, 1), got the number 67.1 in "
         "workloads.deepseek-v2-lite.expected_accuracy.strict-match"]),
    "tolerance in percent": (
        'expected_accuracy = { strict-match = 0.671, rtol = 8, source = "vLLM CI" }',
        ["expected a relative tolerance in (0, 1), got the number 8 in "
         "workloads.deepseek-v2-lite.expected_accuracy.rtol. vLLM's CI uses 0.08"]),
    "no filter": (
        'expected_accuracy = { rtol = 0.08, source = "vLLM CI" }',
        ["no expected accuracy in workloads.deepseek-v2-lite.expected_accuracy. Give at least one of strict-match, "
         "flexible-extract"]),
    "no source": (
        'expected_accuracy = { strict-match = 0.671, rtol = 0.08 }',
        ["missing key 'source' in workloads.deepseek-v2-lite.expected_accuracy"]),
    "not a table": (
        'expected_accuracy = 0.671',
        ["expected a table, got the number 0.671 in workloads.deepseek-v2-lite.expected_accuracy"]),
}


@pytest.mark.parametrize(("line", "errors"), BAD_EXPECTED_ACCURACY.values(), ids=BAD_EXPECTED_ACCURACY.keys())
def test_bad_expected_accuracy_is_named(matrix_copy, line, errors):
    edit(matrix_copy, "workloads.toml", SEED_EXPECTED, line)
    assert load_errors(matrix_copy) == [f"{matrix_copy}/workloads.toml: {e}" for e in errors]


# ---------------------------------------------------------------------------------------- the CLI

def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = kvgate_main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_gha_format_is_a_github_matrix(capsys):
    code, out, err = run_cli(capsys, "matrix", "--format", "gha", "--arch", "sm100")
    assert code == 0, err
    include = json.loads(out)["include"]
    assert {"flashinfer_mla-auto-sm100", "flashinfer_mla-fp8-sm100"} <= {job["cell"] for job in include}
    for job in include:
        assert job["runner"] == "gpu-sm100"
        assert job["sessions"] == [f"cell({job['cell']})"]


def test_cli_changed_files(capsys, tmp_path):
    diff = tmp_path / "changed.txt"
    diff.write_text("vllm/v1/attention/backends/mla/flashinfer_mla.py\n")
    code, out, _ = run_cli(capsys, "matrix", "--format", "ids", "--changed-files", str(diff))
    assert code == 0
    assert out.split() == ["flashinfer_mla-auto-sm100", "flashinfer_mla-fp8-sm100"]


def test_cli_bad_matrix_is_one_line_per_problem_and_exit_2(capsys, matrix_copy):
    edit(matrix_copy, "exclusions.toml", 'backend = "CPU_ATTN", kv_cache_dtype = "fp8_e4m3"',
         'backend = "FLASHINFR", kv_cache_dtype = "fp8_e4m3"')
    code, out, err = run_cli(capsys, "matrix", "--matrix-dir", str(matrix_copy))
    assert code == 2
    assert out == ""
    assert err == (f"ERROR {matrix_copy}/exclusions.toml: unknown backend 'FLASHINFR' in exclude[0].match.backend. "
                   "Did you mean FLASHINFER?\n")


def test_cli_missing_changed_files_list(capsys, tmp_path):
    code, _, err = run_cli(capsys, "matrix", "--changed-files", str(tmp_path / "nope.txt"))
    assert code == 2
    assert err == (f"ERROR {tmp_path}/nope.txt: cannot read the changed-files list: No such file or directory. "
                   "Pass the output of `git diff --name-only BASE...HEAD` saved to a file\n")


def test_an_empty_list_in_a_match_is_refused_not_read_as_every_value(capsys, matrix_copy):
    """`kv_cache_dtype = []` matched every dtype: one character took all eleven FLASH_ATTN cells out, exit 0."""
    edit(matrix_copy, "exclusions.toml", 'backend = "CPU_ATTN", kv_cache_dtype = "fp8_e4m3"',
         'backend = "FLASH_ATTN", kv_cache_dtype = []')
    code, out, err = run_cli(capsys, "matrix", "--matrix-dir", str(matrix_copy))
    assert (code, out) == (2, "")
    assert (f"ERROR {matrix_copy}/exclusions.toml: empty list in a match would match every kv_cache_dtype in "
            "exclude[0].match.kv_cache_dtype. Name at least one kv_cache_dtype, or leave the key out\n") in err


def test_a_matrix_file_that_is_not_utf8_is_one_line_not_a_traceback(capsys, matrix_copy):
    with (matrix_copy / "waivers.toml").open("ab") as handle:
        handle.write(b"\n# \xff\xfe\n")
    code, out, err = run_cli(capsys, "matrix", "--matrix-dir", str(matrix_copy))
    assert (code, out) == (2, "")
    assert err.startswith(f"ERROR {matrix_copy}/waivers.toml: not UTF-8 text (byte ") and err.count("\n") == 1
    assert "Save the file as UTF-8" in err


@pytest.mark.parametrize("listing, shown", [
    ("", None),
    ("\n  \n", None),
    ("docs/../vllm/v1/attention/backends/flash_attn.py\n", "'docs/../vllm/v1/attention/backends/flash_attn.py'"),
    ("tests/../csrc/cache_kernels.cu\n", "'tests/../csrc/cache_kernels.cu'"),
    ("/vllm/v1/attention/backends/flash_attn.py\n", "'/vllm/v1/attention/backends/flash_attn.py'"),
    ("docs/a.md\0vllm/a\nb.py\0", "'vllm/a\\nb.py'"),
])
def test_a_changed_files_list_that_cannot_be_matched_safely_is_refused(capsys, tmp_path, listing, shown):
    """Read as listed, `docs/../vllm/...` matched the inert docs/** and planned no cell (exit 0), and an empty list
    (a failed `git diff > FILE`) planned none too."""
    changed = tmp_path / "changed.txt"
    changed.write_text(listing)
    code, out, err = run_cli(capsys, "matrix", "--format", "gha", "--changed-files", str(changed))
    assert (code, out) == (2, "")
    if shown is None:
        assert err.startswith(f"ERROR {changed}: the changed-files list names no path. ")
    else:
        assert err.startswith(f"ERROR {changed}: unsafe path {shown} in path ")


@pytest.mark.parametrize("old, new, where", [
    ('runner = "gpu-sm90"', 'runner = "gpu-sm90\\r\\nx"', "archs.sm90.runner"),
    ('{ "gpu-sm90-x2" = 2 }', '{ "gpu-${X}" = 2 }', "archs.sm90.multi_gpu_runners"),
])
def test_a_runner_label_that_a_ci_system_would_break_on_is_refused(capsys, matrix_copy, old, new, where):
    edit(matrix_copy, "axes.toml", old, new)
    code, out, err = run_cli(capsys, "matrix", "--matrix-dir", str(matrix_copy), "--format", "gha")
    assert (code, out) == (2, "")
    assert "has characters a runner label cannot hold" in err and f" in {where}. " in err


def test_cli_has_no_traceback_for_bad_flags():
    result = subprocess.run([sys.executable, "-m", "kvgate", "matrix", "--arch", "sm9"], capture_output=True,
                            text=True, cwd=ROOT, env={"PYTHONPATH": str(ROOT / "src"), "PATH": "/usr/bin:/bin"})
    assert result.returncode == 2
    assert result.stderr == "ERROR --arch: unknown value 'sm9'. Did you mean sm90?\n"


def test_input_error_format():
    assert str(InputError("f.toml", "bad", "a.b", "Fix it")) == "f.toml: bad in a.b. Fix it"


def test_the_waived_column_has_a_legend_with_each_waivers_issue(capsys, real_matrix):
    code, out, _ = run_cli(capsys, "matrix", "--arch", "sm90")
    assert code == 0
    table, _, legend = out.partition("\nwaived: ")
    assert "waiver[1]" in table and "waiver[2]" in table and "waiver[0]" not in table  # waiver[0]: FLASHINFER sm120
    shown = [w for w in real_matrix.waivers if w.where in ("waiver[1]", "waiver[2]")]
    assert legend.splitlines()[0] == ("checks known to fail, read WAIVED (never PASS) until the waiver expires "
                                      "(matrix/waivers.toml)")
    for waiver in shown:
        assert (f"  {waiver.where}: every check, until {waiver.expires.isoformat()}; {waiver.issue}\n"
                f"    {waiver.reason}\n") in legend
        assert waiver.issue.startswith("https://")
    code, out, _ = run_cli(capsys, "matrix", "--backend", "FLASHMLA")
    assert code == 0 and "waived: " not in out  # no FLASHMLA cell is waived: no legend
