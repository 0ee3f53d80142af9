"""ci/gpu_runner.py: the container each GPU job runs in keeps the runner recipe's promises (ci/README.md)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ci_scripts import load_ci_script

ROOT = Path(__file__).resolve().parents[1]
DIGEST = "registry.example/kvgate-runner@sha256:" + "0" * 64
SETTINGS = {"KVGATE_RUNNER_ORG": "acme", "KVGATE_RUNNER_GROUP_ID": "7", "KVGATE_RUNNER_LABELS": "gpu-sm90,kvgate-pr",
            "KVGATE_RUNNER_IMAGE": DIGEST, "KVGATE_RUNNER_TOKEN_FILE": "/etc/kvgate/token", "KVGATE_RUNNER_GPU": "0",
            "KVGATE_RUNNER_CACHES": "/srv/kvgate/hf:/cache/hf,/srv/kvgate/wheels:/cache/wheels",
            "KVGATE_RUNNER_HF_HOME": "/cache/hf", "KVGATE_RUNNER_NETWORK": "kvgate-github-only"}

gpu_runner = load_ci_script("gpu_runner")


def command() -> list[str]:
    return gpu_runner.container_command(gpu_runner.read_settings(SETTINGS), "kvgate-h200-gpu0-1", "/run/x/jitconfig")


def test_one_fresh_container_per_job_under_a_host_time_cap():
    argv = command()
    assert argv[:3] == ["timeout", "--kill-after=5m", "5h"]
    assert argv[3:6] == ["docker", "run", "--rm"]  # the container and all it wrote go with the job
    # a just-in-time runner (one job), its configuration read from a file inside, never on the host's command line
    assert argv[-4:] == [DIGEST, "sh", "-c", 'exec ./run.sh --jitconfig "$(cat /run/kvgate/jitconfig)"']
    assert argv[argv.index("--gpus") + 1] == "device=0"
    assert argv[argv.index("--security-opt"):argv.index("--security-opt") + 2] == ["--security-opt", "no-new-privileges"]


def test_caches_are_mounted_read_only_and_nothing_else_from_the_host():
    argv = command()
    mounts = [argv[i + 1] for i, a in enumerate(argv) if a in ("--mount", "-v", "--volume")]
    assert mounts == ["type=bind,source=/srv/kvgate/hf,target=/cache/hf,readonly",
                      "type=bind,source=/srv/kvgate/wheels,target=/cache/wheels,readonly",
                      "type=bind,source=/run/x/jitconfig,target=/run/kvgate/jitconfig,readonly"]
    assert "--privileged" not in argv and "--network=host" not in argv


def test_no_token_reaches_the_job(monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_secret")
    monkeypatch.setenv("GITHUB_TOKEN", "ghp_secret")
    argv = command()
    env = [argv[i + 1] for i, a in enumerate(argv) if a in ("-e", "--env")]
    assert env == ["HF_HUB_OFFLINE=1", "HF_DATASETS_OFFLINE=1", "PIP_DISABLE_PIP_VERSION_CHECK=1", "HF_HOME=/cache/hf"]
    assert not any("secret" in a or "TOKEN" in a or a == "--env-file" for a in argv)


def test_the_just_in_time_request_names_the_group_and_labels():
    settings = gpu_runner.read_settings(SETTINGS)
    assert gpu_runner.jit_request(settings, "r1") == (
        "https://api.github.com/orgs/acme/actions/runners/generate-jitconfig",
        {"name": "r1", "runner_group_id": 7, "labels": ["gpu-sm90", "kvgate-pr"], "work_folder": "_work"})


@pytest.mark.parametrize(("change", "message"), [
    ({"KVGATE_RUNNER_IMAGE": "kvgate-runner:latest"},
     "$KVGATE_RUNNER_IMAGE: 'kvgate-runner:latest' is not pinned by digest (name@sha256:...)"),
    ({"KVGATE_RUNNER_CACHES": "/srv/hf"}, "$KVGATE_RUNNER_CACHES: '/srv/hf' is not HOST_DIR:CONTAINER_DIR (absolute paths)"),
    ({"KVGATE_RUNNER_CACHES": "/srv/hf:/cache/hf:rw"},
     "$KVGATE_RUNNER_CACHES: '/srv/hf:/cache/hf:rw' is not HOST_DIR:CONTAINER_DIR (absolute paths)"),
    ({"KVGATE_RUNNER_HF_HOME": "/home/runner/.cache/hf"},
     "$KVGATE_RUNNER_HF_HOME: '/home/runner/.cache/hf' is not one of the read-only caches' container folders "
     "(KVGATE_RUNNER_CACHES)"),
    ({"KVGATE_RUNNER_GROUP_ID": "main"}, "$KVGATE_RUNNER_GROUP_ID: 'main' is not a runner group id (a number)"),
    ({"KVGATE_RUNNER_GROUP_ID": "\u00b2"}, "$KVGATE_RUNNER_GROUP_ID: '\u00b2' is not a runner group id (a number)"),
    ({"KVGATE_RUNNER_GROUP_ID": "7" * 5000},  # a ValueError traceback: int() refuses more than 4300 digits
     f"$KVGATE_RUNNER_GROUP_ID: {'7' * 40!r} is not a runner group id (a number)"),
    ({"KVGATE_RUNNER_ORG": "acme/../../repos/acme/kvgate"},
     "$KVGATE_RUNNER_ORG: 'acme/../../repos/acme/kvgate' is not an organization's login"),
    ({"KVGATE_RUNNER_TIME_CAP": "forever"}, "$KVGATE_RUNNER_TIME_CAP: 'forever' is not a duration (e.g. 5h, 300m)"),
    ({"KVGATE_RUNNER_TOKEN_FILE": ""}, "$KVGATE_RUNNER_TOKEN_FILE: not set (see ci/README.md, \"The runner recipe\")"),
])
def test_bad_settings_are_one_error_line(change, message):
    env = {**os.environ, **SETTINGS, **change}
    result = subprocess.run([sys.executable, "ci/gpu_runner.py", "--dry-run"], cwd=ROOT, env=env, capture_output=True,
                            text=True, check=False)
    assert (result.returncode, result.stderr) == (2, f"ERROR {message}\n")


def test_a_dry_run_prints_the_command_and_asks_github_nothing():
    env = {**os.environ, **SETTINGS, "KVGATE_RUNNER_TOKEN_FILE": "/nonexistent"}
    result = subprocess.run([sys.executable, "ci/gpu_runner.py", "--dry-run"], cwd=ROOT, env=env, capture_output=True,
                            text=True, check=False)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("timeout --kill-after=5m 5h docker run --rm --name kvgate-")
    assert result.stdout.rstrip().endswith(f'{DIGEST} sh -c exec ./run.sh --jitconfig "$(cat /run/kvgate/jitconfig)"')
    assert "source=<file holding the jit config>,target=/run/kvgate/jitconfig,readonly" in result.stdout


def test_the_job_has_no_privilege_and_reaches_only_its_own_network():
    argv = command()

    def value(flag: str) -> str:
        return argv[argv.index(flag) + 1]

    assert value("--cap-drop") == "ALL" and value("--user") == "1001:1001" and value("--pids-limit") == "4096"
    assert value("--network") == "kvgate-github-only"
    proxied = gpu_runner.container_command(gpu_runner.read_settings({**SETTINGS, "KVGATE_RUNNER_PROXY":
                                                                     "http://egress:3128"}), "n", "/f")
    env = [proxied[i + 1] for i, a in enumerate(proxied) if a == "-e"]
    assert "HTTPS_PROXY=http://egress:3128" in env


@pytest.mark.parametrize(("change", "message"), [
    ({"KVGATE_RUNNER_NETWORK": "host"}, "$KVGATE_RUNNER_NETWORK: 'host' is not a network of its own (make one whose "
                                        "only way out is an egress proxy to GitHub: ci/README.md, \"The runner recipe\")"),
    ({"KVGATE_RUNNER_USER": "0:0"}, "$KVGATE_RUNNER_USER: '0:0' is not a non-root UID:GID (e.g. 1001:1001)"),
    ({"KVGATE_RUNNER_PROXY": "evil proxy"}, "$KVGATE_RUNNER_PROXY: 'evil proxy' is not a proxy URL (http://host:port)"),
])
def test_unsafe_container_settings_are_refused(change, message):
    with pytest.raises(gpu_runner.SettingsError) as error:
        gpu_runner.read_settings({**SETTINGS, **change})
    assert str(error.value) == message


def test_no_job_starts_while_a_process_holds_the_gpu():
    settings = gpu_runner.read_settings(SETTINGS)
    answers = iter(["12345, python\n", "12345, python\n", ""])
    calls, sleeps = [], []

    def run(argv, **kwargs):
        calls.append(argv)
        return subprocess.CompletedProcess(argv, 0, next(answers), "")

    assert gpu_runner.wait_until_idle(settings, run=run, sleep=sleeps.append) is True
    assert calls[0] == ["nvidia-smi", "--query-compute-apps=pid,process_name", "--format=csv,noheader", "-i", "0"]
    assert len(calls) == 3 and sleeps == [60, 60]
    failing = lambda argv, **kwargs: subprocess.CompletedProcess(argv, 9, "", "NVML error")  # noqa: E731
    assert gpu_runner.busy_gpu_processes(settings, failing) == ["nvidia-smi exited 9: NVML error"]
    assert gpu_runner.wait_until_idle(settings, run=failing, sleep=lambda s: None, attempts=2) is False


@pytest.mark.parametrize("answer", [b"[]", b'{"encoded_jit_config": null}', b"{}"])
def test_an_odd_jit_answer_is_a_retry_not_a_crash(answer, monkeypatch, tmp_path):
    """GitHub's answer without a configuration raised TypeError/KeyError out of the supervisor's loop only for some
    shapes (a list: TypeError, which main did not catch); each is now a ValueError, which it retries."""
    import io

    token = tmp_path / "token"
    token.write_text("t")
    settings = gpu_runner.read_settings({**SETTINGS, "KVGATE_RUNNER_TOKEN_FILE": str(token)})
    monkeypatch.setattr(gpu_runner.urllib.request, "urlopen", lambda request, timeout: io.BytesIO(answer))
    with pytest.raises(ValueError, match="holds no encoded_jit_config"):
        gpu_runner.request_jit_config(settings, "kvgate-host-gpu0-1")
