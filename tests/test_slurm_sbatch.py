"""benchmarks/slurm_array.sh on a real SLURM scheduler (docs/ci.md, "SLURM job array").

A one-node cluster is started on the machine the tests run on: munged with a key of its
own, a ``slurm.conf`` written into a temporary folder, ``slurmctld -D`` and ``slurmd -D``
(no systemd). A tiny CPU suite is submitted as a job array (``sbatch --array``), its shards
are merged by a job that depends on the array (``--dependency=afterok``), and the merged
set is checked against a one-process run of the same suite: the same cases, each once,
every row whole (identities, never timings). The second case cancels one array task
(``scancel JOB_K``), shows ``merge`` refusing the partial set (exit 2), submits that task
again alone (``sbatch --array=K``) and merges the completed set.

The Debian packages ``slurm-wlm`` and ``munge`` provide the daemons (``.ci/run`` installs
them); where they are not installed the tests skip and say so.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from conftest import TINY_CPU_KERNELS
from tflabench.compare.rows import IDENTITY_COLUMNS
from tflabench.store.results import load_results

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "slurm_array.sh"
PROGRAMS = ("sbatch", "squeue", "scancel", "sinfo", "slurmctld", "slurmd", "munged")

#: Six cases (two kernels x three lengths, forward), a few timed calls each: a shard runs in seconds.
SUITE = """\
name: slurm_tiny
description: six tiny CPU cases for the SLURM job-array test
device: cpu
dtype: float32
modes: [fwd]
seed: 0
timing: {warmup: 1, iterations: 5, timeout_s: 120}
numerics: {check: false}
model: {embedding_dim: 64}
sweep: {batch: 1, seq_len: [32, 64, 128]}
""" + TINY_CPU_KERNELS

#: The options that fit this one-node cluster, overriding the script's ``#SBATCH`` lines
#: (it asks for a GPU and 8 CPUs per task).
NODE_OPTIONS = ["--gres=none", "--cpus-per-task=1", "--time=00:10:00"]


def _missing_programs() -> list[str]:
    return [p for p in PROGRAMS if shutil.which(p) is None]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _node_cpus() -> int:
    """The CPU count ``slurmd -C`` reports for this machine (what the node may declare)."""
    text = subprocess.run(["slurmd", "-C"], capture_output=True, text=True, timeout=60).stdout
    for word in text.split():
        if word.startswith("CPUs="):
            return int(word.split("=", 1)[1])
    return os.cpu_count() or 1


def _start(command: list[str], log: Path, env: dict) -> subprocess.Popen:
    """A daemon in the foreground, in a process group of its own (killed as one)."""
    return subprocess.Popen(command, stdout=log.open("w"), stderr=subprocess.STDOUT, env=env,
                            start_new_session=True)


def _stop(process: subprocess.Popen) -> None:
    """End a daemon's process group: SIGTERM, then SIGKILL after 10 s."""
    for sig, wait in ((signal.SIGTERM, 10), (signal.SIGKILL, 5)):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            break
        try:
            process.wait(timeout=wait)
            break
        except subprocess.TimeoutExpired:
            continue


class Cluster:
    """A running one-node cluster: ``env`` for the SLURM clients, ``work`` its folder."""

    def __init__(self, work: Path, env: dict):
        self.work, self.env = work, env

    def call(self, *args: str, timeout: float = 300, env: dict | None = None,
             check: bool = True) -> subprocess.CompletedProcess:
        done = subprocess.run(list(args), cwd=self.work, env=env or self.env, capture_output=True, text=True,
                              timeout=timeout)
        if check:
            assert done.returncode == 0, f"{args}: {done.returncode}\n{done.stdout}\n{done.stderr}"
        return done

    def jobs(self, job: str) -> list[str]:
        """``squeue`` lines of ``job``'s tasks still pending or running: ``ID STATE``."""
        out = self.call("squeue", "-h", "-r", "-j", job, "-o", "%i %T", check=False).stdout
        return [line.strip() for line in out.splitlines() if line.strip()]

    def wait_gone(self, job: str, timeout: float = 300) -> None:
        deadline = time.monotonic() + timeout
        while self.jobs(job):
            assert time.monotonic() < deadline, f"job {job} still queued: {self.jobs(job)}"
            time.sleep(1)


@pytest.fixture(scope="module")
def cluster():
    """munged, slurmctld and slurmd of a one-node cluster; all three process groups are
    ended and the folder removed when the module's tests are done."""
    missing = _missing_programs()
    if missing:
        pytest.skip(f"SLURM is not installed ({', '.join(missing)} missing): apt-get install -y slurm-wlm munge "
                    "(as .ci/run does)")
    work = Path(tempfile.mkdtemp(prefix="tflabench-slurm-"))
    work.chmod(0o755)  # munged wants its socket's folder (and the path to it) open to all
    daemons: list[subprocess.Popen] = []
    try:
        for name in ("munge", "state", "spool", "logs"):
            (work / name).mkdir(mode=0o700)
        sock_dir = work / "sock"
        sock_dir.mkdir(mode=0o755)
        key = work / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        sock = sock_dir / "munge.socket"
        env = dict(os.environ)
        daemons.append(_start(["munged", "-F", f"--key-file={key}", f"--socket={sock}",
                               f"--pid-file={work / 'munge' / 'pid'}", f"--log-file={work / 'munge' / 'log'}",
                               f"--seed-file={work / 'munge' / 'seed'}"], work / "logs" / "munged.out", env))
        deadline = time.monotonic() + 30
        while not sock.exists():
            assert daemons[0].poll() is None, (work / "logs" / "munged.out").read_text()
            assert time.monotonic() < deadline, "munged did not create its socket"
            time.sleep(0.2)

        host = socket.gethostname().split(".")[0]
        import getpass

        user = getpass.getuser()
        conf = work / "slurm.conf"
        conf.write_text("\n".join([
            "ClusterName=tflabench", f"SlurmctldHost={host}",
            f"SlurmctldPort={_free_port()}", f"SlurmdPort={_free_port()}",
            "AuthType=auth/munge", f"AuthInfo=socket={sock}", "CredType=cred/munge",
            f"SlurmUser={user}", f"SlurmdUser={user}",
            f"StateSaveLocation={work / 'state'}", f"SlurmdSpoolDir={work / 'spool'}",
            f"SlurmctldPidFile={work / 'slurmctld.pid'}", f"SlurmdPidFile={work / 'slurmd.pid'}",
            f"SlurmctldLogFile={work / 'logs' / 'slurmctld.log'}", f"SlurmdLogFile={work / 'logs' / 'slurmd.log'}",
            "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none",
            "SelectType=select/cons_tres", "SelectTypeParameters=CR_Core",
            "JobCompType=jobcomp/none", "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none", "MpiDefault=none", "ReturnToService=2",
            f"NodeName={host} CPUs={_node_cpus()} State=UNKNOWN",
            f"PartitionName=debug Nodes={host} Default=YES MaxTime=INFINITE State=UP", "",
        ]))
        env = dict(env, SLURM_CONF=str(conf))
        for daemon in ("slurmctld", "slurmd"):
            daemons.append(_start([daemon, "-D", "-f", str(conf)], work / "logs" / f"{daemon}.out", env))
        slurm = Cluster(work, env)
        deadline = time.monotonic() + 60
        while True:
            state = slurm.call("sinfo", "-h", "-N", "-o", "%T", check=False).stdout.strip()
            if state == "idle":
                break
            for d in daemons:
                assert d.poll() is None, f"{d.args[0]} ended: " + "".join(
                    p.read_text() for p in (work / "logs").iterdir())
            assert time.monotonic() < deadline, f"the node is {state!r}, not idle, after 60 s"
            time.sleep(0.5)
        yield slurm
    finally:
        for daemon in reversed(daemons):
            _stop(daemon)
        shutil.rmtree(work, ignore_errors=True)


def _task_env(slurm: Cluster, results: Path, command: str) -> dict:
    """What each array task inherits (sbatch exports the submitting environment)."""
    return dict(slurm.env, TFLABENCH=command, TFLABENCH_RESULTS=str(results), TFLABENCH_VENV=str(results / "none"),
                # one run = one revision, whatever lands in the checkout meanwhile
                TFLABENCH_GIT_REVISION="e" * 40,
                PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "kernels"), os.environ.get("PYTHONPATH", "")]))


def _case_count(suite: Path, env: dict) -> int:
    done = subprocess.run([sys.executable, "-m", "tflabench", "run", str(suite), "--count"], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return int(done.stdout.strip())


def _sbatch(slurm: Cluster, env: dict, *args: str, timeout: float = 600) -> str:
    done = slurm.call("sbatch", "--parsable", *NODE_OPTIONS, f"--output={slurm.work / 'logs'}/%x-%A_%a.out",
                      *args, env=env, timeout=timeout)
    return done.stdout.strip().split(";")[0]


def _whole(row: dict) -> bool:
    """A row measured to the end: ok, a finite median, one sample per timed call."""
    samples = json.loads(row["ms_samples"]) if isinstance(row["ms_samples"], str) else row["ms_samples"]
    return (row["status"] == "ok" and math.isfinite(float(row["ms_median"])) and len(samples) == int(row["n_iter"])
            and len(samples) > 0)


def _identities(rows) -> dict[str, tuple]:
    return {r["case_id"]: tuple(str(r.get(c)) for c in IDENTITY_COLUMNS if c in r)
            for r in rows.to_dict("records")}


def test_sbatch_job_array_merges_to_what_one_process_measures(cluster, tmp_path):
    """N array tasks (N from `run --count` / 2), a merge job after them (afterok), the merged
    set against a one-process run: the same cases, each once, every row whole."""
    suite = tmp_path / "slurm_tiny.yaml"
    suite.write_text(SUITE)
    results = tmp_path / "results"
    env = _task_env(cluster, results, f"{sys.executable} -m tflabench")
    n_cases = _case_count(suite, env)
    n_tasks = n_cases // 2
    assert n_cases == 6 and n_tasks == 3

    one = subprocess.Popen([sys.executable, "-m", "tflabench", "run", str(suite), "--out", str(tmp_path / "one"),
                            "--no-progress", "--no-plots"], env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True)
    job = _sbatch(cluster, env, f"--array=0-{n_tasks - 1}", str(SCRIPT), str(suite), "--no-plots")
    merge_job = _sbatch(cluster, env, f"--dependency=afterok:{job}", "--kill-on-invalid-dep=yes", "--wait", str(SCRIPT), "--merge", job)
    cluster.wait_gone(job)
    output = one.communicate(timeout=600)[0]
    assert one.returncode == 0, output

    shards = sorted((results / "shards" / job).glob("*/*/*/metadata.json"))
    assert [load_results(p.parent).metadata["shard"] for p in shards] == [f"{k}/{n_tasks}" for k in
                                                                          range(1, n_tasks + 1)]
    merged = load_results(results / f"merged-{job}")
    single = load_results(next((tmp_path / "one").glob("*/*/metadata.json")).parent)
    assert merged.metadata["shard"] is None and len(merged.metadata["merged_from"]) == n_tasks
    assert merged.rows["case_id"].is_unique and len(merged.rows) == n_cases
    assert _identities(merged.rows) == _identities(single.rows)
    assert all(_whole(r) for r in merged.rows.to_dict("records"))
    print(f"\njob {job}: array of {n_tasks} tasks ({n_cases} cases), merge job {merge_job} (afterok): "
          f"{len(merged.rows)} rows in {results / f'merged-{job}'}, the same {len(single.rows)} cases as one "
          f"process, each once, every row ok with {int(merged.rows['n_iter'].iloc[0])} samples")


def test_scancel_of_one_array_task_is_refused_by_merge_and_resubmitted_to_completion(cluster, tmp_path):
    """Task 1 of 0-2 is held (it sleeps before running) and cancelled; the merge names the
    missing shard (exit 2); `sbatch --array=1` with TFLABENCH_ARRAY_OF completes the set."""
    suite = tmp_path / "slurm_tiny.yaml"
    suite.write_text(SUITE)
    results = tmp_path / "results"
    wrapper = tmp_path / "slow_tflabench.sh"
    wrapper.write_text("#!/bin/bash\n"
                       'if [ "${SLURM_ARRAY_TASK_ID:-}" = "${TFLABENCH_TEST_HOLD_TASK:-none}" ]; then sleep 600; fi\n'
                       f'exec {sys.executable} -m tflabench "$@"\n')
    env = _task_env(cluster, results, f"bash {wrapper}")
    job = _sbatch(cluster, dict(env, TFLABENCH_TEST_HOLD_TASK="1"), "--array=0-2", str(SCRIPT), str(suite),
                  "--no-plots")
    deadline = time.monotonic() + 300
    while True:  # the others done, task 1 running (asleep)
        queued = cluster.jobs(job)
        if queued == [f"{job}_1 RUNNING"]:
            break
        assert time.monotonic() < deadline, queued
        time.sleep(1)
    cluster.call("scancel", f"{job}_1")
    cluster.wait_gone(job)

    refused = cluster.call("bash", str(SCRIPT), "--merge", job, env=env, check=False)
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert "missing shard(s) 2/3" in refused.stderr and refused.stderr.startswith("error: ")
    assert not (results / f"merged-{job}" / "metadata.json").exists()

    again = _sbatch(cluster, dict(env, TFLABENCH_ARRAY_OF=f"{job}:0-2"), "--array=1", "--wait", str(SCRIPT),
                    str(suite), "--no-plots")
    assert again != job
    done = cluster.call("bash", str(SCRIPT), "--merge", job, env=env)
    merged = load_results(results / f"merged-{job}")
    assert merged.rows["case_id"].is_unique and len(merged.rows) == 6
    assert [m["shard"] for m in merged.metadata["merged_from"]] == ["1/3", "2/3", "3/3"]
    assert all(_whole(r) for r in merged.rows.to_dict("records"))
    print(f"\njob {job}: task 1 cancelled, merge refused ({refused.stderr.strip()}); job {again} "
          f"(--array=1) completed it: {done.stdout.strip()}")


def test_run_count_gives_the_array_size_and_a_bad_resubmission_range_is_refused(tmp_path):
    """`run --count` prints the cases (after --only and --shard) and measures nothing; the
    script refuses a TFLABENCH_ARRAY_OF that is not JOB:FIRST-LAST (exit 2, one line)."""
    suite = tmp_path / "slurm_tiny.yaml"
    suite.write_text(SUITE)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "kernels"),
                                                       os.environ.get("PYTHONPATH", "")]))
    assert _case_count(suite, env) == 6
    for options, expected in ((["--only", "torch*"], 3), (["--shard", "2/3"], 2)):
        done = subprocess.run([sys.executable, "-m", "tflabench", "run", str(suite), "--count", *options,
                               "--out", str(tmp_path / "none")], env=env, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0 and done.stdout.strip() == str(expected), done.stderr
    assert not (tmp_path / "none").exists()
    bad = subprocess.run(["bash", str(SCRIPT), str(suite)], cwd=tmp_path, capture_output=True, text=True, timeout=60,
                         env=dict(env, SLURM_ARRAY_TASK_ID="1", TFLABENCH_ARRAY_OF="12:three",
                                  TFLABENCH=f"{sys.executable} -m tflabench"))
    assert bad.returncode == 2 and "is not JOB:FIRST-LAST" in bad.stderr
