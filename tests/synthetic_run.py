"""Write results folders in the contract's format (docs/results-folder.md) from chosen per-question outcomes.

For the gate's tests and benchmarks (it is not part of the kvgate package), and for anyone who wants to see
what the gate does with given figures: the files have the shapes lm-eval 0.4.13, `vllm bench throughput` and pytest --junitxml write (keys,
nesting under a model-name folder, one sample line per document and filter), with made-up content.
"""

from __future__ import annotations

import functools
import hashlib
import json
import random
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from statistics import NormalDist
from typing import Any

import numpy as np
from junitparser import Failure, JUnitXml, TestCase, TestSuite

from kvgate.gate import question_plan
from kvgate.gate.policy import Policy
from kvgate.gate.policy import load as load_policy
from kvgate.matrix.cells import Matrix, cell_id
from kvgate.matrix.cells import load as load_matrix

SEED_MODEL = "deepseek-ai/DeepSeek-V2-Lite-Chat"
GSM8K_FILTERS = ("strict-match", "flexible-extract")
_FEWSHOT = ("Question: Natalia sold clips to 48 of her friends in April, and then she sold half as many clips "
            "in May. How many clips did Natalia sell altogether in April and May?\nAnswer: Natalia sold 48/2 = "
            "<<48/2=24>>24 clips in May.\nNatalia sold 48+24 = <<48+24=72>>72 clips altogether in April and May."
            "\n#### 72\n\n")


def paired_outcomes(n: int, *, reference_correct: int, only_reference: int, only_candidate: int,
                    seed: int = 0) -> tuple[list[bool], list[bool]]:
    """Per-question outcomes of two runs with exactly these counts (shuffled with `seed`)."""
    both = reference_correct - only_reference
    if both < 0 or both + only_reference + only_candidate > n:
        raise ValueError("impossible counts")
    pairs = ([(True, True)] * both + [(True, False)] * only_reference + [(False, True)] * only_candidate
             + [(False, False)] * (n - both - only_reference - only_candidate))
    random.Random(seed).shuffle(pairs)
    return [p[0] for p in pairs], [p[1] for p in pairs]


@functools.cache
def shipped_matrix() -> Matrix:
    return load_matrix()


@functools.cache
def shipped_policy() -> Policy:
    return load_policy(matrix=shipped_matrix())


def write_cell(run_dir: Path, *, backend: str, kv_cache_dtype: str, arch: str, model: str | None = None,
               task: str | None = None, folder: str | None = None, extra: Mapping[str, Any] | None = None,
               feature: str = "") -> Path:
    """cell.json as kvgate's runners write it for the shipped matrix's cell (model, task, workload, the FP8 cell's
    k/v scale settings: what the gate holds a folder to); `model`, `task` and `extra` write something else. A cell
    the matrix does not have gets the model and task of its backend on its arch, else SEED_MODEL on gsm8k."""
    cell_dir = Path(run_dir) / (folder or cell_id(backend, kv_cache_dtype, arch, feature))
    cell_dir.mkdir(parents=True, exist_ok=True)
    cells = shipped_matrix().cells
    declared = next((c for c in cells if c.id == cell_id(backend, kv_cache_dtype, arch, feature)), None)
    sibling = next((c for c in cells if (c.backend, c.arch) == (backend, arch)), None)  # another dtype of the cell
    record = {"contract_version": 1, **(declared.as_record() if declared is not None else
                                        {"backend": backend, "kv_cache_dtype": kv_cache_dtype, "arch": arch,
                                         "model": sibling.model if sibling else SEED_MODEL,
                                         "task": str(sibling.workload.gsm8k["task"]) if sibling else "gsm8k",
                                         "cell_id": cell_id(backend, kv_cache_dtype, arch)})}
    record.update({key: value for key, value in (("model", model), ("task", task)) if value is not None})
    record.update(extra or {})
    (cell_dir / "cell.json").write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    return cell_dir


def matrix_cell(record: Mapping[str, Any]) -> Any:
    """The shipped matrix's cell a cell.json names (None when it names none of them)."""
    wanted = cell_id(str(record.get("backend", "")), str(record.get("kv_cache_dtype", "")), str(record.get("arch", "")))
    return next((c for c in shipped_matrix().cells if c.id == wanted), None)


def cell_record(cell_dir: Path) -> dict[str, Any]:
    path = Path(cell_dir) / "cell.json"
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}


def write_accuracy(cell_dir: Path, outcomes: Mapping[str, Sequence[bool]], *, task: str | None = None,
                   model: str | None = None, samples: bool = True, prompt_chars: int = 400,
                   prompt_salt: str = "", stamp: str = "2026-11-30T10-00-00.000000",
                   question_ids: Sequence[int] | None = None, without_doc_hash: Collection[int] = (),
                   stage: str = "accuracy") -> Path:
    """accuracy/<model folder>/results_<stamp>.json (+ samples_<task>_<stamp>.jsonl) from outcomes per filter.

    question_ids: which questions the outcomes belong to, in the order asked (default 0 .. n-1): the question
    decides doc_hash and the prompt, the position doc_id (lm-eval numbers the documents it was given).
    without_doc_hash: questions whose records carry no doc_hash (readers then key them by doc_id).
    task and model: the cell.json's (else gsm8k, SEED_MODEL). stage: the stage folder (long_context: kvgate's passkey
    task, contract 1.10, whose n-shot is 0)."""
    record = cell_record(cell_dir)
    task = task or str(record.get("task", "gsm8k"))
    model = model or str(record.get("model", SEED_MODEL))
    declared = matrix_cell(record)
    shots = int(declared.workload.gsm8k["num_fewshot"]) if declared is not None else 5
    shots = 0 if stage == "long_context" else shots
    folder = Path(cell_dir) / stage / model.replace("/", "__")
    folder.mkdir(parents=True, exist_ok=True)
    n = len(next(iter(outcomes.values())))
    if n < 1:  # lm-eval refuses a task with no documents ("did not find any docs") and writes no results
        raise ValueError("lm-eval writes no results for 0 questions")
    block: dict[str, Any] = {"name": task, "alias": task, "sample_len": n}
    for name, values in outcomes.items():
        mean = sum(values) / n
        block[f"exact_match,{name}"] = mean
        # lm-eval's stderr of one sample is undefined: it writes "N/A"
        block[f"exact_match_stderr,{name}"] = (mean * (1 - mean) / (n - 1)) ** 0.5 if n > 1 else "N/A"
    results = {
        "results": {task: block}, "group_subtasks": {task: []}, "configs": {task: {"task": task}},
        "versions": {task: 3.0}, "n-shot": {task: shots}, "higher_is_better": {task: {"exact_match": True}},
        "n-samples": {task: {"original": n, "effective": n}},
        "config": {"model": "vllm", "model_args": {"pretrained": model}, "batch_size": "auto", "limit": None},
        "lm_eval_version": "0.4.13", "model_name": model, "model_name_sanitized": model.replace("/", "__"),
    }
    (folder / f"results_{stamp}.json").write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    if samples:
        lines = []
        padding = (_FEWSHOT * (prompt_chars // len(_FEWSHOT) + 1))[:prompt_chars]
        ids = list(question_ids) if question_ids is not None else list(range(n))
        if len(ids) != n:
            raise ValueError(f"{len(ids)} question ids for {n} outcomes")
        for doc_id, question_id in enumerate(ids):
            question = f"Question {question_id}: how many apples are left?"
            doc_hash = hashlib.sha256(question.encode()).hexdigest()
            prompt = f"{padding}Question: {question}\nAnswer:"
            prompt_hash = hashlib.sha256((prompt + prompt_salt).encode()).hexdigest()
            for name, values in outcomes.items():
                correct = bool(values[doc_id])
                record = {
                    "doc_id": doc_id, "doc": {"question": question, "answer": f"... #### {doc_id}"},
                    "target": f"... #### {doc_id}",
                    "arguments": {"gen_args_0": {"arg_0": prompt, "arg_1": {"until": ["Question:"], "do_sample": False}}},
                    "resps": [[f" The answer is {doc_id if correct else -1}.\n#### {doc_id if correct else -1}"]],
                    "filtered_resps": [str(doc_id if correct else -1)], "filter": name, "metrics": ["exact_match"],
                    "doc_hash": doc_hash, "prompt_hash": prompt_hash, "target_hash": doc_hash[::-1],
                    "exact_match": 1.0 if correct else 0.0}
                if question_id in without_doc_hash:
                    del record["doc_hash"]
                lines.append(json.dumps(record))
        (folder / f"samples_{task}_{stamp}.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return folder


def write_throughput(cell_dir: Path, requests_per_second: Sequence[float], *, num_requests: int | None = None,
                     input_len: int = 8192, output_len: int = 1024) -> Path:
    """throughput/repeat-N.json and .log, as `vllm bench throughput --output-json` and its stdout; num_requests: the
    matrix's num_prompts for the cell (else 100)."""
    if num_requests is None:
        declared = matrix_cell(cell_record(cell_dir))
        num_requests = int(declared.workload.throughput.get("num_prompts", 100)) if declared is not None else 100
    folder = Path(cell_dir) / "throughput"
    folder.mkdir(parents=True, exist_ok=True)
    for index, rps in enumerate(requests_per_second, start=1):
        elapsed = num_requests / rps
        total = num_requests * (input_len + output_len)
        data = {"model_id": "model", "elapsed_time": elapsed, "num_requests": num_requests, "total_num_tokens": total,
                "requests_per_second": rps, "tokens_per_second": total / elapsed}
        (folder / f"repeat-{index}.json").write_text(json.dumps(data, indent=4), encoding="utf-8")
        output_tps = num_requests * output_len / elapsed
        (folder / f"repeat-{index}.log").write_text(
            f"Throughput: {rps:.2f} requests/s, {total / elapsed:.2f} total tokens/s, {output_tps:.2f} output tokens/s\n"
            f"Total num prompt tokens:  {num_requests * input_len}\nTotal num output tokens:  {num_requests * output_len}\n",
            encoding="utf-8")
    return folder


def write_kernels(cell_dir: Path, *, passed: int = 4, failed: Sequence[str] = (), skipped: int = 0) -> Path:
    """kernels/junit.xml with these outcomes, written by junitparser (the shape pytest --junitxml has)."""
    folder = Path(cell_dir) / "kernels"
    folder.mkdir(parents=True, exist_ok=True)
    suite = TestSuite("pytest")
    for index in range(passed):
        suite.add_testcase(TestCase(f"test_decode[{index}]", classname="tests.kernels.test_decode"))
    for name in failed:
        case = TestCase(name, classname="tests.kernels.test_decode")
        case.result = [Failure("AssertionError: max abs error 0.31 > 0.05")]
        suite.add_testcase(case)
    for index in range(skipped):
        from junitparser import Skipped

        case = TestCase(f"test_skipped[{index}]", classname="tests.kernels.test_decode")
        case.result = [Skipped("needs another arch")]
        suite.add_testcase(case)
    suite.update_statistics()
    xml = JUnitXml("pytest tests")
    xml.add_testsuite(suite)
    xml.write(str(folder / "junit.xml"))
    return folder / "junit.xml"


def write_status(cell_dir: Path, entries: Mapping[str, Mapping[str, Any]]) -> None:
    (Path(cell_dir) / "status.json").write_text(json.dumps(entries, indent=2) + "\n", encoding="utf-8")


# ---------------------------------------------------------------------------------------------- the seed case

SEED_N = 1319
# auto strict 850/1319 = 0.6444, flexible 860/1319 = 0.6520; fp8 826 = 0.6262 and 842 = 0.6384.
SEED_COUNTS = {"strict-match": (850, 78, 54), "flexible-extract": (860, 69, 51)}  # (auto right, only auto, only fp8)


def planned_questions(backend: str, kv_cache_dtype: str, arch: str) -> int:
    """The questions the shipped policy plans for the matrix's cell of a compared run (an A/B run, a gate that
    requires a baseline): what the gate holds such a run to (kvgate.gate.question_plan)."""
    cell = next(c for c in shipped_matrix().cells if c.id == cell_id(backend, kv_cache_dtype, arch))
    return question_plan.plan(shipped_policy(), arch=arch, task=str(cell.workload.gsm8k["task"]), model=cell.model,
                              ab=True).questions


def write_seed_run(run_dir: Path, *, fp8_drop_points: float | None = None, samples: bool = True,
                   backend: str = "FLASHINFER_MLA", arch: str = "sm100", probes: bool = False,
                   contract: str | None = None, n: int = SEED_N, long_context: bool | None = None) -> Path:
    """The seed PR's case: auto vs fp8 on gsm8k (n=1319) and 3.22 -> 3.55 req/s (medians of 7 repeats), one cell each.

    fp8_drop_points, when given, replaces the FP8 figures by a drop of about that many points on both filters.
    probes: also the probe stage a real cell job writes with its accuracy stage (agreeing logprobs).
    contract: the cell.json contract_version (default 1); from "1.4" on, status.json holds what a runner of that
    contract records (the FP8 cell's KV cache evidence).
    n: the questions (default the seed's 1319, all of lm-eval's gsm8k; the counts scale with it): a run compared under
    --require-baseline needs planned_questions() of the matrix's cell.
    long_context: also the passkey task's long_context/ (200 documents, the two sides agreeing but on 2 each way), as a
    runner of contract 1.10 writes it for a workload that declares the task (default: from contract 1.10 on).
    """
    run_dir = Path(run_dir)
    # the policy's 7 repeats a cell (throughput.rounds: what --require-baseline holds a run to)
    for dtype, rps in (("auto", (3.21, 3.22, 3.24, 3.22, 3.21, 3.23, 3.22)),
                       ("fp8", (3.53, 3.55, 3.56, 3.55, 3.54, 3.56, 3.55))):
        cell = write_cell(run_dir, backend=backend, kv_cache_dtype=dtype, arch=arch,
                          extra={"contract_version": contract} if contract else None)
        if contract and contract != "1" and tuple(map(int, contract.split("."))) >= (1, 4):
            evidence = {"element_bytes": [1 if dtype == "fp8" else 2],
                        "layer_kv_cache_dtypes": [dtype], "tokens": 200_000 if dtype == "fp8" else 100_000}
            if tuple(map(int, contract.split("."))) >= (1, 9):  # DeepSeek-V2-Lite: 27 MLA layers of 576 a token
                evidence["bytes_per_token"] = 27 * 576 * (1 if dtype == "fp8" else 2)
            entries: dict[str, Any] = {"accuracy": {"status": "ok", "kv_cache": evidence}}
            if long_context is not False and tuple(map(int, contract.split("."))) >= (1, 10):
                entries["long_context"] = {"status": "ok", "lengths": [4096, 8192, 16384, 32768]}
            write_status(cell, entries)
        outcomes = {}
        for index, (name, counts) in enumerate(SEED_COUNTS.items()):
            auto_right, only_auto, only_fp8 = (round(count * n / SEED_N) for count in counts)
            if fp8_drop_points is not None:
                drop = round(fp8_drop_points / 100 * n)
                only_fp8 = round(30 * n / SEED_N)
                only_auto = drop + only_fp8
            auto, fp8 = paired_outcomes(n, reference_correct=auto_right, only_reference=only_auto,
                                        only_candidate=only_fp8, seed=index)
            outcomes[name] = auto if dtype == "auto" else fp8
        write_accuracy(cell, outcomes, samples=samples)
        with_task = long_context if long_context is not None else bool(
            contract and contract != "1" and tuple(map(int, contract.split("."))) >= (1, 10))
        if with_task:
            auto_passkey, fp8_passkey = paired_outcomes(200, reference_correct=180, only_reference=2, only_candidate=2)
            passkey = auto_passkey if dtype == "auto" else fp8_passkey
            write_accuracy(cell, {name: passkey for name in GSM8K_FILTERS}, task="kvgate_passkey",
                           stage="long_context")
        write_throughput(cell, rps)
        write_kernels(cell)
        if probes:
            write_probe(cell, shift=0.01 if dtype == "fp8" else 0.0)
    return run_dir


def write_probe(cell_dir: Path, *, shift: float = 0.0, flip_every: int = 0, prompts: int = 4,
                length: int = 12, generated: int = 2, decode_shift: float = 0.0,
                diverge_at: int | None = None) -> Path:
    """probe/probe.json in kvgate's probe format: prompt logprobs moved by `shift`, and the top-1 token
    changed at every `flip_every`-th position (0: never), against the same record with shift 0; `generated` greedy
    tokens whose logprobs move by `decode_shift` and which take another token from index `diverge_at` on."""
    items = []
    for p in range(prompts):
        ids = [(p * 7 + i) % 500 + 4 for i in range(length)]
        logprobs: list[Any] = [None]
        top: list[Any] = [None]
        for i in range(1, length):
            value = -1.0 - 0.1 * i - shift * (1 if i % 2 else -1)
            logprobs.append(value)
            best = ids[i] if not (flip_every and i % flip_every == 0) else (ids[i] + 1) % 500
            top.append([[best, value]])
        tokens = [5 + i if diverge_at is None or i < diverge_at else 300 + i for i in range(generated)]
        values = [-0.5 - 0.1 * i - decode_shift * (1 if i % 2 else -1) for i in range(generated)]
        items.append({"prompt": f"prompt {p}", "prompt_token_ids": ids, "prompt_logprobs": logprobs,
                      "prompt_top": top, "generated_token_ids": tokens, "generated_logprobs": values,
                      "generated_top": [[[t, v]] for t, v in zip(tokens, values, strict=True)],
                      "generated_text": "ab"})
    record = {"format": "kvgate-probe", "version": 1, "settings": {"max_tokens": generated, "top_k": 1}, "engine": {},
              "prompts": items}
    folder = Path(cell_dir) / "probe"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "probe.json").write_text(json.dumps(record), encoding="utf-8")
    return folder / "probe.json"


# ---------------------------------------------------------------------------------------------- a question model

def _logistic(x: np.ndarray) -> np.ndarray:
    return np.exp(-np.logaddexp(0.0, -x))


def _solve_increasing(f: Callable[[float], float], low: float, high: float) -> float:
    for _ in range(100):
        mid = 0.5 * (low + high)
        low, high = (mid, high) if f(mid) < 0 else (low, mid)
    return 0.5 * (low + high)


@dataclass(frozen=True)
class QuestionModel:
    """Per-question outcomes of compared runs, with difficulty, noise flips and the regression kept apart.

    - difficulty: question i has p_i = logistic(mu + difficulty_sd z_i) (z_i evenly spread normal scores, mu
      solved so that mean p = accuracy); the configuration's typical answer A_i ~ Bernoulli(p_i) is drawn once
      per question set (`seed`): questions are reliably right, reliably wrong, or in between;
    - noise flips: every run flips question i's outcome away from A_i with probability phi_i, independently;
      phi_i is proportional to p_i (1 - p_i) ("fragile": middling questions flip) or equal for all ("uniform"),
      scaled so that two runs of unchanged code disagree on a share `flips` of the questions;
    - regression: the candidate run additionally loses each right answer with probability drop / accuracy after
      noise (so the expected drop is exactly `drop` points), on any question ("uniform") or on fragile ones.
    """

    n: int
    accuracy: float = 0.65
    difficulty_sd: float = 2.0
    flips: float = 0.10
    flip_model: str = "fragile"
    regression_model: str = "uniform"
    seed: int = 0

    def __post_init__(self) -> None:
        if self.n < 1:
            raise ValueError(f"a question set needs at least 1 question, got {self.n}")
        if self.flip_model not in ("fragile", "uniform") or self.regression_model not in ("fragile", "uniform"):
            raise ValueError("flip_model and regression_model are 'fragile' or 'uniform'")

    def questions(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(typical answers A, flip probabilities phi, regression weights) for the question set."""
        rng = np.random.default_rng(self.seed)
        z = np.array([NormalDist().inv_cdf((i + 0.5) / self.n) for i in range(self.n)])
        rng.shuffle(z)
        mu = _solve_increasing(lambda m: float(_logistic(m + self.difficulty_sd * z).mean()) - self.accuracy,
                               -50, 50)
        p = _logistic(mu + self.difficulty_sd * z)
        typical = rng.random(self.n) < p
        weight = p * (1 - p) if self.flip_model == "fragile" else np.ones(self.n)
        weight = weight / weight.mean()

        def discordance(scale: float) -> float:
            phi = np.minimum(scale * weight, 0.5)
            return float((2 * phi * (1 - phi)).mean())

        if self.flips > 0:
            if discordance(1e6) < self.flips:
                raise ValueError(f"no flip scale gives {self.flips} discordance with this question set")
            phi = np.minimum(_solve_increasing(lambda s: discordance(s) - self.flips, 0.0, 1e6) * weight, 0.5)
        else:
            phi = np.zeros(self.n)
        regression = p * (1 - p) if self.regression_model == "fragile" else np.ones(self.n)
        return typical, phi, regression / regression.mean()

    def runs(self, runs: int, *, drop_points: float = 0.0, rng: np.random.Generator,
             questions: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(reference, candidate) outcomes, shape (runs, n): independent noise, the regression on the candidate."""
        typical, phi, regression = questions or self.questions()
        reference = typical ^ (rng.random((runs, self.n), dtype=np.float32) < phi)
        candidate = typical ^ (rng.random((runs, self.n), dtype=np.float32) < phi)
        if drop_points:
            right = typical * (1 - phi) + ~typical * phi  # P(right) per question after noise
            rate = drop_points / 100 / float((right * regression).mean())
            if rate * regression.max() > 1:
                raise ValueError(f"a {drop_points}-point drop needs more right answers than this question set has")
            candidate &= ~(rng.random((runs, self.n), dtype=np.float32) < rate * regression)
        return reference, candidate


def flexible_from_strict(strict: np.ndarray, rng: np.random.Generator, share: float = 0.02) -> np.ndarray:
    """flexible-extract outcomes: strict-match's right answers plus a few right numbers in a lost format."""
    return strict | (rng.random(strict.shape, dtype=np.float32) < share)


# ---------------------------------------------------------------------------------------------- a whole A/B run

AB_DTYPES = ("auto", "fp8", "fp8_e4m3", "fp8_e5m2")
AB_ARCHS = ("sm80", "sm90", "sm100", "sm120")


def ab_run_axes(cells: int, backends: Sequence[str]) -> list[tuple[str, str, str]]:
    """`cells` (backend, kv_cache_dtype, arch) triples, arch-major then backend, 4 dtypes a backend (2 for 2 cells)."""
    dtypes = AB_DTYPES[:2] if cells <= 2 else AB_DTYPES
    wanted = [(b, d, a) for a in AB_ARCHS for b in backends for d in dtypes]
    if cells > len(wanted):
        raise ValueError(f"{cells} cells need more than {len(backends)} backends")
    return wanted[:cells]


def write_ab_run(run_dir: Path, axes: Sequence[tuple[str, str, str]], *, n: int = 200,
                 head_drop: Mapping[str, int] | None = None, slower: Mapping[str, float] | None = None,
                 model: str | None = None, right: int | None = None, seed: int = 0, rounds: int | None = None) -> Path:
    """An A/B run of these cells (base and head side of each, contract 1.6): 2 filters on `n` questions, `rounds`
    interleaved throughput repeats (default: the shipped policy's throughput.rounds), kernel tests, KV cache
    evidence. head_drop: cell id -> right answers the head loses against its base; slower: cell id -> the head's
    throughput as a share of the base's; right: how many questions every cell answers right (default: 60-80 % of
    them, drawn per backend and arch); model: the matrix's for each cell unless given."""
    if rounds is None:
        rounds = shipped_policy().throughput.rounds
    run_dir = Path(run_dir)
    rng = random.Random(seed)
    rights: dict[tuple[str, str], int] = {}
    for backend, dtype, arch in axes:
        identity = cell_id(backend, dtype, arch)
        # every dtype of a backend and arch answers the same questions right, the head as often as its base
        drawn = round(n * (0.6 + 0.2 * rng.random()))
        right_here = rights.setdefault((backend, arch), drawn if right is None else right)
        base, head = paired_outcomes(n, reference_correct=right_here, only_reference=(head_drop or {}).get(identity, 0),
                                     only_candidate=0, seed=seed + len(rights))
        rps = 3.0 + 2 * rng.random()
        for side, correct in (("base", base), ("head", head)):
            cell = write_cell(run_dir, backend=backend, kv_cache_dtype=dtype, arch=arch, model=model,
                              folder=identity if side == "head" else f"{identity}--base",
                              extra={"contract_version": "1.6", "side": side})
            write_accuracy(cell, {name: correct for name in GSM8K_FILTERS})
            share = (slower or {}).get(identity, 1.0) if side == "head" else 1.0
            write_throughput(cell, [rps * share * (1 + 0.004 * (k % 3 - 1)) for k in range(rounds)])
            write_kernels(cell)
            evidence = {"element_bytes": [1 if dtype != "auto" else 2], "layer_kv_cache_dtypes": [dtype],
                        "tokens": 200_000 if dtype != "auto" else 100_000}
            write_status(cell, {"accuracy": {"status": "ok", "kv_cache": evidence},
                                "throughput": {"status": "ok",
                                               "interleaved": {"order": ["base", "head"], "rounds": rounds}}})
    return run_dir


def write_engines_ab_run(run_dir: Path, base: Sequence[Sequence[float]], head: Sequence[Sequence[float]], *,
                         backend: str = "FLASHMLA", kv_cache_dtype: str = "fp8", arch: str = "sm90",
                         model: str = SEED_MODEL) -> Path:
    """An A/B run of one cell's throughput as kvgate's runners write it from contract 1.9: each side's repeats in
    engines (a list of each engine's req/s), status.json `engines` and `interleaved` by engine."""
    run_dir = Path(run_dir)
    identity = cell_id(backend, kv_cache_dtype, arch)
    for side, engines in (("base", base), ("head", head)):
        cell = write_cell(run_dir, backend=backend, kv_cache_dtype=kv_cache_dtype, arch=arch, model=model,
                          folder=identity if side == "head" else f"{identity}--base",
                          extra={"contract_version": "1.9", "side": side, "task": "kvgate_gsm8k_test_train"})
        write_throughput(cell, [v for engine in engines for v in engine])
        grouping, first = [], 1
        for number, engine in enumerate(engines, 1):
            grouping.append({"engine": number, "repeats": list(range(first, first + len(engine)))})
            first += len(engine)
        write_status(cell, {"throughput": {"status": "ok", "engines": grouping, "interleaved": {
            "order": ["base", "head"], "rounds": min(len(base), len(head)), "by": "engine"}}})
    (run_dir / "run.json").write_text(json.dumps({"contract_version": "1.9", "sides": ["base", "head"]}) + "\n")
    return run_dir
