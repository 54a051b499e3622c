"""What DVC knows: its stage graph, what ``dvc status`` reports out of date, and so which stages may start.

A graph here is DVC's own ``Repo.index.graph`` with each stage named by DVC's addressing
(``train_cls@deit_tiny-vca``): an edge runs from a stage to each stage it reads from.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from operator import attrgetter
from pathlib import Path
from typing import Collection, List, Sequence, Set

import networkx as nx

from vcarepro.tools.cluster.slurm import ClusterError
from vcarepro.tools.remote import dvc_env, last_line

STATUS_TIMEOUT = 3600  # seconds `dvc status` may wait for DVC's lock (a job caching a large output holds it)


def stage_graph(root: Path) -> nx.DiGraph:
    """Every pipeline stage of ``root`` and what it reads from, in DVC's own graph of dvc.yaml."""
    from dvc.repo import Repo

    with Repo(str(root)) as repo:
        return nx.relabel_nodes(repo.index.graph, attrgetter("addressing"))


def topological(graph: nx.DiGraph) -> List[str]:
    """The stages, each after every stage it reads from; ties by name, so the order is stable."""
    by_name = nx.DiGraph({stage: sorted(graph[stage]) for stage in sorted(graph)})
    return list(nx.dfs_postorder_nodes(by_name))


def downstream(graph: nx.DiGraph, stages: Collection[str]) -> Set[str]:
    """``stages`` (those of ``graph``) and every stage that reads from one of them, directly or not."""
    found = set(stages) & set(graph)
    return found.union(*(nx.ancestors(graph, stage) for stage in found))


def out_of_date(root: Path, graph: nx.DiGraph, busy: Collection[str] = frozenset(), attempts: int = 20) -> Set[str]:
    """The stages not done: those ``dvc status`` reports changed, and ``busy`` ones (running now) with everything
    downstream of them. DVC is asked about the others only: a running stage holds DVC's write lock on its outputs,
    which ``dvc status`` of that stage or of one reading them would wait on."""
    busy = downstream(graph, busy)
    targets = sorted(set(graph) - busy)
    if not targets:
        return busy
    for _ in range(attempts):
        try:
            result = subprocess.run(
                [sys.executable, "-m", "dvc", "--wait-for-lock", "status", "--json", *targets],
                cwd=root,
                capture_output=True,
                text=True,
                env=dvc_env(),
                timeout=STATUS_TIMEOUT,
            )
        except subprocess.TimeoutExpired:
            raise ClusterError(
                f"`dvc status` waited {STATUS_TIMEOUT} s for DVC's lock: another DVC command holds "
                f"it in this workspace; wait for it to finish, then run the command again."
            ) from None
        if result.returncode == 0:
            return set(json.loads(result.stdout or "{}")) | busy
        if "Unable to acquire lock" not in result.stderr and "is busy" not in result.stderr:
            raise ClusterError(
                f"`dvc status` failed in {root}: {last_line(result.stderr)}; fix that first, "
                f"then run the command again."
            )
        time.sleep(3)  # a job's DVC holds the repository lock while it records (and caches) its stage's outputs
    raise ClusterError(
        "DVC's locks stayed taken for a minute (`dvc status` could not read them): another DVC "
        "command runs in this workspace; wait for it to finish, then run the command again."
    )


def todo_stages(graph: nx.DiGraph, changed: Collection[str]) -> Set[str]:
    """What is not done: each stage DVC reports changed and each one downstream of such a stage (its inputs
    will change when that one has run, so DVC's answer for it is not yet the last word)."""
    return downstream(graph, changed)


def ready_stages(graph: nx.DiGraph, changed: Collection[str]) -> List[str]:
    """The changed stages whose inputs are all done: they can run now, in topological order."""
    todo = todo_stages(graph, changed)
    return [s for s in topological(graph) if s in changed and not nx.descendants(graph, s) & todo]


def restrict(graph: nx.DiGraph, targets: Sequence[str]) -> nx.DiGraph:
    """The part of ``graph`` that ``targets`` need (themselves and everything upstream), as ``dvc repro
    TARGETS`` would run it; all of it without targets."""
    from dvc.repo.graph import get_subgraph_of_nodes

    unknown = [t for t in targets if t not in graph]
    if unknown:
        raise ClusterError(
            f"no stage {unknown[0]!r} in dvc.yaml; name one as `dvc stage list` does (e.g. {sorted(graph)[0]})."
        )
    return get_subgraph_of_nodes(graph, list(targets))
