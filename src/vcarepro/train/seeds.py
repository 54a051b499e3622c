"""Every seed of a run, in one launched stage: rank 0 owns the dvclive log and the prints."""
from __future__ import annotations

import sys
from typing import Callable, Dict, Iterable

from dvclive import Live

from .distributed import DistInfo, barrier, init_distributed, shutdown
from .preemption import Preempted


def train_seeds(label: str, seeds: Iterable[int], live_dir, train_one: Callable[[int, DistInfo, Live], Dict]) -> None:
    """Run ``train_one(seed, info, live)`` for each seed; one log per run, one metric family per seed."""
    info = init_distributed()
    live = Live(str(live_dir), dvcyaml=False, save_dvc_exp=False) if info.is_main else None
    try:
        for seed in seeds:
            try:
                figures = train_one(seed, info, live)
            except Preempted as stop:
                print(f"{label} seed {seed}: {stop}", file=sys.stderr, flush=True)
                raise
            if live is not None:
                live.summary[f"seed_{seed}"] = figures
                print(f"{label} seed {seed}: " + ", ".join(f"{k}={v:.4g}" for k, v in figures.items()), flush=True)
            barrier(info)
        if live is not None:
            live.end()
    finally:
        shutdown(info)
