"""kvgate.runners.hardware: the arch of the GPU the engine will use (CUDA_VISIBLE_DEVICES honoured), against a
fake nvidia-smi that answers like the real one."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from ci_scripts import load_ci_script
from kvgate.runners import hardware

L4 = {"uuid": "GPU-4c1a0d6e-0000-0000-0000-000000000001", "cap": "8.9", "driver": "580.159.04"}
H200 = {"uuid": "GPU-9e2b7f30-0000-0000-0000-000000000002", "cap": "9.0", "driver": "580.159.04"}

FAKE_SMI = r'''#!{python}
"""nvidia-smi as kvgate calls it: --query-gpu=FIELD --format=csv,noheader [-i INDEX|UUID], and -L."""
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
    assert hardware.local_arch() == arch
    assert calls() == [asked]


@pytest.mark.parametrize("visible", ["", "-1", "-1,0"])
def test_no_visible_gpu_is_the_cpu_and_nvidia_smi_is_not_asked(fake_smi, monkeypatch, visible):
    _, calls = fake_smi
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    assert hardware.local_arch() == "cpu"
    assert calls() == []


def test_a_device_nvidia_smi_cannot_name_is_the_hosts_arch_when_all_gpus_are_alike(fake_smi, monkeypatch):
    gpus, calls = fake_smi
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "MIG-5f2c0000-0000-0000-0000-000000000003")
    gpus(H200, H200)
    assert hardware.local_arch() == "sm90"
    gpus(L4, H200)
    assert hardware.local_arch() == "cpu"  # which one is it? kvgate will not guess
    assert calls()[0].endswith("-i MIG-5f2c0000-0000-0000-0000-000000000003")


def test_kvgate_arch_wins_over_the_gpus(fake_smi, monkeypatch):
    _, calls = fake_smi
    monkeypatch.setenv("KVGATE_ARCH", "sm100")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    assert hardware.local_arch() == "sm100"
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


def test_the_hardware_module_stays_stdlib_only():
    """The noxfile imports it before anything is installed (kvgate itself is stdlib-only at its root)."""
    import ast

    source = Path(hardware.__file__).read_text(encoding="utf-8")
    imported = {alias.name.split(".")[0] for node in ast.walk(ast.parse(source)) if isinstance(node, ast.Import)
                for alias in node.names}
    imported |= {node.module.split(".")[0] for node in ast.walk(ast.parse(source))
                 if isinstance(node, ast.ImportFrom) and node.module}
    assert imported <= set(sys.stdlib_module_names) | {"kvgate", "__future__"}

