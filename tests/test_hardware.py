"""kvgate.runners.environment.gpu: the arch of the GPU the engine will use (CUDA_VISIBLE_DEVICES honoured) and the
driver check that runs before any GPU cell, against a fake nvidia-smi that answers like the real one."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from ci_scripts import load_ci_script
from kvgate import InputError
from kvgate.cli import main
from kvgate.runners.environment import gpu

L4 = {"uuid": "GPU-4c1a0d6e-0000-0000-0000-000000000001", "cap": "8.9", "driver": "580.159.04"}
H200 = {"uuid": "GPU-9e2b7f30-0000-0000-0000-000000000002", "cap": "9.0", "driver": "580.159.04"}

FAKE_SMI = r'''#!{python}
"""nvidia-smi as kvgate calls it: --query-gpu=FIELD --format=csv,noheader [-i INDEX|UUID], and -L. A device it
cannot name: "No devices were found", exit 6 (nvidia-smi 580.159.04 on the H200, for `-i 1` and `-i MIG-...`)."""
import json, os, sys
gpus = json.loads(os.environ["FAKE_NVIDIA_SMI"])
with open(os.environ["FAKE_NVIDIA_SMI_LOG"], "a") as log:
    log.write(" ".join(sys.argv[1:]) + "\n")
args = sys.argv[1:]
if args == ["-L"]:
    for i, gpu in enumerate(gpus):
        print(f"GPU {{i}}: NVIDIA Fake (UUID: {{gpu['uuid']}})")
    sys.exit(0)
if "-i" in args:
    wanted = args[args.index("-i") + 1]
    chosen = [g for i, g in enumerate(gpus) if wanted in (str(i), g["uuid"])]
    if not chosen:
        print("No devices were found")
        sys.exit(6)
    gpus = chosen
field = next(a for a in args if a.startswith("--query-gpu=")).split("=", 1)[1]
for gpu in gpus:
    print({{"compute_cap": gpu["cap"], "driver_version": gpu["driver"]}}[field])
'''


@pytest.fixture
def fake_smi(tmp_path, monkeypatch):
    """Install a fake nvidia-smi first on PATH; returns (set the GPUs, read the calls it got)."""
    folder = tmp_path / "bin"
    folder.mkdir()
    script = folder / "nvidia-smi"
    script.write_text(FAKE_SMI.format(python=sys.executable))
    script.chmod(0o755)
    log = tmp_path / "smi.log"
    log.write_text("")
    monkeypatch.setenv("PATH", f"{folder}:/usr/bin:/bin")
    monkeypatch.setenv("FAKE_NVIDIA_SMI_LOG", str(log))
    monkeypatch.delenv("KVGATE_ARCH", raising=False)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(gpu, "PROC_DRIVER_VERSION", tmp_path / "no-proc-driver")

    def gpus(*found: dict) -> None:
        monkeypatch.setenv("FAKE_NVIDIA_SMI", json.dumps(list(found)))

    def calls() -> list[str]:
        return log.read_text().splitlines()

    gpus(H200)
    return gpus, calls


# ------------------------------------------------------------------------------------- CUDA_VISIBLE_DEVICES

@pytest.mark.parametrize(("visible", "arch", "asked"), [
    (None, "sm89", "--query-gpu=compute_cap --format=csv,noheader"),
    ("1,0", "sm90", "--query-gpu=compute_cap --format=csv,noheader -i 1"),
    ("0", "sm89", "--query-gpu=compute_cap --format=csv,noheader -i 0"),
    (H200["uuid"], "sm90", f"--query-gpu=compute_cap --format=csv,noheader -i {H200['uuid']}"),
    (f" {H200['uuid']} ,0", "sm90", f"--query-gpu=compute_cap --format=csv,noheader -i {H200['uuid']}"),
])
def test_the_arch_is_the_first_visible_gpus(fake_smi, monkeypatch, visible, arch, asked):
    gpus, calls = fake_smi
    gpus(L4, H200)
    if visible is not None:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    assert gpu.local_arch() == arch
    assert calls() == [asked]


@pytest.mark.parametrize("visible", ["", "-1", "-1,0"])
def test_no_visible_gpu_is_the_cpu_and_nvidia_smi_is_not_asked(fake_smi, monkeypatch, visible):
    _, calls = fake_smi
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    assert gpu.local_arch() == "cpu"
    assert calls() == []


def test_a_device_nvidia_smi_cannot_name_is_the_hosts_arch_when_all_gpus_are_alike(fake_smi, monkeypatch):
    gpus, calls = fake_smi
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "MIG-5f2c0000-0000-0000-0000-000000000003")
    gpus(H200, H200)
    assert gpu.local_arch() == "sm90"
    gpus(L4, H200)
    assert gpu.local_arch() == "cpu"  # which one is it? kvgate will not guess
    assert calls()[0].endswith("-i MIG-5f2c0000-0000-0000-0000-000000000003")


def test_kvgate_arch_wins_over_the_gpus(fake_smi, monkeypatch):
    _, calls = fake_smi
    monkeypatch.setenv("KVGATE_ARCH", "sm100")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    assert gpu.local_arch() == "sm100"
    assert calls() == []


def test_the_cell_job_counts_only_the_visible_gpus(fake_smi):
    gpus, _ = fake_smi
    gpus(H200, H200, H200, H200)
    cell_job = load_ci_script("cell_job")
    assert cell_job.gpu_count({}) == 4
    assert cell_job.gpu_count({"CUDA_VISIBLE_DEVICES": "2,3"}) == 2
    assert cell_job.gpu_count({"CUDA_VISIBLE_DEVICES": "0,-1,1"}) == 1  # CUDA stops reading at -1
    assert cell_job.gpu_count({"CUDA_VISIBLE_DEVICES": ""}) == 0
    assert cell_job.kernel_workers({"CUDA_VISIBLE_DEVICES": "2,3"}, cell_job.gpu_count({"CUDA_VISIBLE_DEVICES": "2,3"})) == "2"


# ------------------------------------------------------------------------------------------------- driver

OLD_DRIVER_ERROR = (
    "nvidia driver 550.54.15: kvgate's GPU engine (torch 2.11.0+cu130, CUDA 13.0) needs >= 580. Upgrade the "
    "runner's NVIDIA driver to the 580 branch or newer (`nvidia-smi` shows the version), or run the GPU cells "
    "on a runner that has it")


@pytest.mark.parametrize(("version", "ok"), [("580.159.04", True), ("580.65.06", True), ("590.1", True),
                                             ("550.54.15", False), ("575.57.08", False), ("junk", False)])
def test_driver_problem(version, ok):
    assert (gpu.driver_problem(version) is None) is ok


def test_an_old_driver_is_one_error_before_any_gpu_cell(fake_smi):
    gpus, calls = fake_smi
    gpus({**H200, "driver": "550.54.15"})
    with pytest.raises(InputError) as info:
        gpu.check_gpu_driver_for(["sm90", "sm90"], "sm90")
    assert str(info.value) == OLD_DRIVER_ERROR
    assert calls() == ["--query-gpu=driver_version --format=csv,noheader"]


def test_no_driver_check_when_no_gpu_cell_runs_here(fake_smi):
    gpus, calls = fake_smi
    gpus({**H200, "driver": "550.54.15"})
    assert gpu.check_gpu_driver_for(["cpu"], "cpu") is None
    assert gpu.check_gpu_driver_for(["sm100"], "sm90") is None  # those cells skip on this machine
    assert calls() == []


def test_the_driver_of_the_first_visible_gpu_is_asked(fake_smi, monkeypatch):
    gpus, calls = fake_smi
    gpus(L4, H200)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    assert gpu.check_gpu_driver_for(["sm90"], "sm90") is None
    assert calls() == ["--query-gpu=driver_version --format=csv,noheader -i 1"]


# /proc/driver/nvidia/version's first line on the H200 (2026-11-30)
H200_PROC_VERSION = "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release Build  (nixbld@)  \n"


def test_the_kernel_modules_version_line_as_the_h200_writes_it(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no nvidia-smi
    proc = tmp_path / "version"
    proc.write_text(H200_PROC_VERSION)
    monkeypatch.setattr(gpu, "PROC_DRIVER_VERSION", proc)
    assert gpu.driver_version({}) == "580.159.04"
    assert gpu.check_gpu_driver({}) is None


def test_without_nvidia_smi_the_kernel_modules_version_decides(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no nvidia-smi
    proc = tmp_path / "version"
    proc.write_text("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  550.54.15  Release Build  "
                    "(dvs-builder@U16-I3-B03-4-3)  Tue Mar  5 22:15:33 UTC 2024\nGCC version:  gcc version 12.3.0\n")
    monkeypatch.setattr(gpu, "PROC_DRIVER_VERSION", proc)
    assert gpu.driver_version({}) == "550.54.15"
    with pytest.raises(InputError, match=r"^nvidia driver 550\.54\.15: kvgate's GPU engine"):
        gpu.check_gpu_driver({})


def test_an_unreadable_driver_is_a_warning_not_a_guess(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(gpu, "PROC_DRIVER_VERSION", tmp_path / "absent")
    assert gpu.check_gpu_driver_for(["sm90"], "sm90", {}) == (
        f"cannot read the NVIDIA driver version (no nvidia-smi answer, no {tmp_path / 'absent'}); kvgate's GPU "
        "engine (torch 2.11.0+cu130) needs a driver >= 580")


@pytest.mark.parametrize("argv", [
    ["run", "accuracy", "--cell", "triton_mla-fp8-sm90"],
    ["run", "cell", "--cell", "triton_mla-fp8-sm90"],
    ["kernels", "--cell", "triton_mla-fp8-sm90"],
    ["run", "throughput"],  # no filter: this machine's cells
])
def test_kvgate_refuses_to_start_gpu_cells_on_an_old_driver(fake_smi, tmp_path, capsys, argv):
    gpus, _ = fake_smi
    gpus({**H200, "driver": "550.54.15"})
    run_dir = tmp_path / "run"
    assert main([*argv, "--run-dir", str(run_dir)]) == 2
    assert capsys.readouterr().err == f"ERROR {OLD_DRIVER_ERROR}\n"
    assert not run_dir.exists()


def test_the_hardware_module_stays_stdlib_only():
    """The noxfile imports it before anything is installed (kvgate itself is stdlib-only at its root)."""
    import ast

    source = Path(gpu.__file__).read_text(encoding="utf-8")
    imported = {alias.name.split(".")[0] for node in ast.walk(ast.parse(source)) if isinstance(node, ast.Import)
                for alias in node.names}
    imported |= {node.module.split(".")[0] for node in ast.walk(ast.parse(source))
                 if isinstance(node, ast.ImportFrom) and node.module}
    assert imported <= set(sys.stdlib_module_names) | {"kvgate", "__future__"}


def test_nox_refuses_to_build_the_gpu_engine_on_an_old_driver(fake_smi):
    """`nox -s "cell(<id>)"` checks the driver before it installs CUDA 13 wheels (gigabytes) it could not run."""
    import os
    import subprocess

    gpus, _ = fake_smi
    gpus({**H200, "driver": "550.54.15"})
    root = Path(__file__).resolve().parents[1]
    env = {k: v for k, v in os.environ.items() if not k.startswith("KVGATE_")}
    env["PATH"] = f"{os.environ['PATH']}:{Path(sys.executable).parent}"
    result = subprocess.run([sys.executable, "-m", "nox", "-s", "cell(triton_mla-auto-sm90)"], cwd=root, env=env,
                            capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 1, result.stderr[-2000:]
    assert f"Session cell(triton_mla-auto-sm90) aborted: ERROR {OLD_DRIVER_ERROR}" in result.stderr
    assert "building the gpu engine environment" not in result.stderr
