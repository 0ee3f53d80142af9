"""Acting on a red check (issue "Act on a red check in one minute"): each ERROR and FAIL carries the first real error of
its stage's log with the log's path and line, in report.md, report.html (linked), junit.xml and verdict.json; kernel
tests that fail are FAILs, one junit case per pytest test with pytest's message; under each failure, the command that
reruns its cell.

On the real H200 run (tests/fixtures/h200_run): four stages broke on vLLM's memory-profiling race, which their logs
end by wrapping in "RuntimeError: Engine core initialization failed. See root cause above.", and FLASHMLA's FP8 kernel
tests failed (21 of 57,344 elements outside atol 0.02).
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest
from junitparser import JUnitXml

from kvgate.results.parsers import tool_log
from test_fp8_kv_cache_check import gate_cli, h200_matrix, h200_unpacked  # noqa: F401 (fixtures)

MEMORY_RACE = "AssertionError: Error in memory profiling. Initial free memory 127.39 GiB, current free memory 138.91 GiB."


# ---------------------------------------------------------------------------------------------- the logs themselves

@pytest.mark.parametrize(("cell", "log", "line", "found_by", "starts"), [
    # vLLM's known message, at its first place (behind the engine's logger prefix; a bare copy follows at 117)
    ("flashmla-fp8-sm90", "throughput.log", 76, "vllm: memory profiling", MEMORY_RACE),
    ("flex_attention-auto-sm90", "throughput.log", 66, "vllm: memory profiling", "AssertionError: Error in memory "),
    ("flash_attn-auto-sm90", "accuracy.previous.log", 53, "vllm: no memory for the KV cache",
     "ValueError: No available memory for the cache blocks."),
    # no known message: the exception that ends the first traceback, a bare assert with its statement
    ("triton_attn-fp8_e5m2-sm90", "accuracy.log", 127, "traceback",
     'AssertionError: assert self.kv_cache_dtype in {"fp8", "fp8_e4m3", "nvfp4"}'),
    ("flashinfer-fp8_e5m2-sm90", "accuracy.log", 145, "traceback",
     "ValueError: The dtype of q torch.float8_e4m3fn does not match the q_data_type torch.float8_e5m2"),
    # pytest's first failed assertion, with its figures
    ("flashmla-fp8-sm90", "kernels.log", 37, "pytest: test failed",
     "AssertionError: vllm_flashmla ragged_short-h16-p64-fp8_e4m3: 21 of 57344 elements outside atol=0.02 rtol=0.02"),
])
def test_the_first_real_error_of_a_real_log_and_its_line(h200_unpacked, cell, log, line, found_by, starts):  # noqa: F811
    path = h200_unpacked / cell / "logs" / log
    found = tool_log.read_first_error(path)
    print(found)
    assert (found.line, found.found_by) == (line, found_by) and found.text.startswith(starts)
    assert "See root cause above" not in found.text
    raw = path.read_bytes().decode("utf-8", "replace").split("\n")[line - 1]  # the line as `grep -n` numbers it
    assert tool_log.plain(raw)[:60] in found.text or found.text.removeprefix("AssertionError: ")[:40] in raw


def test_a_healthy_log_names_no_error(h200_unpacked):  # noqa: F811
    assert tool_log.read_first_error(h200_unpacked / "triton_mla-fp8-sm90" / "logs" / "accuracy.log") is None


def test_a_known_message_wins_over_an_earlier_traceback_and_a_chained_one_starts_at_its_root():
    log = ["INFO starting", "Traceback (most recent call last):", '  File "/x/vllm/a.py", line 3, in f',
           "    g()", "KeyError: 'x'", "", "The above exception was the direct cause of the following exception:", "",
           "Traceback (most recent call last):", '  File "/x/vllm/b.py", line 9, in h', "RuntimeError: wrapped",
           "(EngineCore pid=7) ERROR 12-01 05:27:40 [core.py:1330] torch.OutOfMemoryError: CUDA out of memory. "
           "Tried to allocate 2.00 GiB"]
    found = tool_log.first_error(log)
    assert (found.line, found.found_by, found.text) == (
        12, "vllm: out of GPU memory", "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB")
    found = tool_log.first_error(log[:11])
    assert (found.line, found.text, found.frame) == (5, "KeyError: 'x'", "a.py:3 in f")


def test_a_hostile_log_is_read_safely(tmp_path):
    """Bytes that are no UTF-8, a progress bar's carriage returns (one line, as an editor numbers it), a line of a
    megabyte, and a log past MAX_BYTES: read, never a crash, the error cut to MAX_TEXT characters."""
    path = tmp_path / "throughput.log"
    path.write_bytes(b"\xff\xfe binary \x00\n" + b"step 1/9\rstep 9/9\r\n" + b"x" * 1_000_000 + b"\n"
                     + b"RuntimeError: CUDA error: an illegal memory access was encountered " + b"y" * 5000 + b"\n")
    found = tool_log.read_first_error(path)
    assert (found.line, found.found_by) == (4, "vllm: CUDA error") and len(found.text) == tool_log.MAX_TEXT
    big = tmp_path / "big.log"
    with open(big, "wb") as handle:
        handle.write(b"z" * (tool_log.MAX_BYTES + 10) + b"\nRuntimeError: CUDA error: past the cap\n")
    found = tool_log.read_first_error(big)  # past the head: the log's end is scanned, numbered as in the whole log
    assert (found.line, found.text) == (2, "RuntimeError: CUDA error: past the cap")
    assert tool_log.read_first_error(tmp_path / "absent.log") is None


def test_a_long_line_that_repeats_the_start_of_a_known_message_is_read_in_linear_time():
    """A known message's `.*` scanned the rest of a line from each place its start appears: this line of 600 KB
    repeating the starts of two took 13 s (quadratic: a 64 MiB log of them, hours). Only the first MAX_LINE characters
    of a line are matched."""
    line = "Selected backend " * 18_000 + "Couldn't reach '" * 18_000
    started = time.perf_counter()
    assert tool_log.first_error([line, "RuntimeError: CUDA error: after it"]).line == 2
    assert time.perf_counter() - started < 0.5


@pytest.mark.parametrize("ending", [b"\n", b""])
def test_a_runaway_log_names_the_error_at_its_end_with_its_line_number(tmp_path, monkeypatch, ending):
    """An engine that flooded its log (progress lines past the scanned head) and then died: its error is in the last
    TAIL_BYTES, and the line number is the one an editor shows. An error only between head and tail is not scanned;
    a log past MAX_COUNTED_BYTES keeps to its head (counting its lines would stall the gate)."""
    monkeypatch.setattr(tool_log, "MAX_BYTES", 1000)
    monkeypatch.setattr(tool_log, "TAIL_BYTES", 300)
    monkeypatch.setattr(tool_log, "COUNT_CHUNK", 64)
    monkeypatch.setattr(tool_log, "MAX_COUNTED_BYTES", 100_000)
    progress = [f"Processed prompts: {i} it/s".encode() for i in range(2000)]
    lines = [*progress, b"Traceback (most recent call last):", b'  File "gpu_model_runner.py", line 9, in execute',
             b"RuntimeError: CUDA error: an illegal memory access was encountered"]
    log = tmp_path / "throughput.log"
    log.write_bytes(b"\n".join(lines) + ending)
    found = tool_log.read_first_error(log)
    assert (found.line, found.text, found.found_by) == (
        len(lines), "RuntimeError: CUDA error: an illegal memory access was encountered", "vllm: CUDA error")
    assert log.read_bytes().split(b"\n")[found.line - 1] == lines[-1]

    middle = [*progress[:1000], b"RuntimeError: CUDA error: in the middle", *progress[1000:]]
    log.write_bytes(b"\n".join(middle) + ending)
    assert tool_log.read_first_error(log) is None  # neither in the head nor in the tail
    log.write_bytes(b"\n".join([*progress[:10], lines[-1], *progress]) + ending)
    assert tool_log.read_first_error(log).line == 11  # the head's error comes first
    monkeypatch.setattr(tool_log, "MAX_COUNTED_BYTES", 10_000)
    log.write_bytes(b"\n".join(lines) + ending)
    assert tool_log.read_first_error(log) is None


# ---------------------------------------------------------------------------------------------- through the gate

def test_a_cells_log_is_read_once_for_the_stages_that_share_it(tmp_path, monkeypatch):
    """The probe and the passkey task run in the accuracy stage's engine, so a dead engine breaks three stages that
    name one log, logs/accuracy.log: it was scanned once for each (a runaway log of 64 MiB takes seconds a scan: a
    2-cell run with 100 MB logs took 37 s). Each stage still names its first error; the log is read once a cell."""
    from kvgate.cli import main
    from synthetic_run import write_cell

    run = tmp_path / "run"
    for dtype in ("auto", "fp8"):
        cell = write_cell(run, backend="FLASHINFER_MLA", kv_cache_dtype=dtype, arch="sm100")
        (cell / "status.json").write_text(json.dumps({stage: {"status": "error", "reason": "engine died"}
                                                      for stage in ("accuracy", "probe", "long_context")}))
        (cell / "logs").mkdir()
        (cell / "logs" / "accuracy.log").write_text("INFO start\nRuntimeError: CUDA error: an illegal memory access "
                                                    "was encountered\n")
    reads = []
    real = tool_log.read_first_error
    monkeypatch.setattr(tool_log, "read_first_error", lambda path: reads.append(path) or real(path))
    assert main(["gate", str(run), "--out", str(tmp_path / "out"), "--today", "2026-11-30"]) == 1
    assert sorted(p.parent.parent.name for p in reads) == ["flashinfer_mla-auto-sm100", "flashinfer_mla-fp8-sm100"]
    checks = json.loads((tmp_path / "out" / "verdict.json").read_text())["checks"]
    logged = {(c["cell"], c["kind"]): c["log"]["line"] for c in checks if c.get("log")}
    assert logged == {(f"flashinfer_mla-{dtype}-sm100", stage): 2 for dtype in ("auto", "fp8")
                      for stage in ("accuracy", "probe")}  # the passkey stage's error is the accuracy check's


@pytest.fixture(scope="module")
def judged(h200_unpacked, h200_matrix, tmp_path_factory):  # noqa: F811
    out = tmp_path_factory.mktemp("h200-gate") / "out"
    assert gate_cli(h200_unpacked, h200_matrix, out) == 1
    verdict = json.loads((out / "verdict.json").read_text(encoding="utf-8"))
    return out, {(c["cell"], c["kind"]): c for c in verdict["checks"]}, verdict


def test_each_broken_stage_names_its_first_error_with_the_log_and_line_in_every_output(judged, h200_unpacked):  # noqa: F811
    out, checks, _ = judged
    check = checks[("flashmla-fp8-sm90", "throughput")]
    link = Path(__import__("os").path.relpath(h200_unpacked / "flashmla-fp8-sm90" / "logs" / "throughput.log",
                                              out)).as_posix()
    assert check["status"] == "error"
    assert {k: v for k, v in check["log"].items() if k != "error"} == {
        "path": "flashmla-fp8-sm90/logs/throughput.log", "line": 76, "found_by": "vllm: memory profiling", "frame": "",
        "url": link}
    assert check["log"]["error"].startswith(MEMORY_RACE)
    report = (out / "report.md").read_text(encoding="utf-8")
    attention = report.split("### Needs attention (5)\n\n")[1].split("\n\n")[0]
    print(attention)
    assert "See root cause above" not in attention
    assert (f"  - first error: `{check['log']['error']}` — [flashmla-fp8-sm90/logs/throughput.log:76]({link})"
            in attention.splitlines())
    page = (out / "report.html").read_text(encoding="utf-8")
    needs = page.split('<section id="needs-attention">')[1].split("</section>")[0]
    assert f'<a href="{link}">flashmla-fp8-sm90/logs/throughput.log:76</a>' in needs
    assert "Error in memory profiling. Initial free memory 127.39 GiB" in needs
    junit = JUnitXml.fromfile(str(out / "junit.xml"))
    case = next(c for s in junit for c in s if c.classname == "kvgate.throughput" and c.name == "flashmla-fp8-sm90")
    assert (f"first error: {check['log']['error']} at flashmla-fp8-sm90/logs/throughput.log:76 ({link})"
            in case.result[0].message)


def test_kernel_tests_that_failed_are_fails_one_junit_case_each_with_pytests_message(judged):
    """FLASHMLA's FP8 decode outside tolerance: its runner marked the stage error (kvgate's runners of contract 1.8
    do), but pytest ran and 4 of its 10 tests failed: a FAIL, each test a case of its own, never an ERROR."""
    out, checks, verdict = judged
    check = checks[("flashmla-fp8-sm90", "kernels")]
    assert (check["status"], check["word"]) == ("fail", "fail")
    assert [t["outcome"] for t in check["tests"]].count("failed") == 4 and len(check["tests"]) == 10
    assert check["log"]["path"] == "flashmla-fp8-sm90/logs/kernels.log" and check["log"]["line"] == 37
    junit = JUnitXml.fromfile(str(out / "junit.xml"))
    cases = [c for s in junit for c in s if c.classname == "kvgate.kernels.flashmla-fp8-sm90"]
    assert len(cases) == 10
    failed = {c.name: c.result[0] for c in cases if c.result and c.result[0]._tag == "failure"}
    first = failed["tests.kernels.test_mla_decode::test_decode_matches_reference[vllm_flashmla-ragged_short-h16-p64-"
                   "fp8_e4m3]"]
    assert first.message.startswith("failed: AssertionError: vllm_flashmla ragged_short-h16-p64-fp8_e4m3: 21 of 57344 "
                                    "elements outside atol=0.02 rtol=0.02 (fp8-kv-vs-dequantised) [max_abs=0.0421")
    assert "rerun: nox -s 'cell(flashmla-fp8-sm90)' -- --stages kernels --vllm release:0.26.0" in first.message
    assert len(failed) == 4 and verdict["summary"]["junit_failures"] == 4  # no other check failed
    assert verdict["summary"]["junit_errors"] == 4  # the 4 throughput stages that broke: errors, each its stage


def test_a_kernels_stage_that_broke_stays_an_error(h200_unpacked, h200_matrix, tmp_path):  # noqa: F811
    """Without junit.xml (pytest never wrote one) the stage broke: ERROR, with the runner's reason."""
    import shutil

    run = Path(shutil.copytree(h200_unpacked, tmp_path / "run"))
    (run / "flashmla-fp8-sm90" / "kernels" / "junit.xml").unlink()
    assert gate_cli(run, h200_matrix, tmp_path / "out") == 1
    checks = {(c["cell"], c["kind"]): c for c in json.loads((tmp_path / "out" / "verdict.json").read_text())["checks"]}
    check = checks[("flashmla-fp8-sm90", "kernels")]
    assert check["status"] == "error" and check["detail"].startswith("kernels stage error: 4 failed, 0 errors of 10")
    assert "tests" not in check


def test_under_each_failure_the_command_that_reruns_its_cell_with_the_runs_own_vllm(judged):
    out, _, _ = judged
    report = (out / "report.md").read_text(encoding="utf-8")
    attention = report.split("### Needs attention (5)\n\n")[1].split("\n\n")[0].splitlines()
    reruns = [line for line in attention if line.startswith("  - rerun this cell: ")]
    assert reruns == ["  - rerun this cell: `nox -s 'cell(flashmla-fp8-sm90)' -- --stages kernels --vllm release:0.26.0`",
                      *[f"  - rerun this cell: `nox -s 'cell({cell})' -- --stages throughput --vllm release:0.26.0`"
                        for cell in ("flash_attn-auto-sm90", "flashinfer-fp8-sm90", "flashmla-fp8-sm90",
                                     "flex_attention-auto-sm90")]]


def test_in_ci_a_log_links_its_artifact(h200_unpacked, h200_matrix, tmp_path, capsys):  # noqa: F811
    out = tmp_path / "out"
    assert gate_cli(h200_unpacked, h200_matrix, out, "--log-url", "artifact://kvgate-cell-{cell}/{path}") == 1
    report = (out / "report.md").read_text(encoding="utf-8")
    assert ("[flashmla-fp8-sm90/logs/throughput.log:76](artifact://kvgate-cell-flashmla-fp8-sm90/flashmla-fp8-sm90/"
            "logs/throughput.log)") in report
    links = tmp_path / "links.json"
    links.write_text(json.dumps({"flashmla-fp8-sm90": "https://github.com/a/b/actions/runs/1/artifacts/7",
                                 "*": "https://github.com/a/b/actions/runs/1"}))
    assert gate_cli(h200_unpacked, h200_matrix, out, "--log-url", f"@{links}") == 1
    logs = {(c["cell"], c["kind"]): c["log"] for c in json.loads((out / "verdict.json").read_text())["checks"]
            if c["log"]}
    assert logs[("flashmla-fp8-sm90", "throughput")]["url"] == "https://github.com/a/b/actions/runs/1/artifacts/7"
    assert logs[("flex_attention-auto-sm90", "throughput")]["url"] == "https://github.com/a/b/actions/runs/1"
    links.write_text("[1, 2]")
    capsys.readouterr()
    assert gate_cli(h200_unpacked, h200_matrix, out, "--log-url", f"@{links}") == 2
    assert capsys.readouterr().err == (f"ERROR {links}: expected a JSON object of cell id -> template (strings) in the "
                                       'top level. Write {"<cell id>": "<template>", "*": "<template>"}\n')



def test_a_log_that_links_out_of_its_cell_is_never_read(h200_unpacked, h200_matrix, tmp_path):  # noqa: F811
    """The results folder is data from the machines that measured: a log that is a link (here to a file holding a
    secret-looking error line) is not quoted in the report."""
    import shutil

    run = Path(shutil.copytree(h200_unpacked, tmp_path / "run"))
    secret = tmp_path / "secret.txt"
    secret.write_text("RuntimeError: CUDA error: token=hunter2\n", encoding="utf-8")
    log = run / "flashmla-fp8-sm90" / "logs" / "throughput.log"
    log.unlink()
    log.symlink_to(secret)
    assert gate_cli(run, h200_matrix, tmp_path / "out") == 1
    assert "hunter2" not in (tmp_path / "out" / "report.md").read_text(encoding="utf-8")
    assert "hunter2" not in (tmp_path / "out" / "verdict.json").read_text(encoding="utf-8")


def test_attack_a_cell_folder_named_as_a_scheme_links_its_log_as_a_path(tmp_path):
    """A log's link is its path relative to the gate's outputs; beside them (`--out RUN_DIR`) it starts with the cell
    folder's name, which is free: `javascript:alert(1)` would be a script link in report.html."""
    from kvgate.cli import main
    from synthetic_run import write_seed_run

    run = write_seed_run(tmp_path / "run", contract="1.6")
    folder = run / "javascript:alert(document.domain)"
    (run / "flashinfer_mla-fp8-sm100").rename(folder)
    status = json.loads((folder / "status.json").read_text())
    status["throughput"] = {"status": "error", "reason": "boom", "log_tail": "RuntimeError: CUDA error: bad"}
    (folder / "status.json").write_text(json.dumps(status))
    assert main(["gate", str(run), "--today", "2026-12-02", "--out", str(run)]) == 1
    page = (run / "report.html").read_text(encoding="utf-8")
    assert re.findall(r'href="([^"]*)"', page) == [
        "./javascript%3Aalert%28document.domain%29/status.json"] * 2
    verdict = json.loads((run / "verdict.json").read_text(encoding="utf-8"))
    assert {c["log"]["url"] for c in verdict["checks"] if c["log"]} == {
        "./javascript%3Aalert%28document.domain%29/status.json"}
    assert main(["gate", str(run), "--today", "2026-12-02", "--out", str(tmp_path / "out"),
                 "--log-url", "artifact://kvgate-cell-{cell}/{path}"]) == 1
    verdict = json.loads((tmp_path / "out" / "verdict.json").read_text(encoding="utf-8"))
    assert {c["log"]["url"] for c in verdict["checks"] if c["log"]} == {
        "artifact://kvgate-cell-javascript%3Aalert%28document.domain%29/javascript%3Aalert%28document.domain%29/"
        "status.json"}
