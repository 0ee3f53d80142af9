"""The GPU runner host's supervisor: one fresh container per job, from a just-in-time runner (ci/README.md).

    KVGATE_RUNNER_ORG=acme KVGATE_RUNNER_GROUP_ID=7 KVGATE_RUNNER_LABELS=gpu-sm90,kvgate-pr \
    KVGATE_RUNNER_IMAGE=registry/kvgate-runner@sha256:... KVGATE_RUNNER_TOKEN_FILE=/etc/kvgate/token \
    KVGATE_RUNNER_GPU=0 python3 ci/gpu_runner.py [--once] [--dry-run]

Runs on the host, outside any job, as a service. Each round: ask GitHub for a just-in-time runner configuration
(one job, then the runner is gone), start a new container from the pinned image with only that configuration,
wait for it under a hard time cap, and let `docker run --rm` remove it with everything the job wrote and started.
What the recipe promises, and this builds:
  - a fresh container per job: nothing a job writes survives it (tool-cache Python, ~/.cache, .git/hooks,
    processes): `docker run --rm` drops the container's writable layer, and the image is pinned by digest;
  - caches pre-filled by a trusted maintenance job and mounted read-only (KVGATE_RUNNER_CACHES: host:container);
  - no hub token and no GitHub credential inside: the environment passed in is a fixed list, the token that may
    create runners is read by this supervisor from a file the container never sees;
  - a time cap on the host (`timeout`), whatever the workflow's timeout-minutes says;
  - idle GPUs before each job (`nvidia-smi --query-compute-apps`): none starts while a process holds them;
  - no way out but to GitHub: the container joins KVGATE_RUNNER_NETWORK, a docker network the operator makes with
    no route out except an egress proxy that allows GitHub's hosts (KVGATE_RUNNER_PROXY); models and datasets were
    prefetched into the read-only caches, so an engine never needs the hub;
  - no privilege: every capability dropped, a non-root user (KVGATE_RUNNER_USER, default 1001:1001), a pids limit;
  - the runner's just-in-time configuration (a credential of that one job) in a file mounted read-only, never on a
    command line the host's process list shows.
`--dry-run` prints the container command (with the runner configuration elided) and asks GitHub nothing.
Stdlib only. Exit 2 with one `ERROR` line on bad settings.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

API = "https://api.github.com"
# The only variables a job's container gets; never a token, never the host's environment.
JOB_ENVIRONMENT = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
DEFAULT_TIME_CAP = "5h"
DEFAULT_USER = "1001:1001"
PIDS_LIMIT = "4096"
JIT_CONFIG_INSIDE = "/run/kvgate/jitconfig"
_LABEL = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
_IMAGE_DIGEST = re.compile(r"[^@\s]+@sha256:[0-9a-f]{64}")
_TIME = re.compile(r"[0-9]+[smhd]")
_ORG = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,38})")


class SettingsError(Exception):
    """Bad supervisor settings; printed as one `ERROR` line, exit status 2."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Settings:
    org: str
    group_id: int
    labels: tuple[str, ...]
    image: str
    token_file: str
    gpu: str
    caches: tuple[tuple[str, str], ...] = ()
    time_cap: str = DEFAULT_TIME_CAP
    hf_home: str = ""
    name_prefix: str = "kvgate"
    network: str = ""
    proxy: str = ""
    user: str = DEFAULT_USER


def read_settings(environ: Mapping[str, str]) -> Settings:
    def need(name: str) -> str:
        value = environ.get(name, "").strip()
        if not value:
            raise SettingsError(f"${name}: not set (see ci/README.md, \"The runner recipe\")")
        return value

    org = need("KVGATE_RUNNER_ORG")
    if not _ORG.fullmatch(org):  # it goes into the API's path: `acme/../..` would send the token's request elsewhere
        raise SettingsError(f"$KVGATE_RUNNER_ORG: {org[:40]!r} is not an organization's login")
    group = need("KVGATE_RUNNER_GROUP_ID")
    if not re.fullmatch(r"[0-9]{1,18}", group):  # str.isdigit() takes '²', and int() more than 4300 digits: refused
        raise SettingsError(f"$KVGATE_RUNNER_GROUP_ID: {group[:40]!r} is not a runner group id (a number)")
    labels = tuple(label.strip() for label in need("KVGATE_RUNNER_LABELS").split(",") if label.strip())
    bad = [label for label in labels if not _LABEL.fullmatch(label)]
    if bad or not labels:
        raise SettingsError(f"$KVGATE_RUNNER_LABELS: {(bad or [''])[0][:40]!r} is not a runner label")
    image = need("KVGATE_RUNNER_IMAGE")
    if not _IMAGE_DIGEST.fullmatch(image):
        raise SettingsError(f"$KVGATE_RUNNER_IMAGE: {image[:80]!r} is not pinned by digest (name@sha256:...)")
    gpu = need("KVGATE_RUNNER_GPU")
    if not re.fullmatch(r"[0-9]+(,[0-9]+)*", gpu):
        raise SettingsError(f"$KVGATE_RUNNER_GPU: {gpu[:40]!r} is not a GPU index list (0, or 0,1)")
    caches = []
    for item in environ.get("KVGATE_RUNNER_CACHES", "").split(","):
        if not item.strip():
            continue
        host, sep, inside = item.strip().partition(":")
        if not sep or not host.startswith("/") or not inside.startswith("/") or ":" in inside:
            raise SettingsError(f"$KVGATE_RUNNER_CACHES: {item[:80]!r} is not HOST_DIR:CONTAINER_DIR (absolute paths)")
        caches.append((host, inside))
    time_cap = environ.get("KVGATE_RUNNER_TIME_CAP", DEFAULT_TIME_CAP).strip()
    if not _TIME.fullmatch(time_cap):
        raise SettingsError(f"$KVGATE_RUNNER_TIME_CAP: {time_cap[:20]!r} is not a duration (e.g. 5h, 300m)")
    hf_home = environ.get("KVGATE_RUNNER_HF_HOME", "").strip()
    if hf_home and hf_home not in {inside for _, inside in caches}:
        raise SettingsError(f"$KVGATE_RUNNER_HF_HOME: {hf_home[:80]!r} is not one of the read-only caches' "
                            "container folders (KVGATE_RUNNER_CACHES)")
    network = need("KVGATE_RUNNER_NETWORK")
    if not _LABEL.fullmatch(network) or network in ("host", "bridge", "default"):
        raise SettingsError(f"$KVGATE_RUNNER_NETWORK: {network[:40]!r} is not a network of its own (make one whose only "
                            "way out is an egress proxy to GitHub: ci/README.md, \"The runner recipe\")")
    proxy = environ.get("KVGATE_RUNNER_PROXY", "").strip()
    if proxy and not re.fullmatch(r"https?://[A-Za-z0-9.-]+(:[0-9]+)?/?", proxy):
        raise SettingsError(f"$KVGATE_RUNNER_PROXY: {proxy[:80]!r} is not a proxy URL (http://host:port)")
    user = environ.get("KVGATE_RUNNER_USER", DEFAULT_USER).strip()
    if not re.fullmatch(r"[1-9][0-9]*:[1-9][0-9]*", user):
        raise SettingsError(f"$KVGATE_RUNNER_USER: {user[:40]!r} is not a non-root UID:GID (e.g. 1001:1001)")
    return Settings(org=org, group_id=int(group), labels=labels, image=image,
                    token_file=need("KVGATE_RUNNER_TOKEN_FILE"), gpu=gpu, caches=tuple(caches), time_cap=time_cap,
                    hf_home=hf_home, network=network, proxy=proxy, user=user)


def jit_request(settings: Settings, name: str) -> tuple[str, dict[str, object]]:
    """The REST call that makes a just-in-time runner: (URL, JSON body)."""
    return (f"{API}/orgs/{settings.org}/actions/runners/generate-jitconfig",
            {"name": name, "runner_group_id": settings.group_id, "labels": list(settings.labels),
             "work_folder": "_work"})


def container_command(settings: Settings, name: str, jit_config_file: str) -> list[str]:
    """`timeout ... docker run --rm ...` for one job: a new container (its writable layer goes with it), read-only
    caches, a fixed environment with no secret in it, no capability, a non-root user, a pids limit, a network that
    reaches only GitHub, the just-in-time configuration read from a file, a hard time cap."""
    argv = ["timeout", "--kill-after=5m", settings.time_cap, "docker", "run", "--rm", "--name", name,
            "--gpus", f"device={settings.gpu}", "--tmpfs", "/tmp:exec", "--security-opt", "no-new-privileges",
            "--cap-drop", "ALL", "--user", settings.user, "--pids-limit", PIDS_LIMIT, "--network", settings.network]
    for host, inside in settings.caches:
        argv += ["--mount", f"type=bind,source={host},target={inside},readonly"]
    argv += ["--mount", f"type=bind,source={jit_config_file},target={JIT_CONFIG_INSIDE},readonly"]
    environment = {**JOB_ENVIRONMENT, **({"HF_HOME": settings.hf_home} if settings.hf_home else {})}
    if settings.proxy:
        environment.update({"HTTPS_PROXY": settings.proxy, "HTTP_PROXY": settings.proxy, "NO_PROXY": "localhost"})
    for key, value in environment.items():
        argv += ["-e", f"{key}={value}"]
    return [*argv, settings.image, "sh", "-c", f'exec ./run.sh --jitconfig "$(cat {JIT_CONFIG_INSIDE})"']


def runner_name(settings: Settings, now: float, host: str) -> str:
    return f"{settings.name_prefix}-{host}-gpu{settings.gpu.replace(',', '_')}-{int(now)}"


def busy_gpu_processes(settings: Settings, run=subprocess.run) -> list[str]:
    """The compute processes on the job's GPUs (`nvidia-smi --query-compute-apps`); ["nvidia-smi: ..."] when it
    cannot answer (a GPU that cannot be checked counts as busy)."""
    argv = ["nvidia-smi", "--query-compute-apps=pid,process_name", "--format=csv,noheader", "-i", settings.gpu]
    try:
        result = run(argv, capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.SubprocessError) as error:
        return [f"nvidia-smi: {error}"]
    if result.returncode != 0:
        return [f"nvidia-smi exited {result.returncode}: {(result.stderr or '').strip()[:200]}"]
    return [line.strip() for line in result.stdout.splitlines() if line.strip()]


def wait_until_idle(settings: Settings, *, run=subprocess.run, sleep=time.sleep, attempts: int = 30) -> bool:
    """True once the job's GPUs hold no compute process; False after `attempts` checks a minute apart."""
    for _ in range(attempts):
        busy = busy_gpu_processes(settings, run)
        if not busy:
            return True
        print(f"kvgate runner: GPU {settings.gpu} is not idle ({'; '.join(busy)[:300]}); no job starts until it is",
              file=sys.stderr, flush=True)
        sleep(60)
    return False


def request_jit_config(settings: Settings, name: str) -> str:
    url, body = jit_request(settings, name)
    with open(settings.token_file, encoding="utf-8") as handle:
        token = handle.read().strip()
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST", headers={
        "Authorization": f"Bearer {token}", "Accept": "application/vnd.github+json",
        "X-GitHub-Api-Version": "2022-11-28"})
    with urllib.request.urlopen(request, timeout=60) as response:
        answer = json.load(response)
    config = answer.get("encoded_jit_config") if isinstance(answer, dict) else None
    if not isinstance(config, str) or not config:
        raise ValueError("GitHub's answer holds no encoded_jit_config")
    return config


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        settings = read_settings(os.environ)
    except SettingsError as error:
        print(f"ERROR {error}", file=sys.stderr)
        return 2
    host = os.uname().nodename.split(".")[0]
    while True:
        name = runner_name(settings, time.time(), host)
        if "--dry-run" in args:
            print(" ".join(container_command(settings, name, "<file holding the jit config>")))
            return 0
        if not wait_until_idle(settings):  # a process left on the GPU would share the next job's: none starts
            print(f"kvgate runner: GPU {settings.gpu} stayed busy; giving up (the service manager restarts this)",
                  file=sys.stderr, flush=True)
            return 1
        try:
            config = request_jit_config(settings, name)
        except (OSError, ValueError, KeyError) as error:
            print(f"kvgate runner: no just-in-time configuration ({error}); retrying in 60 s", file=sys.stderr)
            time.sleep(60)
            continue
        with tempfile.TemporaryDirectory(prefix="kvgate-runner-") as folder:  # 0700: no other host user reads it
            config_file = os.path.join(folder, "jitconfig")
            with open(os.open(config_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644), "w", encoding="utf-8") as f:
                f.write(config)
            status = subprocess.run(container_command(settings, name, config_file), check=False).returncode
        print(f"kvgate runner: {name} ended with status {status}", flush=True)
        if "--once" in args:
            return 0


if __name__ == "__main__":
    sys.exit(main())
