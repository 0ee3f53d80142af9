"""Time the gate on a large run: 256 cells x 1319 gsm8k questions (both filters logged), 3 throughput repeats.

    PYTHONPATH=src python benchmarks/gate_benchmark.py [--cells 256] [--samples 1319] [--prompt-chars 3000] [--probes]

Sample lines are about the size lm-eval writes for gsm8k 5-shot (a ~3 KB prompt in "arguments", the doc, the
response), so parsing costs what it costs on a real run. --probes gives every cell the probe/probe.json a real cell
job writes: the triton_attn auto and fp8 cells' files of the H200 run (tests/fixtures/h200_run, ~300 KB, 16 prompts,
top-5). The folder is built once under --dir (reused on later runs); the timed part is what `kvgate gate` does:
read every file, run every check, render and write the reports.
Target: under 5 s on the 2-core development machine. Prints the figures; asserts nothing.
"""

from __future__ import annotations

import argparse
import datetime as dt
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "tests"))  # synthetic_run: the tests' writer of contract-format folders

import archives  # noqa: E402  (safe unpacking on every declared Python)
from kvgate.gate import evaluation as gate  # noqa: E402
from kvgate.gate import policy as policy_module  # noqa: E402
from kvgate.gate import probe_agreement  # noqa: E402
from kvgate.matrix import cells as matrix_module  # noqa: E402
from kvgate.report import headline, write_all  # noqa: E402
from kvgate.results.run_loader import KnownNames, load_run  # noqa: E402
from synthetic_run import paired_outcomes, write_accuracy, write_cell, write_kernels, write_throughput  # noqa: E402

PAIRS = (("FLASHINFER_MLA", "sm100"), ("CUTLASS_MLA", "sm100"), ("FLASHMLA", "sm90"), ("TRITON_MLA", "sm90"),
         ("FLASHINFER", "sm90"), ("FLASH_ATTN", "sm90"), ("TRITON_ATTN", "sm89"), ("FLASHINFER", "sm100"))


H200_RUN = ROOT / "tests" / "fixtures" / "h200_run" / "run.tar.xz"


def real_probes(folder: Path) -> dict[str, Path]:
    """The probe.json of the H200 run's triton_attn auto and fp8 cells, unpacked under `folder`."""
    members = [f"run/triton_attn-{dtype}-sm90/probe/probe.json" for dtype in ("auto", "fp8")]
    archives.extract(H200_RUN, folder, members=members)
    return {dtype: folder / "run" / f"triton_attn-{dtype}-sm90" / "probe" / "probe.json" for dtype in ("auto", "fp8")}


def build(run_dir: Path, cells: int, samples: int, prompt_chars: int, probes: bool) -> None:
    marker = run_dir / ".built"
    wanted = f"{cells} {samples} {prompt_chars}" + (" probes" if probes else "")
    if marker.exists() and marker.read_text() == wanted:
        return
    if run_dir.exists():
        shutil.rmtree(run_dir)
    started = time.perf_counter()
    probe_files = real_probes(Path(tempfile.mkdtemp(prefix="kvgate-probes-"))) if probes else {}
    for group in range(cells // 2):
        backend, arch = PAIRS[group % len(PAIRS)]
        model = f"bench/model-{group // len(PAIRS):03d}"
        drop = 7 if group == 5 else 0  # one real regression among 128 pairs
        auto, fp8 = paired_outcomes(samples, reference_correct=int(0.65 * samples), only_reference=60 + drop * 13,
                                    only_candidate=60, seed=group)
        for dtype, outcomes, rps in (("auto", auto, (3.20, 3.22, 3.24)), ("fp8", fp8, (3.52, 3.55, 3.57))):
            cell = write_cell(run_dir, backend=backend, kv_cache_dtype=dtype, arch=arch, model=model,
                              folder=f"{backend.lower()}-{dtype}-{arch}-{group:03d}")
            write_accuracy(cell, {"strict-match": outcomes, "flexible-extract": outcomes}, model=model,
                           prompt_chars=prompt_chars)
            write_throughput(cell, rps)
            write_kernels(cell, passed=12)
            if probes:
                (cell / "probe").mkdir()
                shutil.copyfile(probe_files[dtype], cell / "probe" / "probe.json")
    marker.write_text(wanted)
    print(f"built {cells} cells in {time.perf_counter() - started:.1f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cells", type=int, default=256)
    parser.add_argument("--samples", type=int, default=1319)
    parser.add_argument("--prompt-chars", type=int, default=3000)
    parser.add_argument("--dir", type=Path, default=Path("/tmp/kvgate-gate-benchmark"))
    parser.add_argument("--probes", action="store_true", help="give every cell a real H200 probe.json (~300 KB)")
    parser.add_argument("--stdlib-json", action="store_true", help="read sample logs without msgspec (json only)")
    args = parser.parse_args()
    if args.stdlib_json:
        from kvgate.results.parsers import lm_eval

        lm_eval._FAST_DECODERS["exact_match"] = None
    run_dir = args.dir / (f"run-{args.cells}x{args.samples}" + ("-probes" if args.probes else ""))
    build(run_dir, args.cells, args.samples, args.prompt_chars, args.probes)
    size = sum(p.stat().st_size for p in run_dir.rglob("*") if p.is_file())
    matrix = matrix_module.load()
    policy = policy_module.load(matrix=matrix)
    t0 = time.perf_counter()
    results = load_run(run_dir, KnownNames.from_matrix(matrix))
    t1 = time.perf_counter()
    verdict = gate.evaluate(results, policy=policy, waiver_for=matrix.waiver_for, today=dt.date.today(),
                            probe_compare=probe_agreement.compare)
    t2 = time.perf_counter()
    write_all(verdict, args.dir / "gate-out")
    t3 = time.perf_counter()
    print(headline(verdict))
    reader = "json (stdlib)" if args.stdlib_json else "msgspec when installed, else json"
    probes = "a real H200 probe.json" if args.probes else "no probe"
    print(f"{len(results.cells)} cells, {args.samples} questions x 2 filters each, {probes} each, "
          f"{size / 1e9:.2f} GB on disk; sample logs read with {reader}")
    print(f"read+parse {t1 - t0:.2f} s ({size / 1e6 / (t1 - t0):.0f} MB/s) | checks+stats {t2 - t1:.2f} s | "
          f"reports {t3 - t2:.2f} s | total {t3 - t0:.2f} s (target < 5 s)")


if __name__ == "__main__":
    main()
