"""Every seed of a run, in one launched stage: rank 0 owns the dvclive log and the prints.

With ``seed_processes > 1`` the seeds first train side by side in forked workers, each with an equal share
of the threads: small models on a CPU spend much of a step in single-threaded dispatch, which two processes
overlap and two threads do not. Workers write only checkpoints; the stage's process then resumes each seed
from its worker's, so log, weights and history come from one place. A seed whose worker failed is redone
here under the worker's thread count (the same bits); a worker's UserError stops the stage as one sentence,
exit 2, and a worker's SIGTERM stops it as a preempted rank, exit 143. Workers must fork before any backward
pass (torch's "Autograd and Fork": the engine's threads do not survive a fork).
"""

from __future__ import annotations

import json
import math
import multiprocessing
import os
import pickle
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Dict, Iterable, Iterator, List, Optional

import torch
from dvclive import Live

from vcarepro.core import progress, supervise
from vcarepro.core.errors import USER_ERROR_STATUS, UserError
from vcarepro.core.io import write_bytes, write_text
from vcarepro.train.distributed import DistInfo, barrier, init_distributed, shutdown
from vcarepro.train.preemption import Preempted, stop_on_sigterm


def train_seeds(
    label: str,
    seeds: Iterable[int],
    live_dir,
    train_one: Callable[[int, DistInfo, Live], Dict],
    seed_processes: int = 1,
) -> None:
    """Run ``train_one(seed, info, live)`` for each seed; one log per run, one metric family per seed.

    Of several ranks, one stopping on a :class:`UserError` (a damaged image in its share) marks that in the
    process group's store before it leaves the group; a rank whose collective then fails exits with
    ``PEER_STOPPED_STATUS`` and no traceback, so the stage's output is that rank's sentence.
    """
    seeds = list(seeds)
    info = init_distributed()
    in_workers: Dict[int, Dict] = {}
    threads = None  # the thread count of the workers, under which a seed one of them left is redone
    if seed_processes > 1 and not info.distributed and len(seeds) > 1:
        try:
            in_workers = run_in_workers(label, seeds, lambda seed: train_one(seed, info, None), seed_processes)
        except Preempted as stop:
            print(f"{label}: {stop}", file=sys.stderr, flush=True)
            raise
        threads = worker_threads(seed_processes, len(seeds))
    live = Live(str(live_dir), dvcyaml=False, save_dvc_exp=False) if info.is_main else None
    seconds: Dict[str, Optional[float]] = {}
    try:
        for seed in seeds:
            try:
                with num_threads(threads):
                    figures = train_one(seed, info, live)
            except Preempted as stop:
                print(f"{label} seed {seed}: {stop}", file=sys.stderr, flush=True)
                raise
            if seed in in_workers:  # the wall time of the training, not of the resume that read it back
                figures["train_seconds"] = in_workers[seed]["train_seconds"]
            if live is not None:
                print(f"{label} seed {seed}: " + ", ".join(f"{k}={v:.4g}" for k, v in figures.items()), flush=True)
                seconds[f"seed_{seed}"] = figures.pop("train_seconds", None)
                live.summary[f"seed_{seed}"] = figures
            barrier(info)
        if live is not None:
            live.end()
            write_timing(live_dir, {"train_seconds": seconds})
    except UserError:
        _say_to_the_other_ranks(info)  # before this rank leaves the process group, failing their collectives
        raise
    except Exception:
        if _another_rank_said_why(info):  # its sentence is the stage's; this rank's lost collective is no news
            raise SystemExit(PEER_STOPPED_STATUS) from None
        raise
    finally:
        shutdown(info)


PEER_FAILED = "vcarepro/user_error"  # the store key a rank that stops on a UserError sets to its rank
PEER_STOPPED_STATUS = 1  # a rank whose collective failed because another rank stopped on a UserError


def _say_to_the_other_ranks(info: DistInfo) -> None:
    if not info.distributed:
        return
    try:
        from torch.distributed.distributed_c10d import _get_default_store

        _get_default_store().set(PEER_FAILED, str(info.rank))
    except Exception:  # noqa: BLE001 - the store gone too: the others keep their tracebacks
        pass


def _another_rank_said_why(info: DistInfo) -> bool:
    if not info.distributed:
        return False
    try:
        from torch.distributed.distributed_c10d import _get_default_store

        return _get_default_store().check([PEER_FAILED])
    except Exception:  # noqa: BLE001 - no store to ask: keep this rank's own traceback
        return False


TIMINGS = Path("timings")  # wall times: beside the results, never in a DVC output


def timing_path(live_dir) -> Path:
    """Where a run's wall times go: timings/<branch>/<run>.json for the run whose log is runs/<branch>/<run>/live."""
    run = Path(live_dir).resolve().parent
    return TIMINGS / run.parent.name / f"{run.name}.json"


def write_timing(live_dir, figures: Dict) -> None:
    """Write a run's wall times outside its DVC outputs: a duration differs on every run and every machine, so in
    dvclive's summary it would change the output's hash (and the report's, which reads runs/) on every `dvc repro`."""
    from vcarepro.core.io import write_json

    path = timing_path(live_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json(path, figures)


WORKER_GRACE = 60.0  # seconds a worker has, after SIGTERM, to reach a step boundary and checkpoint


def worker_threads(processes: int, count: int) -> int:
    """Each worker's share of this process's CPU threads."""
    return max(1, torch.get_num_threads() // min(processes, count))


@contextmanager
def num_threads(threads: Optional[int]) -> Iterator[None]:
    """torch's intra-op thread count set to ``threads`` for the duration (None: unchanged)."""
    if threads is None:
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def run_in_workers(
    label: str, seeds: List[int], work: Callable[[int], Optional[Dict]], processes: int, what: str = "seeds"
) -> Dict[int, Dict]:
    """``work(seed)`` for every seed in ``processes`` forked workers (seed i in worker i mod processes).

    Returns {seed: what ``work`` returned (or {})} for the seeds that finished; the caller redoes the others,
    and reads the finished ones back from what ``work`` left on disk. A :class:`UserError` in a worker stops the
    other workers as a SIGTERM does and is raised here (the first seed's, in ``seeds`` order). A worker stopped
    by SIGTERM (its ``work`` raised :class:`Preempted`), or a SIGTERM reaching this process, stops every worker
    the same way and raises :class:`Preempted` here: the stage stops (exit 143) instead of redoing the seed.
    """
    processes = min(processes, len(seeds))
    threads = worker_threads(processes, len(seeds))
    with tempfile.TemporaryDirectory(prefix="vcarepro-seeds-") as tmp:
        context = multiprocessing.get_context("fork")  # the imports and the loaded data are shared, not redone
        workers = [
            context.Process(target=_worker, args=(seeds[k::processes], work, threads, Path(tmp)), daemon=False)
            for k in range(processes)
        ]
        print(f"{label}: {what} {seeds} in {processes} worker processes, {threads} thread(s) each", flush=True)
        stopping = False
        with stop_on_sigterm() as stop:
            try:
                for w in workers:
                    w.start()
                while any(w.is_alive() for w in workers):
                    if (
                        stop.requested
                        or any(Path(tmp).glob("seed_*.preempted"))
                        or any(Path(tmp).glob("seed_*.usererror"))
                    ):
                        # SIGTERM stops the others at their next step boundary, checkpoints kept; SIGKILL one that
                        # cannot reach a step boundary in time
                        stopping = True
                        supervise.stop(workers, WORKER_GRACE, poll_s=0.1)
                        break
                    for w in workers:
                        w.join(timeout=0.1)
            finally:  # the stage was interrupted otherwise: stop the workers with it (SIGTERM, waited for)
                supervise.stop(workers, math.inf, poll_s=0.1)
            stopped_here = stop.requested  # also a SIGTERM just after the last worker ended
        for seed in seeds:  # the user's to fix: redoing the seed here would only meet it again
            refused = Path(tmp) / f"seed_{seed}.usererror"
            if refused.is_file():
                raise pickle.loads(refused.read_bytes())
        stopped = [p.read_text() for p in sorted(Path(tmp).glob("seed_*.preempted"))]
        if stopping or stopped or stopped_here:
            raise Preempted(f"in a seed worker ({'; '.join(stopped) or 'the stage was sent SIGTERM'})")
        done, failed = {}, []
        for seed in seeds:
            path = Path(tmp) / f"seed_{seed}.json"
            if path.is_file():
                done[seed] = json.loads(path.read_text())
            else:
                error = Path(tmp) / f"seed_{seed}.error"
                failed.append(f"{seed} ({error.read_text()})" if error.is_file() else str(seed))
        if failed:
            print(
                f"{label}: {what} {', '.join(failed)} did not finish in a worker; running them here with "
                f"{threads} thread(s), as the worker would have",
                file=sys.stderr,
                flush=True,
            )
        return done


def _worker(seeds: List[int], work, threads: int, out: Path) -> None:
    torch.set_num_threads(threads)
    # lines naming the seed, on the stage's stdout (inherited): the siblings' bars would fight for one terminal line
    progress.lines_only()
    with stop_on_sigterm() as stop:  # a SIGTERM between two seeds (training installs its own handler)
        for seed in seeds:
            if stop.requested:
                write_text(out / f"seed_{seed}.preempted", f"seed {seed} before it started")
                os._exit(143)
            _work_one(seed, work, out)
    os._exit(0)  # no atexit handlers of the parent's (dvclive, the warm server) in a forked child


def _work_one(seed: int, work, out: Path) -> None:
    try:
        result = work(seed)
    except Preempted as stopped:  # the stage stops too; the checkpoint is on disk
        write_text(out / f"seed_{seed}.preempted", f"seed {seed} {stopped.where}")
        os._exit(143)
    except UserError as err:  # bad data, a diverged run: the stage stops with the error's one sentence
        write_bytes(out / f"seed_{seed}.usererror", _pickled(err))
        os._exit(USER_ERROR_STATUS)
    except BaseException as err:  # noqa: BLE001 - the stage's process redoes the seed and reports the error
        write_text(out / f"seed_{seed}.error", f"{type(err).__name__}: {err}")
        os._exit(1)
    write_text(out / f"seed_{seed}.json", json.dumps(result or {}))


def _pickled(err: UserError) -> bytes:
    """``err`` for the stage's process; as a plain :class:`UserError` with its sentence where it does not unpickle."""
    try:
        data = pickle.dumps(err)
        pickle.loads(data)
        return data
    except Exception:  # noqa: BLE001 - an error class whose constructor takes other arguments
        return pickle.dumps(UserError(str(err)))
