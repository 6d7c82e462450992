"""The ``mpi://`` store against torch's ``TCPStore`` and ``FileStore`` and ``dir://``'s ``DirectoryStore``, in mpirun.

``python -m benchmarks.mpi_store [--world-sizes 2,8,32,128] [--repetitions 5] [--op-world-sizes 2,8,32]`` starts one
Open MPI job per world size (``mpirun --oversubscribe --mca btl self,vader --mca oob_tcp_if_include lo``, gloo on
``lo``) whose ranks import only torch and ``lightning_dist_hooks.mpi`` (not the package root, which imports
Lightning), and measures in it, the methods alternating in a rotating order every repetition:

1. **Time to a first barrier.** The ranks agree on a start time through ``COMM_WORLD`` (a non-blocking all-reduce,
   waited for with sleeps: Open MPI's blocking calls spin a core, and there are up to 64 ranks per core here), sleep
   until it, then each calls ``init_process_group("gloo", ...)`` and ``dist.barrier()``. A rank's time runs from the
   common start to the end of its barrier; a trial reports the slowest rank's and the median rank's, and the CPU
   time all ranks used meanwhile. The methods: ``mpi://`` (``MpiStore``; also how long ``MpiStore.create`` took, and
   the CPU time of its service threads), ``env://`` (torch's ``TCPStore`` in rank 0, on 127.0.0.1 and a free port),
   ``file://`` (torch's ``FileStore``, a fresh file) and ``dir://`` (``DirectoryStore`` on a fresh directory, built
   by each rank and passed as ``store=``, as ``benchmarks/bootstrap.py`` does). Each job first runs every method
   once unmeasured (that round pays for what later ones do not: Open MPI's shared-memory connections between
   pairs of ranks, first uses of gloo and of each store); the results keep it as ``first``.
2. **Single store operations** (at ``--op-world-sizes``): all ranks at once make ``--ops`` calls of each operation,
   one after another, on keys of their own that ``MpiStore`` keeps on the next rank (so that every ``mpi://`` call is
   a message there and an answer back): ``set``, ``get`` of a set key, ``add``, ``compare_set`` that succeeds,
   ``wait`` for a set key, ``check`` of a set key; each call is timed alone. ``TCPStore`` keeps every key in rank 0,
   ``FileStore`` in one file, ``DirectoryStore`` in one directory.

``--before-after`` adds ``mpi:// before`` (and ``MpiStore before``): the store as it was before issue 35 (no extended
API, so gloo's rendezvous gets its peers' addresses one key at a time; poll pauses that ignore the ranks per core),
rebuilt here by a subclass, alternating with the others in the same jobs.

Writes ``benchmarks/results/mpi_store.json`` (every trial) and ``mpi_store.txt`` (what it printed at the end); the
benchmark page and the README render the JSON (``benchmarks/docs.py``). The ranks run
``python -m benchmarks.mpi_store --rank-job SPEC``.
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
import zlib
from array import array
from datetime import timedelta
from pathlib import Path
from typing import Any

from benchmarks.common import REPO, free_ports, job_environment, machine, package_module_alone, rotated, start, wait_all

METHODS = ["mpi://", "env://", "file://", "dir://"]
BEFORE = "mpi:// before"
STORES = {
    "mpi://": "MpiStore",
    "env://": "TCPStore",
    "file://": "FileStore",
    "dir://": "DirectoryStore",
    BEFORE: "MpiStore before",
}
OPERATIONS = ["set", "get", "add", "compare_set", "wait", "check"]
RESULTS = REPO / "benchmarks" / "results" / "mpi_store.json"
STORE_TIMEOUT = timedelta(minutes=5)
# Each rank's own memory (torch's import, mostly), MiB: 147 after importing, 149.5 after the trials at 8 and 32 ranks
# on the 2-core machine. A job starts only if that many per rank (or the most a smaller job's ranks reported, a bit
# more) fit in MEMORY_MARGIN of what the machine has available: it has no swap, and other work shares it.
RANK_MIB_GUESS = 150.0
MEMORY_MARGIN = 0.9


# --- the ranks ---------------------------------------------------------------------------------------------------


def _mpi_package():
    """``lightning_dist_hooks.mpi`` without running the package root (which imports Lightning): seconds per rank."""
    import importlib.util
    import types

    if "lightning_dist_hooks" not in sys.modules:
        spec = importlib.util.find_spec("lightning_dist_hooks")
        assert spec is not None and spec.submodule_search_locations, "lightning_dist_hooks is not importable"
        root = types.ModuleType("lightning_dist_hooks")
        root.__path__ = list(spec.submodule_search_locations)
        root.__spec__ = spec  # found again by package_module_alone, still not run
        sys.modules["lightning_dist_hooks"] = root
    from lightning_dist_hooks import mpi

    return mpi


def _private_mib() -> float:
    with open("/proc/self/smaps_rollup") as rollup:
        return (
            sum(int(line.split()[1]) for line in rollup if line.startswith(("Private_Clean", "Private_Dirty"))) / 1024
        )


def _thread_cpu_s(native_id: int) -> float:
    """CPU time of one thread of this process (the scheduler's count, in nanoseconds)."""
    with open(f"/proc/self/task/{native_id}/schedstat") as schedstat:
        return int(schedstat.read().split()[0]) / 1e9


class _Rank:
    """One rank of a job: MPI, and the helpers that meet the other ranks without spinning a core."""

    def __init__(self, spec: dict) -> None:
        import torch
        import torch.distributed as dist

        torch.set_num_threads(1)
        self.spec = spec
        self.dist = dist
        self.mpi = _mpi_package()
        self.MPI = self.mpi.init_mpi()
        self.mpi.register_rendezvous()
        self.comm = self.MPI.COMM_WORLD
        self.rank, self.size = self.comm.Get_rank(), self.comm.Get_size()
        self.directory_store = package_module_alone("init_methods/_shared_filesystem/directory_store.py")
        # Every MpiStore the mpi:// rendezvous makes, to close it once its trial is over (atexit would keep it, and
        # its service thread, alive until the job ends), and how long its creation took.
        self.mpi_stores: list = []
        self.as_before = False
        self.rendezvous_s = 0.0
        store_class = self.mpi.MpiStore
        create = store_class.create.__func__
        as_before = _store_as_before(store_class, create)

        def recording_create(cls, timeout=STORE_TIMEOUT):
            began = time.monotonic()
            store = as_before(timeout) if self.as_before else create(cls, timeout)
            self.rendezvous_s = time.monotonic() - began
            self.mpi_stores.append(store)
            return store

        store_class.create = classmethod(recording_create)

    def wait_quietly(self, request) -> None:
        """Complete ``request`` sleeping between tests (Open MPI's blocking wait spins on a core)."""
        pause = 0.001
        while not request.Test():
            time.sleep(pause)
            pause = min(pause * 2, 0.02)

    def barrier(self) -> None:
        self.wait_quietly(self.comm.Ibarrier())

    def common_start(self) -> float:
        """Sleep until a start time every rank agreed on (CLOCK_MONOTONIC: one clock on one machine); return it."""
        lead = 0.2 + 0.002 * self.size  # time for every rank to learn the time: each polls, on 2 shared cores
        mine, agreed = array("d", [time.monotonic() + lead]), array("d", [0.0])
        self.wait_quietly(self.comm.Iallreduce(mine, agreed, op=self.MPI.MAX))
        time.sleep(max(0.0, agreed[0] - time.monotonic()))
        return agreed[0]

    def shared(self, make):
        """``make()`` on rank 0, sent to every rank (outside any timed part)."""
        value = make() if self.rank == 0 else None
        self.barrier()
        return self.comm.bcast(value, root=0)

    def gathered(self, value):
        self.barrier()
        return self.comm.gather(value, root=0)

    def close_mpi_stores(self) -> None:
        while self.mpi_stores:
            mpi_store = self.mpi_stores.pop()
            mpi_store.close()  # collective: every rank closes its own
            atexit.unregister(mpi_store.close)

    # --- 1. time to a first barrier ---

    def first_barrier(self, method: str, scratch: str, label: str) -> dict | None:
        dist = self.dist
        if method == "env://":
            port = self.shared(lambda: free_ports(1)[0])
            os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        target = f"{scratch}/{label}-{STORES[method].replace(' ', '-')}"
        if method == "dir://" and self.rank == 0:
            os.mkdir(target, mode=0o700)
        self.as_before = method == BEFORE
        directory_fd = None
        started = self.common_start()
        cpu_before = time.process_time()
        if method == "dir://":
            directory_fd = os.open(target, os.O_RDONLY | os.O_DIRECTORY)
            store = self.directory_store.DirectoryStore(directory_fd, Path(target), STORE_TIMEOUT, self.size)
            dist.init_process_group("gloo", store=store, rank=self.rank, world_size=self.size, timeout=STORE_TIMEOUT)
        else:
            init_method = {"env://": "env://", "file://": f"file://{target}"}.get(method, "mpi://")
            dist.init_process_group(
                "gloo", init_method=init_method, rank=self.rank, world_size=self.size, timeout=STORE_TIMEOUT
            )
        initialised = time.monotonic()
        dist.barrier()
        finished = time.monotonic()
        cpu = time.process_time() - cpu_before
        service_cpu = _thread_cpu_s(self.mpi_stores[-1]._service.thread.native_id) if self.mpi_stores else 0.0
        # Every rank has passed the barrier before any destroys its group: env://'s store lives in rank 0.
        self.barrier()
        dist.destroy_process_group()
        self.close_mpi_stores()
        if directory_fd is not None:
            os.close(directory_fd)
        times = self.gathered((initialised - started, finished - started, cpu, service_cpu, self.rendezvous_s))
        if self.rank != 0:
            return None
        seconds = [each[1] for each in times]
        trial = {
            "max_s": max(seconds),
            "median_s": statistics.median(seconds),
            "init_max_s": max(each[0] for each in times),
            "cpu_s": sum(each[2] for each in times),
        }
        if method in ("mpi://", BEFORE):
            trial.update(rendezvous_max_s=max(each[4] for each in times), service_cpu_s=sum(each[3] for each in times))
        return trial

    # --- 2. single operations ---

    def keys(self, count: int, tag: str) -> list[str]:
        """``count`` keys whose home in an MpiStore of this job is the next rank (another rank, from 2 ranks on)."""
        home, salt = (self.rank + 1) % self.size, 0
        keys: list[str] = []
        while len(keys) < count:
            key = f"{tag}/r{self.rank}/{salt}"
            if zlib.crc32(key.encode()) % self.size == home:
                keys.append(key)
            salt += 1
        return keys

    def make_store(self, name: str, scratch: str):
        """A store shared by every rank, and the directory descriptor to close after (``DirectoryStore``)."""
        dist = self.dist
        if name.startswith("MpiStore"):
            self.as_before = name == STORES[BEFORE]
            store = self.mpi.MpiStore.create(STORE_TIMEOUT)
            self.mpi_stores.remove(store)  # closed by the operations phase itself
            return store, None
        if name == "TCPStore":
            port = self.shared(lambda: free_ports(1)[0])
            return dist.TCPStore("127.0.0.1", port, self.size, self.rank == 0, STORE_TIMEOUT), None
        if name == "FileStore":
            return dist.FileStore(f"{scratch}/ops-filestore", self.size), None
        target = f"{scratch}/ops-directory"
        if self.rank == 0:
            os.mkdir(target, mode=0o700)
        self.barrier()
        directory_fd = os.open(target, os.O_RDONLY | os.O_DIRECTORY)
        return self.directory_store.DirectoryStore(directory_fd, Path(target), STORE_TIMEOUT, self.size), directory_fd

    def operations(self, store, keys: list[str], counters: list[str]) -> dict[str, list[float]]:
        """Seconds of each call, by operation; every key is set before the calls that read it."""
        clock = time.perf_counter
        calls = {
            "set": lambda index: store.set(keys[index], b"value"),
            "get": lambda index: store.get(keys[index]),
            "add": lambda index: store.add(counters[index], 1),
            "compare_set": lambda index: store.compare_set(keys[index], b"value", b"value"),
            "wait": lambda index: store.wait([keys[index]]),
            "check": lambda index: store.check([keys[index]]),
        }
        seconds: dict[str, list[float]] = {}
        for operation in OPERATIONS:
            call, samples = calls[operation], seconds.setdefault(operation, [])
            for index in range(len(keys)):
                began = clock()
                call(index)
                samples.append(clock() - began)
        return seconds


def _store_as_before(store_class, create):
    """``MpiStore.create`` as it was before issue 35 (``--before-after``): no extended API, so gloo asks for its peers'
    addresses one key at a time, and poll pauses that ignore how many ranks share a core (20 us after any traffic)."""
    from lightning_dist_hooks.mpi._store_service import PollPauses

    base: Any = store_class  # Any: mypy takes a base class chosen at run time only from a name typed Any

    class MpiStoreBefore(base):
        def has_extended_api(self) -> bool:
            return False

    def create_before(timeout: timedelta):
        store = create(MpiStoreBefore, timeout)
        store._service._pauses = PollPauses(first=20e-6, active=max(1e-3, store.world_size * 50e-6))
        return store

    return create_before


def _rank_job(spec_path: Path) -> None:
    spec = json.loads(spec_path.read_text())
    node = _Rank(spec)
    methods = METHODS + ([BEFORE] if spec["before_after"] else [])
    scratch = node.shared(lambda: tempfile.mkdtemp(prefix="ldh-bench-mpi-store-", dir=spec["scratch"]))
    result: dict = {"world_size": node.size, "first": {}, "trials": {method: [] for method in methods}}
    for repetition in range(spec["repetitions"] + 1):
        for method in rotated(methods, repetition + node.size):
            trial = node.first_barrier(method, scratch, f"trial-{repetition}")
            if node.rank == 0:
                assert trial is not None  # rank 0's
                if repetition == 0:
                    result["first"][method] = trial
                else:
                    result["trials"][method].append(trial)
                print(
                    f"{node.size:4} ranks, {'first' if repetition == 0 else f'rep {repetition}':6} {method:14} "
                    f"{trial['max_s']:7.3f} s (median rank {trial['median_s']:.3f}, init_process_group "
                    f"{trial['init_max_s']:.3f}, CPU of all ranks {trial['cpu_s']:.2f})",
                    flush=True,
                )
    # Measured before the operations phase, whose samples rank 0 gathers: what a job of trials alone takes per rank.
    result["rank_private_mib"] = node.gathered(_private_mib())
    if spec["ops"]:
        result["operations"] = _operations_phase(node, spec, scratch, methods)
    if node.rank == 0:
        Path(spec["out"]).write_text(json.dumps(result))
        shutil.rmtree(scratch, ignore_errors=True)


def _operations_phase(node: _Rank, spec: dict, scratch: str, methods: list[str]) -> dict:
    """Per store and operation, the quartiles of every call's time on every rank (rank 0's answer; others' empty)."""
    stores = {STORES[method]: node.make_store(STORES[method], scratch) for method in methods}
    samples: dict[str, dict[str, list[float]]] = {name: {op: [] for op in OPERATIONS} for name in stores}
    for round_index in range(spec["op_rounds"]):
        for name in rotated(list(stores), round_index):
            tag = f"{name.replace(' ', '-')}-{round_index}"
            keys, counters = node.keys(spec["ops"], tag), node.keys(spec["ops"], f"{tag}-counter")
            node.common_start()
            everyone = node.gathered(node.operations(stores[name][0], keys, counters))
            if node.rank == 0:
                for by_operation in everyone:
                    for operation, seconds in by_operation.items():
                        samples[name][operation] += seconds
    node.barrier()
    for store, directory_fd in stores.values():
        if isinstance(store, node.mpi.MpiStore):
            store.close()
            atexit.unregister(store.close)
        if directory_fd is not None:
            os.close(directory_fd)
    node.barrier()
    if node.rank != 0:
        return {}
    return {
        name: {operation: _quartiles_us(seconds) for operation, seconds in by_operation.items()}
        for name, by_operation in samples.items()
    }


def _quartiles_us(seconds: list[float]) -> dict[str, float]:
    q1, median, q3 = statistics.quantiles(seconds, n=4) if len(seconds) > 1 else seconds * 3
    return {"median": median * 1e6, "q1": q1 * 1e6, "q3": q3 * 1e6, "n": len(seconds)}


# --- the harness -------------------------------------------------------------------------------------------------


def mpirun_command(world_size: int) -> list[str]:
    """Open MPI's ``mpirun`` on loopback and shared memory only (``--allow-run-as-root`` when root)."""
    root = ["--allow-run-as-root"] if os.geteuid() == 0 else []
    return [
        "mpirun",
        *root,
        "--oversubscribe",
        "--mca",
        "oob_tcp_if_include",
        "lo",
        "--mca",
        "btl",
        "self,vader",
        "-x",
        "GLOO_SOCKET_IFNAME=lo",
        "-x",
        "PYTHONPATH",
        "-x",
        "OMP_NUM_THREADS",
        "-n",
        str(world_size),
    ]


def _memory_available_mib() -> float:
    with open("/proc/meminfo") as meminfo:
        return int(next(line for line in meminfo if line.startswith("MemAvailable")).split()[1]) / 1024


def run_job(world_size: int, spec: dict, workdir: Path, log: Path) -> dict:
    """One mpirun job of ``world_size`` ranks; its ranks' lines are echoed as they come."""
    out = workdir / f"job-{world_size}.json"
    spec_path = workdir / f"job-{world_size}.spec.json"
    spec_path.write_text(json.dumps({**spec, "out": str(out), "scratch": str(workdir)}))
    command = [*mpirun_command(world_size), sys.executable, "-m", "benchmarks.mpi_store", "--rank-job", str(spec_path)]
    shown = [log.stat().st_size if log.exists() else 0]

    def echo() -> None:
        with open(log, "rb") as text:
            text.seek(shown[0])
            chunk = text.read()
        shown[0] += len(chunk)
        sys.stdout.write(chunk.decode(errors="replace"))
        sys.stdout.flush()

    # Importing torch costs every rank about a second of CPU: 128 ranks wait two minutes for it on 2 cores.
    methods = len(METHODS) + int(spec["before_after"])
    timeout = 240 + world_size * 4 + (spec["repetitions"] + 1) * methods * (10 + world_size * 0.5)
    wait_all([start(command, job_environment(), log)], timeout=timeout, log=log, on_tick=echo)
    return json.loads(out.read_text())


def summarise(jobs: dict[int, dict]) -> dict:
    """Per world size, each method's medians over the repetitions and mpi:// against the others; per-call latency."""
    barrier: dict = {}
    for size, job in jobs.items():
        row: dict = {}
        for method, trials in job["trials"].items():
            row[method] = {key: statistics.median(trial[key] for trial in trials) for key in trials[0]}
            row[method]["max_s_each"] = [trial["max_s"] for trial in trials]
            row[method]["first_max_s"] = job["first"][method]["max_s"]
        row["mpi_over"] = {
            method: row["mpi://"]["max_s"] / row[method]["max_s"] for method in row if method != "mpi://"
        }
        barrier[str(size)] = row
    operations = {}
    for size, job in jobs.items():
        if job.get("operations"):
            by_store = job["operations"]
            operations[str(size)] = {
                "us": by_store,
                "mpi_over": {
                    store: {op: by_store["MpiStore"][op]["median"] / by_store[store][op]["median"] for op in OPERATIONS}
                    for store in by_store
                    if store != "MpiStore"
                },
            }
    return {"first_barrier": barrier, "operations": operations}


def report_lines(results: dict) -> list[str]:
    """What the run prints at its end (and ``mpi_store.txt`` keeps)."""
    lines = [
        f"{results['command']} ({results['date']}, {results['seconds']:.0f} s; {results['mpi_library']})",
        "Time to a first barrier, slowest rank, median over the repetitions (s); mpi:// ÷ each other method:",
    ]
    for size, row in results["summary"]["first_barrier"].items():
        methods = [method for method in row if method != "mpi_over"]
        cells = "  ".join(f"{method} {row[method]['max_s']:6.3f}" for method in methods)
        ratios = "  ".join(f"÷{method} {ratio:.2f}" for method, ratio in row["mpi_over"].items())
        lines.append(f"{size:>4} ranks: {cells}   {ratios}")
    for size, by_size in results["summary"]["operations"].items():
        lines.append(f"Single operations at {size} ranks, all ranks at once, median µs per call:")
        lines.append(f"{'':16}" + "".join(f"{op:>12}" for op in OPERATIONS))
        for store, by_operation in by_size["us"].items():
            lines.append(f"{store:16}" + "".join(f"{by_operation[op]['median']:12.0f}" for op in OPERATIONS))
    return lines


# --- the documentation's blocks (benchmarks/docs.py) -------------------------------------------------------------


def _rows(results: dict) -> list[tuple[int, dict]]:
    return sorted((int(size), row) for size, row in results["summary"]["first_barrier"].items())


def _header(results: dict) -> str:
    machine = results["machine"]
    return (
        f"`{results['command']}`, {results['date']}: {machine['cpus']} CPUs ({machine['cpu_model']}), "
        f"{machine['memory_gib']:.0f} GiB, load {machine['load_before'][0]:.1f} before and "
        f"{machine['load_after'][0]:.1f} after; Python {machine['python']}, torch {machine['torch']}, "
        f"{results['mpi_library'].split(',')[0]}"
    )


def _seconds(value: float) -> str:
    return f"{value:.3f}" if value < 1 else f"{value:.2f}"


def _sizes_where(results: dict, faster: bool) -> list[int]:
    return [size for size, row in _rows(results) if (row["mpi_over"]["env://"] <= 1) == faster]


def _listed(sizes: list[int]) -> str:
    words = [str(size) for size in sizes]
    return " and ".join([", ".join(words[:-1]), words[-1]] if len(words) > 1 else words)


def summary(results: dict) -> str:
    """The README's lines: seconds to a first barrier through each store, and mpi:// against TCPStore."""
    lines = [
        (
            f"Seconds to a first barrier under `mpirun`, gloo on loopback, slowest rank, median of "
            f"{results['repetitions']} ({_header(results)}):"
        ),
        "",
        "| world size | mpi:// | env:// (TCPStore) | file:// | dir:// | mpi:// ÷ env:// |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for size, row in _rows(results):
        cells = [_seconds(row[method]["max_s"]) for method in METHODS]
        lines.append(f"| {size} | " + " | ".join(cells) + f" | {row['mpi_over']['env://']:.2f} |")
    return "\n".join(lines) + "\n"


def _verdict(results: dict) -> str:
    """Where mpi:// reached the first barrier no later than TCPStore, and where later."""
    faster, slower = _sizes_where(results, True), _sizes_where(results, False)
    if not faster:
        return f"mpi:// reached the first barrier later than env:// (TCPStore) at every size ({_listed(slower)})."
    later = f", and later at {_listed(slower)}" if slower else ""
    return f"mpi:// reached the first barrier no later than env:// (TCPStore) at {_listed(faster)} ranks{later}."


def _barrier_table(results: dict, methods: list[str]) -> list[str]:
    lines = [
        (
            f"**The mpi:// store** ({_header(results)}). One `mpirun` job per world size, gloo on loopback; seconds "
            f"from a common start until the slowest rank has passed its first barrier, median of "
            f"{results['repetitions']} alternating repetitions (after one unmeasured round, *first*):"
        ),
        "",
        "| world size | " + " | ".join(methods) + " | mpi:// ÷ env:// | mpi:// ÷ file:// | mpi:// ÷ dir:// "
        "| first round: mpi:// / env:// |",
        "|---:|" + "---:|" * (len(methods) + 4),
    ]
    for size, row in _rows(results):
        cells = [_seconds(row[method]["max_s"]) for method in methods]
        cells += [f"{row['mpi_over'][method]:.2f}" for method in METHODS[1:]]
        cells.append(f"{_seconds(row['mpi://']['first_max_s'])} / {_seconds(row['env://']['first_max_s'])}")
        lines.append(f"| {size} | " + " | ".join(cells) + " |")
    return [*lines, "", _verdict(results)]


def _time_table(results: dict, before: bool) -> list[str]:
    """Where mpi://'s time goes: the store's creation, and the CPU time the ranks used against what there was."""
    lines = [
        (
            "Where mpi://'s time goes (medians over the repetitions): `MpiStore.create` (every rank arrives, then the "
            "store's own communicator) on the slowest rank, and the rest of the trial; the CPU time all ranks used "
            "during the trial, against the CPU time the machine had in it (CPUs × trial); the share of the ranks' CPU "
            "time in the store's service threads; the other methods' CPU time:"
        ),
        "",
        "| world size | create | rest of the trial | CPU time of all ranks (s) | CPUs × trial (s) | in service threads "
        "| CPU time of all ranks: env:// / file:// / dir:// (s) |" + (" create, mpi:// before |" if before else ""),
        "|---:|---:|---:|---:|---:|---:|---:|" + ("---:|" if before else ""),
    ]
    cpus = results["machine"]["cpus"]
    for size, row in _rows(results):
        ours = row["mpi://"]
        cells = [
            _seconds(ours["rendezvous_max_s"]),
            _seconds(ours["max_s"] - ours["rendezvous_max_s"]),
            f"{ours['cpu_s']:.2f}",
            f"{cpus * ours['max_s']:.2f}",
            f"{ours['service_cpu_s'] / ours['cpu_s']:.0%}",
            " / ".join(f"{row[method]['cpu_s']:.2f}" for method in METHODS[1:]),
        ]
        if before:
            cells.append(_seconds(row[BEFORE]["rendezvous_max_s"]))
        lines.append(f"| {size} | " + " | ".join(cells) + " |")
    return lines


def _operations_table(results: dict) -> list[str]:
    operations = results["summary"]["operations"]
    sizes = sorted(operations, key=int)
    stores = list(operations[sizes[0]]["us"])
    lines = [
        (
            f"**Single store operations**: all ranks at once, each making {results['ops_per_round']} calls of each "
            f"operation in each of {results['op_rounds']} rounds (the stores alternating), on keys that MpiStore keeps "
            "on another rank; median µs per call over every call of every rank:"
        ),
        "",
        "| ranks | operation | " + " | ".join(stores) + " | MpiStore ÷ TCPStore | MpiStore ÷ FileStore "
        "| MpiStore ÷ DirectoryStore |",
        "|---:|---|" + "---:|" * (len(stores) + 3),
    ]
    for size in sizes:
        by_store, ratios = operations[size]["us"], operations[size]["mpi_over"]
        for operation in OPERATIONS:
            cells = [f"{by_store[store][operation]['median']:.0f}" for store in stores]
            cells += [f"{ratios[store][operation]:.2f}" for store in ("TCPStore", "FileStore", "DirectoryStore")]
            lines.append(f"| {size} | {operation} | " + " | ".join(cells) + " |")
    return lines


def markdown(results: dict) -> str:
    """The benchmark page's block: time to a first barrier, where mpi://'s goes, and single operations."""
    before = any(BEFORE in row for _, row in _rows(results))
    lines = _barrier_table(results, METHODS + ([BEFORE] if before else []))
    lines += ["", *_time_table(results, before)]
    if before:
        lines += [
            "",
            (
                "*mpi:// before*, *MpiStore before*: the store as it was before issue 35 (no extended API: "
                "gloo gets its peers' addresses one key at a time; poll pauses that ignore the ranks per core), "
                "in the same jobs."
            ),
        ]
    if results["summary"]["operations"]:
        lines += ["", *_operations_table(results)]
    if results["skipped"]:
        lines += ["", "Not measured:", ""] + [f"* {size} ranks: {why}" for size, why in results["skipped"].items()]
    return "\n".join(lines) + "\n"


# --- main --------------------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> None:
    """``python -m benchmarks.mpi_store [--world-sizes 2,8,32,128] [--repetitions 5] [--op-world-sizes 2,8,32]
    [--ops 100] [--op-rounds 5] [--before-after] [--out FILE]``."""
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.mpi_store", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--world-sizes", default="2,8,32,128")
    parser.add_argument("--repetitions", type=int, default=5, help="measured trials of each method per size")
    parser.add_argument("--op-world-sizes", default="2,8,32", help="the sizes that also time single store operations")
    parser.add_argument("--ops", type=int, default=100, help="calls of each operation per rank and round")
    parser.add_argument("--op-rounds", type=int, default=5)
    parser.add_argument("--before-after", action="store_true", help="also the store as it was (see above)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--rank-job", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.rank_job:
        _rank_job(args.rank_job)
        return
    if shutil.which("mpirun") is None:
        raise SystemExit("mpirun not found: install Open MPI (.ci/install)")

    described = machine()
    op_sizes = {int(size) for size in args.op_world_sizes.split(",") if size}
    started = time.monotonic()
    jobs: dict[int, dict] = {}
    skipped: dict[str, str] = {}
    rank_mib = RANK_MIB_GUESS
    with tempfile.TemporaryDirectory(prefix="ldh-bench-mpi-store-") as scratch:
        workdir = Path(scratch)
        for size in (int(size) for size in args.world_sizes.split(",")):
            available = _memory_available_mib()
            if rank_mib * size > MEMORY_MARGIN * available:
                skipped[str(size)] = (
                    f"would take about {rank_mib * size:.0f} MiB, more than {MEMORY_MARGIN:.0%} of "
                    f"the {available:.0f} MiB available"
                )
                print(f"{size} ranks {skipped[str(size)]}", flush=True)
                continue
            spec = {
                "repetitions": args.repetitions,
                "ops": args.ops if size in op_sizes else 0,
                "op_rounds": args.op_rounds,
                "before_after": args.before_after,
            }
            jobs[size] = run_job(size, spec, workdir, workdir / "ranks.log")
            rank_mib = max(rank_mib, max(jobs[size]["rank_private_mib"]) * 1.02)
    described["load_after"] = os.getloadavg()
    results = {
        "command": " ".join(["python -m benchmarks.mpi_store", *(argv if argv is not None else sys.argv[1:])]),
        "date": time.strftime("%Y-%m-%d %H:%M %Z"),
        "seconds": time.monotonic() - started,
        "machine": described,
        "mpi_library": _mpi_library_version(),
        "repetitions": args.repetitions,
        "ops_per_round": args.ops,
        "op_rounds": args.op_rounds,
        "skipped": skipped,
        "jobs": {str(size): job for size, job in jobs.items()},
        "summary": summarise(jobs),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2))
    lines = report_lines(results)
    args.out.with_suffix(".txt").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def _mpi_library_version() -> str:
    """The MPI library's first version line, from a process of its own (this one does not start MPI)."""
    from benchmarks.common import run_python

    try:
        return run_python(
            ["-c", ("from mpi4py import MPI; print(MPI.Get_library_version().replace(chr(0), '').splitlines()[0])")],
            timeout=60,
        ).strip()
    except RuntimeError as error:
        return f"MPI library unknown ({str(error).splitlines()[0]})"


if __name__ == "__main__":
    main()
