"""What every section shares: a clean loopback environment, ports, bounded process waits, the machine's description
and statistics."""

from __future__ import annotations

import importlib.util
import os
import platform
import random
import signal
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from importlib.metadata import version
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[1]


def package_module_alone(relative_path: str) -> ModuleType:
    """A module of ``lightning_dist_hooks`` loaded alone, e.g. ``"launcher_variables.py"``: through the package it
    would import Lightning into this harness, which forks the ranks it times (bootstrap.py) and would fork a heavier
    process than it measures. The file comes from the package this interpreter would import (the checkout's, or the
    installed one where .ci/compat removed the checkout's), found without importing it."""
    name = "_benchmarks_" + relative_path.removesuffix(".py").replace("/", "_")
    if name not in sys.modules:
        package = importlib.util.find_spec("lightning_dist_hooks")
        assert package is not None and package.submodule_search_locations, "lightning_dist_hooks is not importable"
        source = Path(next(iter(package.submodule_search_locations))) / relative_path
        spec = importlib.util.spec_from_file_location(name, source)
        assert spec is not None and spec.loader is not None
        module = sys.modules[name] = importlib.util.module_from_spec(spec)  # dataclasses look their module up there
        spec.loader.exec_module(module)
    return sys.modules[name]


_without_launcher_variables = package_module_alone("launcher_variables.py").without_launcher_variables


def job_environment(**overrides: str) -> dict[str, str]:
    """Loopback only, this checkout importable, one torch thread per rank (2 ranks share the cores), no launcher
    variables (inherited, they would make Lightning detect the wrong cluster)."""
    env = _without_launcher_variables(os.environ)
    env.update(
        GLOO_SOCKET_IFNAME="lo",
        MASTER_ADDR="127.0.0.1",
        OMP_NUM_THREADS="1",
        PYTHONUNBUFFERED="1",
        PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")])),
    )
    env.update(overrides)
    return env


def machine() -> dict:
    """The machine's description, as every results file records it: CPUs, memory, versions, load average now."""
    with open("/proc/meminfo") as meminfo:
        memory_kib = int(next(line for line in meminfo if line.startswith("MemTotal")).split()[1])
    with open("/proc/cpuinfo") as cpuinfo:
        model = next((line.split(":", 1)[1].strip() for line in cpuinfo if line.startswith("model name")), "unknown")
    return {
        "cpus": os.cpu_count(),
        "cpu_model": model,
        "memory_gib": memory_kib / 2**20,
        "python": platform.python_version(),
        "torch": version("torch"),
        "pytorch_lightning": version("pytorch-lightning"),
        "load_before": os.getloadavg(),
    }


def free_ports(count: int) -> list[int]:
    """``count`` distinct loopback ports, free now and outside the kernel's ephemeral range.

    The step benchmark picks every fit's port at the start and uses the last one minutes later. A port inside the
    ephemeral range can meanwhile be handed to any outgoing connection or ``bind(0)`` (gloo's own among them),
    and Lightning's ``env://`` then fails with EADDRINUSE; outside that range only an explicit bind can take it.
    """
    first_ephemeral = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    candidates = list(range(max(1024, first_ephemeral - 20000), first_ephemeral))
    random.shuffle(candidates)  # two benchmarks started together rarely probe the same ports
    ports = []
    for port in candidates:
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
        ports.append(port)
        if len(ports) == count:
            return ports
    raise RuntimeError(f"fewer than {count} free loopback ports below the ephemeral range ({first_ephemeral})")


def start(command: list[str], env: dict[str, str], log: Path) -> subprocess.Popen:
    """Start ``command`` in its own process group (so a kill reaches its children), output to ``log``."""
    with open(log, "ab") as out:
        return subprocess.Popen(
            command,
            cwd=REPO,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )


def wait_all(
    processes: list[subprocess.Popen], timeout: float, log: Path, on_tick: Callable[[], None] | None = None
) -> None:
    """Wait for every process; kill them all (and their children) at ``timeout`` s or when one fails."""
    deadline = time.monotonic() + timeout
    try:
        while any(process.poll() is None for process in processes):
            if time.monotonic() > deadline:
                raise RuntimeError(f"benchmark processes did not finish in {timeout:.0f} s; see {log}")
            if any(process.returncode not in (None, 0) for process in processes):
                break
            if on_tick:
                on_tick()
            time.sleep(0.2)
    finally:
        for process in processes:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=10)
    if on_tick:
        on_tick()
    failed = [process.args for process in processes if process.returncode != 0]
    if failed:
        tail = log.read_text(errors="replace")[-4000:]
        raise RuntimeError(f"benchmark process failed: {failed[0]!s}; end of {log}:\n{tail}")


def run_python(args: list[str], timeout: float, env: dict[str, str] | None = None) -> str:
    """Run ``python ARGS`` to completion and return its stdout."""
    completed = subprocess.run(
        [sys.executable, *args],
        cwd=REPO,
        env=env or job_environment(),
        timeout=timeout,
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        check=False,
    )
    if completed.returncode != 0:
        raise RuntimeError(f"python {' '.join(args)} failed:\n{completed.stderr[-4000:]}")
    return completed.stdout


def rotated(items: list, by: int) -> list:
    """``items`` starting at position ``by``: round r runs the variants in a different order than round r-1."""
    by %= len(items)
    return items[by:] + items[:by]


def shuffled(items: list, seed: int) -> list:
    """``items`` in a seeded random order. Unlike rotation, this does not always run the same variant right
    after the same other one, so whatever one fit leaves behind (garbage, caches) does not favour one variant."""
    return random.Random(seed).sample(items, len(items))


def summary(values: list[float]) -> dict[str, float]:
    """Median and interquartile range (robust against the outliers a shared machine produces)."""
    if len(values) == 1:
        return {"median": values[0], "q1": values[0], "q3": values[0], "n": 1}
    q1, _, q3 = statistics.quantiles(values, n=4)
    return {"median": statistics.median(values), "q1": q1, "q3": q3, "n": len(values)}


def in_ms(stats: dict) -> dict:
    """``summary`` of seconds, as milliseconds."""
    return {key: value * 1e3 if key != "n" else value for key, value in stats.items()}


def bootstrap_ci(values: list[float], level: float = 0.95, resamples: int = 2000) -> tuple[float, float]:
    """Percentile bootstrap confidence interval of the median of ``values`` (seeded: reruns give the same CI)."""
    generator = random.Random(0)
    medians = sorted(statistics.median(generator.choices(values, k=len(values))) for _ in range(resamples))
    tail = (1 - level) / 2
    return medians[int(tail * resamples)], medians[int((1 - tail) * resamples) - 1]
