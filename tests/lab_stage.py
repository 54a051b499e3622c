"""The one stage of the micro repositories of tests/test_lab.py, started as every stage of the project is
(``python stages/run.py stages/lab.py``): what its checkout's code says, the bits of a few training steps under the
numerics profile, and data files for a remote to move.

It reads ``probe`` from params.yaml:

* ``lr`` must be positive, else one ``error:`` sentence and exit status 2, as the project's stages refuse a bad
  value (a sweep's bad point);
* ``steps`` > 0 trains a small linear model that many AdamW steps with torch under the profile's threads, and
  records the final loss's bits (``float.hex``) and the thread count: two experiments at once must give the bits a
  serial run gives;
* whatever it reads, it records ``marker`` and ``child_marker``: ``vcarepro.lab_marker.MARKER`` as the stage and a
  process it starts import it;
* ``files`` writes that many files of ``file_kib`` KiB to ``data/`` (a DVC output), the same bytes on every run.

With ``LAB_GATE`` naming a folder, the stage writes its working directory and pid to ``started`` there and waits
(at most ``LAB_GATE_S`` seconds, 120) for ``go``; with ``LAB_BARRIER`` (``FOLDER:N``) it waits until N stages have
arrived in that folder, which they do only if they run at once. Only then does it import ``vcarepro.lab_marker``,
the module whose ``MARKER`` it reports, so a test can change the workspace's code while the stage runs.
``LAB_TRACE`` names a file the stage appends its start and end times to (two experiments at once overlap there)."""

import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import yaml

probe = yaml.safe_load(Path("params.yaml").read_text())["probe"]
trace = os.environ.get("LAB_TRACE")
started = time.time()
if not probe["lr"] > 0:
    fix = "pass -S probe.lr=<a positive number>."
    print(f"error: probe.lr is {probe['lr']}, and a learning rate must be positive; {fix}", file=sys.stderr)
    raise SystemExit(2)
gate = os.environ.get("LAB_GATE")
if gate:  # say where and who, then wait for the test's `go`
    Path(gate, "started").write_text(json.dumps({"cwd": os.getcwd(), "pid": os.getpid()}))
    deadline = time.monotonic() + float(os.environ.get("LAB_GATE_S", "120"))
    while not Path(gate, "go").exists():
        if time.monotonic() > deadline:
            print(f"error: nobody opened the gate {gate} in time.", file=sys.stderr)
            raise SystemExit(2)
        time.sleep(0.05)
barrier = os.environ.get("LAB_BARRIER")
if barrier:  # "FOLDER:N": wait until N stages have arrived there, so that they are known to run at once
    folder, count = barrier.rsplit(":", 1)
    Path(folder, f"arrived-{os.getpid()}").touch()
    deadline = time.monotonic() + 120
    while len(list(Path(folder).glob("arrived-*"))) < int(count):
        if time.monotonic() > deadline:
            print(f"error: fewer than {count} stages reached {folder} within 120 s.", file=sys.stderr)
            raise SystemExit(2)
        time.sleep(0.05)

from vcarepro import lab_marker  # noqa: E402  imported only now: the code as it is when the stage gets here

# a process the stage starts (as a training stage starts torchrun's ranks) imports the same code
child = subprocess.run(
    [sys.executable, "-c", "from vcarepro import lab_marker; print(lab_marker.MARKER)"],
    capture_output=True,
    text=True,
    check=True,
)
result = {"marker": lab_marker.MARKER, "child_marker": child.stdout.strip(), "lr": probe["lr"]}
if probe["steps"]:
    import torch

    from vcarepro.core import numerics

    numerics.enter()
    torch.manual_seed(0)
    x, y = torch.randn(512, 256), torch.randn(512, 64)
    model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.GELU(), torch.nn.Linear(256, 64))
    optimizer = torch.optim.AdamW(model.parameters(), lr=probe["lr"])
    for _ in range(probe["steps"]):
        loss = torch.nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    result.update(loss=loss.item().hex(), threads=torch.get_num_threads())
Path("data").mkdir(exist_ok=True)
block = hashlib.sha256(str(probe["lr"]).encode()).digest() * 32  # 1 KiB
for i in range(probe["files"]):
    head = hashlib.sha256(f"{i}".encode()).digest()[:16]  # every file differs: one object each in the cache
    Path("data", f"part{i:04d}.bin").write_bytes(head + block * probe["file_kib"])
Path("metrics.json").write_text(json.dumps(result, sort_keys=True) + "\n")
if trace:
    with open(trace, "a") as out:
        out.write(f"{os.getcwd()} {started} {time.time()}\n")
