"""A one-node SLURM cluster for the tests: Debian's slurm-wlm and munge, in a private network namespace.

    unshare --net --uts --mount --pid --fork --kill-child --mount-proc python tests/slurm_node.py DIR

brings up the namespace's loopback (127.0.0.1 and one private address on ``lo``: glibc resolves IPv4
names only when some non-loopback address exists), names the host ``localhost``, writes a munge key
and ``DIR/slurm.conf``, starts munged, slurmctld and slurmd (bound to 127.0.0.1:
``CommunicationParameters=NoInAddrAny,NoCtldInAddrAny``), waits until the node is idle, writes
``DIR/ready`` and sleeps. Commands enter the cluster with ``nsenter --target PID --net --uts --mount --pid``
and ``SLURM_CONF=DIR/slurm.conf``. Nothing can listen beyond the namespace, whose only interface is
``lo``; when this process (the namespace's init) ends, the kernel ends every daemon and job with it.

Job completions are logged by ``jobcomp/filetxt`` (``sacct --completion`` reads them): real accounting
needs slurmdbd and a database, which a test does not need to show when jobs ran and how they ended.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

# Debian puts the daemons and ip(8) in sbin, which a user's (or CI's) PATH may leave out.
SEARCH = os.pathsep.join([os.environ.get("PATH", ""), "/usr/local/sbin", "/usr/sbin", "/sbin"])


def tool(name: str) -> str:
    return shutil.which(name, path=SEARCH) or name


CPUS = 2  # what the node offers, whatever the machine has (SlurmdParameters=config_overrides)

CONF = """\
ClusterName=vcarepro-test
SlurmctldHost=localhost(127.0.0.1)
SlurmUser=root
AuthType=auth/munge
AuthInfo=socket={d}/munge.socket,cred_expire=10
CredType=cred/munge
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/slurmd.pid
SlurmctldLogFile={d}/slurmctld.log
SlurmdLogFile={d}/slurmd.log
CommunicationParameters=NoInAddrAny,NoCtldInAddrAny
SlurmdParameters=config_overrides
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
JobCompType=jobcomp/filetxt
JobCompLoc={d}/jobcomp.txt
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MpiDefault=none
ReturnToService=2
KillWait=10
MinJobAge=3600
NodeName=localhost NodeAddr=127.0.0.1 CPUs={cpus} State=UNKNOWN
PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP
"""


def run(name: str, *args: str) -> None:
    subprocess.run([tool(name), *args], check=True)


def main(directory: str) -> int:
    d = Path(directory).resolve()
    for sub in ("state", "spool"):
        (d / sub).mkdir(parents=True, exist_ok=True)
    run("ip", "link", "set", "lo", "up")
    run("ip", "addr", "add", "10.254.254.1/32", "dev", "lo")
    socket.sethostname("localhost")
    key = d / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    run(
        "munged",
        "--force",
        f"--key-file={key}",
        f"--socket={d}/munge.socket",
        f"--pid-file={d}/munged.pid",
        f"--log-file={d}/munged.log",
        f"--seed-file={d}/munge.seed",
    )
    (d / "slurm.conf").write_text(CONF.format(d=d, cpus=CPUS))
    env = {**os.environ, "SLURM_CONF": str(d / "slurm.conf"), "PATH": SEARCH}
    subprocess.run([tool("slurmctld"), "-i"], check=True, env=env)
    subprocess.run([tool("slurmd"), "-N", "localhost"], check=True, env=env)
    deadline = time.monotonic() + 60
    while True:
        state = subprocess.run([tool("sinfo"), "--noheader", "--format=%T"], capture_output=True, text=True, env=env)
        if state.stdout.strip() == "idle":
            break
        if time.monotonic() > deadline:
            print(f"the node did not become idle: {state.stdout.strip()} {state.stderr.strip()}", file=sys.stderr)
            return 1
        time.sleep(0.5)
    (d / "ready").write_text(str(os.getpid()))
    signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the namespace's init reaps what is orphaned to it
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1]))
