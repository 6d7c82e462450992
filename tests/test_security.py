"""``file://`` and ``dir://`` against another user of the same shared filesystem (issues 9, 21), with real
unprivileged users.

As root, the tests create two users, ``ldh-victim`` and ``ldh-attacker`` (and a group ``ldh-project`` holding
both), and run the victim's ranks and the attacker's processes as them. The victim's job is started as Flux
starts it (its job id is public, so the per-job file name is predictable). Every attack runs with
``fs.protected_regular``/``fs.protected_symlinks`` at 0 (as on NFS and Lustre) and at the distribution's
defaults, with a per-job (``file:///DIR/``) and an explicit (``file:///DIR/NAME``) path. The victim must never
complete a fit with a foreign rank, never wait past its timeout, never create a file outside the rendezvous
directory, and must get a message naming the path and its owner. ``dir://`` shares ``file://``'s handler, so
the attacks on the rendezvous file run against both; what is ``dir://``'s own (its store's directory, a key file
planted, linked or owned by another user) is attacked at the end.
"""

from __future__ import annotations

import grp
import json
import logging
import multiprocessing
import os
import pwd
import shutil
import stat
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest
from helpers import FIT_JOB, REPO, Rank, job_environment
from run_locks import holding, holding_shared, record_file_contents, record_mode, restore

from lightning_dist_hooks.init_methods import FileInitMethod, rendezvous_file_for_job

VICTIM, ATTACKER, PROJECT_GROUP = "ldh-victim", "ldh-attacker", "ldh-project"
JOB_ID = "f42security"
TIMEOUT_S = 20  # the victim's process-group timeout
STARTUP_S = 40  # a rank's start-up on a busy 2-core machine, before its rendezvous begins
FIT_FLAGS = ["--backend", "gloo", "--setup-hook", "record", "--epochs", "1", "--timeout", str(TIMEOUT_S)]
# Debian's /usr/lib/sysctl.d/protect-links.conf
DISTRIBUTION_DEFAULTS = {"protected_regular": "2", "protected_symlinks": "1"}

pytestmark = [
    pytest.mark.slow,
    pytest.mark.root,
    pytest.mark.skipif(os.geteuid() != 0, reason="creating users and running processes as them needs root"),
]


def _ensure_user(name: str) -> None:
    if subprocess.run(["id", "-u", name], capture_output=True).returncode != 0:
        created = subprocess.run(
            ["useradd", "--system", "--user-group", "--no-create-home", "--shell", "/usr/sbin/nologin", name],
            capture_output=True,
            text=True,
        )
        # Another session may have created it meanwhile: only its absence now is an error.
        assert subprocess.run(["id", "-u", name], capture_output=True).returncode == 0, created.stderr


def _unreadable_ancestor(path: Path) -> tuple[Path, str] | None:
    """The first directory above ``path`` that other users cannot enter, and the name below it on the path."""
    for parent, child in zip([*reversed(path.parents)][:-1], [*reversed(path.parents)][1:], strict=True):
        if not os.stat(parent).st_mode & stat.S_IXOTH:
            return parent, child.name
    return None


# Run as USER. Where the interpreter or the checkout lives under a directory others cannot enter (pyenv in /root,
# a CI clone under a private directory), a private mount namespace shows only those trees there (a tmpfs over the
# directory, the trees bound back in), without changing the machine's permissions. Arguments after the user and
# the staging directory: the number of (directory, name) pairs, the pairs, then the command.
_AS_USER = textwrap.dedent("""\
    set -e
    user=$1 stage=$2 pairs=$3; shift 3
    i=0; hidden=" "
    while [ $i -lt $pairs ]; do
        eval "blocked_$i=\\$1 child_$i=\\$2"; shift 2
        eval "mkdir -p $stage/$i && mount --bind \\"\\$blocked_$i/\\$child_$i\\" $stage/$i"
        i=$((i + 1))
    done
    i=0
    while [ $i -lt $pairs ]; do
        eval "blocked=\\$blocked_$i child=\\$child_$i"
        case "$hidden" in
            *" $blocked "*) ;;
            *) mount -t tmpfs -o mode=0755 tmpfs "$blocked"; hidden="$hidden$blocked " ;;
        esac
        mkdir -p "$blocked/$child"
        mount --bind "$stage/$i" "$blocked/$child"
        i=$((i + 1))
    done
    exec setpriv --reuid="$user" --regid="$user" --init-groups -- "$@"
""")


class Users:
    def __init__(self, stage: Path) -> None:
        self.stage = stage
        # A virtual environment's prefix holds its packages, its base prefix the interpreter and the standard library.
        trees = {Path(sys.prefix).resolve(), Path(sys.base_prefix).resolve(), REPO}
        ancestors = [_unreadable_ancestor(tree) for tree in trees]
        self.blocked = sorted({pair for pair in ancestors if pair is not None})
        self.uid = {name: pwd.getpwnam(name).pw_uid for name in (VICTIM, ATTACKER)}
        self.gid = {name: pwd.getpwnam(name).pw_gid for name in (VICTIM, ATTACKER)}
        self.project_gid = grp.getgrnam(PROJECT_GROUP).gr_gid

    def command(self, user: str, command: list[str]) -> list[str]:
        pairs = [str(part) for pair in self.blocked for part in pair]
        return [
            "unshare",
            "--mount",
            "--propagation",
            "private",
            "sh",
            "-c",
            _AS_USER,
            "sh",
            user,
            str(self.stage),
            str(len(self.blocked)),
            *pairs,
            *command,
        ]

    def popen(self, user: str, command: list[str], cwd: Path, log: Path, env: dict[str, str]) -> subprocess.Popen:
        with open(log, "w") as output:
            return subprocess.Popen(
                self.command(user, command),
                cwd=cwd,
                env=env,
                stdout=output,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )

    def python(self, user: str, code: str, cwd: Path, **env: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            self.command(user, [sys.executable, "-c", code]),
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=120,
            env=job_environment(HOME=str(cwd), **env),
        )


@pytest.fixture(scope="session")
def users(request):
    with holding(request.config, "users"):  # useradd fails while another holds /etc/passwd's lock
        for name in (VICTIM, ATTACKER):
            _ensure_user(name)
        subprocess.run(["groupadd", "-f", PROJECT_GROUP], check=True)
        for name in (VICTIM, ATTACKER):
            subprocess.run(["usermod", "-aG", PROJECT_GROUP, name], check=True)
        # A clone made in a private directory (mktemp -d, as CI may) is opened to others for the run; the run's
        # controller closes it again at the end (conftest.py), when no worker needs it any more.
        record_mode(request.config, "checkout", REPO)
        REPO.chmod(stat.S_IMODE(REPO.stat().st_mode) | 0o055)
    stage = Path(tempfile.mkdtemp(prefix="ldh-security-stage-"))
    try:
        users = Users(stage)
        probe = users.python(VICTIM, "import torch, pytorch_lightning, lightning_dist_hooks", Path("/"))
        assert probe.returncode == 0, f"{VICTIM} cannot run this interpreter and checkout:\n{probe.stderr[-3000:]}"
        yield users
    finally:
        shutil.rmtree(stage, ignore_errors=True)


@pytest.fixture(params=["sysctl-zero", "sysctl-defaults"])
def protections(request):
    """fs.protected_regular and fs.protected_symlinks at 0 (NFS, Lustre) or the distribution's defaults; tests that
    want the same run side by side (run_locks.holding_shared)."""
    settings = dict.fromkeys(DISTRIBUTION_DEFAULTS, "0") if request.param == "sysctl-zero" else DISTRIBUTION_DEFAULTS
    files = {Path(f"/proc/sys/fs/{name}"): value for name, value in settings.items()}

    def set_them() -> None:
        record_file_contents(request.config, "sysctl", list(files))
        for path, value in files.items():
            path.write_text(value)

    with holding_shared(request.config, "sysctl", request.param, set_them, lambda: restore(request.config, "sysctl")):
        yield settings
        now = {path.name: path.read_text().strip() for path in files}
        assert now == settings, f"{now} at the end of the test, not {settings}: the run's sysctl lock did not hold"


@pytest.fixture
def base(users):
    """A directory every user can enter, holding the victim's home and whatever shared directories a test makes."""
    directory = Path(tempfile.mkdtemp(prefix="ldh-security-"))
    directory.chmod(0o755)
    for name in (VICTIM, ATTACKER):
        home = directory / f"home-{name}"
        home.mkdir(mode=0o700)
        os.chown(home, users.uid[name], users.gid[name])
    yield directory
    shutil.rmtree(directory)


def shared_directory(base: Path, users: Users, kind: str) -> Path:
    """A shared directory as clusters have them, made by its owner."""
    directory = base / kind
    if kind == "attacker-owned":  # made by the attacker in a public directory, as anyone can
        public = base / "public"
        public.mkdir(mode=0o755, exist_ok=True)
        public.chmod(0o1777)
        directory = public / kind
        made = users.python(
            ATTACKER,
            f"import os; os.mkdir({str(directory)!r}); os.chmod({str(directory)!r}, 0o1777)",
            base / f"home-{ATTACKER}",
        )
        assert made.returncode == 0, made.stderr
        return directory
    directory.mkdir()
    if kind == "world-writable-sticky":  # /tmp, /scratch
        directory.chmod(0o1777)
    elif kind == "group-writable-sticky":  # a project directory
        os.chown(directory, 0, users.project_gid)
        directory.chmod(0o1775)
    return directory


def victim_flux_rank(rank: int, base: Path) -> dict[str, str]:
    return job_environment(
        FLUX_TASK_RANK=str(rank),
        FLUX_TASK_LOCAL_ID=str(rank),
        FLUX_JOB_SIZE="2",
        FLUX_JOB_NNODES="1",
        FLUX_JOB_ID=JOB_ID,
        PMI_RANK=str(rank),
        PMI_SIZE="2",
        HOME=str(base / f"home-{VICTIM}"),
    )


def predicted_name(directory: Path) -> str:
    """What anyone who reads the job id computes for a per-job file."""
    return Path(rendezvous_file_for_job(f"file://{directory}/", f"FLUX_JOB_ID={JOB_ID}")[len("file://") :]).name


def victim_url(directory: Path, path_kind: str, scheme: str = "file") -> tuple[str, str]:
    """The victim's torch_dist_init_method, and the file name it leads to."""
    if path_kind == "per-job":
        return f"{scheme}://{directory}/", predicted_name(directory)
    return f"{scheme}://{directory}/rdzv", "rdzv"


class Run:
    def __init__(self, returncode: int, output: str, elapsed: float, out_dir: Path) -> None:
        self.returncode, self.output, self.elapsed = returncode, output, elapsed
        self.records = sorted(out_dir.glob("rank*.json")) if out_dir.is_dir() else []


def run_victim_ranks(
    users: Users,
    base: Path,
    url: str,
    ranks: list[int],
    attacker_store: Path | None = None,
    limit_s: float = TIMEOUT_S + STARTUP_S + 30,
) -> Run:
    """The victim's ranks (and, if given, the attacker's process playing rank 1 through torch's own ``FileStore`` at
    ``attacker_store``); killed after ``limit_s``."""
    work = base / f"home-{VICTIM}"
    out = work / "out"
    processes, logs = [], []
    started = time.monotonic()
    for rank in ranks:
        logs.append(work / f"rank{rank}.log")
        processes.append(
            users.popen(
                VICTIM,
                [sys.executable, str(FIT_JOB), "--out", str(out), "--init-method", url, *FIT_FLAGS],
                work,
                logs[-1],
                victim_flux_rank(rank, base),
            )
        )
    attacker = None
    if attacker_store is not None:
        home = base / f"home-{ATTACKER}"
        attacker = users.popen(
            ATTACKER,
            [sys.executable, "-c", ATTACKER_RANK_1, str(attacker_store)],
            home,
            home / "rank1.log",
            job_environment(HOME=str(home)),
        )
    try:
        returncodes = [process.wait(timeout=max(1.0, limit_s - (time.monotonic() - started))) for process in processes]
    except subprocess.TimeoutExpired:
        returncodes = [-999]
    elapsed = time.monotonic() - started
    for process in [*processes, attacker]:
        if process is not None and process.poll() is None:
            process.kill()
            process.wait(timeout=30)
    output = "\n".join(f"===== {log.name}\n{log.read_text()[-4000:]}" for log in logs)
    if attacker is not None:
        attacker_log = (base / f"home-{ATTACKER}" / "rank1.log").read_text()
        assert ATTACKER_JOINED not in attacker_log, f"the attacker's rank 1 joined the victim's group:\n{output}"
    return Run(max(returncodes, key=abs), output, elapsed, out)


# The attacker's rank 1: no Lightning and no lightning_dist_hooks (whose own checks would keep it out of the file),
# only torch's FileStore on the file it planted where the victim's rank 0 would meet, as an attacker would write it.
ATTACKER_JOINED = "the attacker joined"
ATTACKER_RANK_1 = f"""
import datetime, sys
import torch.distributed as dist
dist.init_process_group(
    "gloo", init_method="file://" + sys.argv[1], rank=1, world_size=2, timeout=datetime.timedelta(seconds={TIMEOUT_S})
)
print({ATTACKER_JOINED!r}, flush=True)
"""


def assert_refused(run: Run, named_path: Path, owner: str | None) -> None:
    """The victim stopped at once, trained with nobody, and said which path (and whose) is the problem."""
    assert run.returncode not in (0, -999), f"the victim's rank did not fail in {run.elapsed:.0f} s:\n{run.output}"
    assert run.elapsed < TIMEOUT_S + STARTUP_S, f"the victim waited {run.elapsed:.0f} s:\n{run.output}"
    assert not run.records, "the victim completed a fit"
    assert str(named_path) in run.output, run.output
    if owner is not None:
        assert f"owned by {owner}" in run.output, run.output


def plant(users: Users, base: Path, code: str) -> None:
    done = users.python(ATTACKER, textwrap.dedent(code), base / f"home-{ATTACKER}")
    assert done.returncode == 0, done.stderr


def private_directory(users: Users, shared: Path) -> Path:
    return shared / f"ldh-uid-{users.uid[VICTIM]}"


@pytest.mark.parametrize("scheme", ["file", "dir"])
@pytest.mark.parametrize("path_kind", ["per-job", "explicit"])
@pytest.mark.parametrize("directory_kind", ["world-writable-sticky", "group-writable-sticky", "attacker-owned"])
def test_a_file_planted_at_the_predicted_name_never_joins_the_victims_job(
    users, base, protections, directory_kind, path_kind, scheme
):
    shared = shared_directory(base, users, directory_kind)
    url, name = victim_url(shared, path_kind, scheme)
    private = private_directory(users, shared)
    # The attacker pre-creates the file, mode 0666, where the victim's job will look for it (in the shared
    # directory itself, and in the victim's per-user directory, whose name holds the public uid), then plays rank 1
    # through the file in the per-user directory, where the victim's rank 0 would meet.
    plant(
        users,
        base,
        f"""
        import os
        for directory in ({str(shared)!r}, {str(private)!r}):
            if directory == {str(private)!r}:
                os.mkdir(directory, 0o777)
                os.chmod(directory, 0o777)
            os.close(os.open(os.path.join(directory, {name!r}), os.O_CREAT | os.O_WRONLY, 0o666))
            os.chmod(os.path.join(directory, {name!r}), 0o666)
    """,
    )
    run = run_victim_ranks(users, base, url, [0], attacker_store=private / name)
    refused = shared if directory_kind == "attacker-owned" else private
    assert_refused(run, refused, ATTACKER)


@pytest.mark.parametrize("scheme", ["file", "dir"])
@pytest.mark.parametrize("path_kind", ["per-job", "explicit"])
def test_a_symlink_at_the_predicted_name_is_never_followed(users, base, protections, path_kind, scheme):
    shared = shared_directory(base, users, "world-writable-sticky")
    url, name = victim_url(shared, path_kind, scheme)
    private = private_directory(users, shared)
    home = base / f"home-{VICTIM}"
    plant(
        users,
        base,
        f"""
        import os
        os.symlink({str(home / "planted-target")!r}, os.path.join({str(shared)!r}, {name!r}))
        os.symlink({str(home)!r}, {str(private)!r})
    """,
    )
    run = run_victim_ranks(users, base, url, [0, 1])
    assert_refused(run, private, ATTACKER)
    # What the job itself puts in its home (logs, its out directory, caches) is all there is.
    created = sorted(
        path.name
        for path in home.iterdir()
        if path.suffix != ".log" and path.name != "out" and not path.name.startswith(".")
    )
    assert created == [], "the victim created files where the attacker's symlink pointed"


@pytest.mark.parametrize(
    "scheme, complaint",
    [("file", "is not a torch FileStore log"), ("dir", "does not name a dir:// rendezvous directory")],
)
@pytest.mark.parametrize("path_kind", ["per-job", "explicit"])
def test_junk_in_the_victims_own_leftover_file_is_an_error_not_a_hang(
    users, base, protections, path_kind, scheme, complaint
):
    shared = shared_directory(base, users, "world-writable-sticky")
    url, name = victim_url(shared, path_kind, scheme)
    private = private_directory(users, shared)
    # A few bytes of junk in a file of the victim's own (a crash mid-write): FileStore would read a huge record
    # length and loop forever holding its lock. Planted where the old and the new code look.
    made = users.python(
        VICTIM,
        textwrap.dedent(f"""
        import os
        os.mkdir({str(private)!r}, 0o700)
        for directory in ({str(shared)!r}, {str(private)!r}):
            descriptor = os.open(os.path.join(directory, {name!r}), os.O_CREAT | os.O_WRONLY, 0o600)
            os.write(descriptor, b"\\xff\\xff\\xff\\x7fjunk")
            os.close(descriptor)
    """),
        base / f"home-{VICTIM}",
    )
    assert made.returncode == 0, made.stderr
    run = run_victim_ranks(users, base, url, [0, 1])
    assert_refused(run, private / name, owner=None)
    assert complaint in run.output


# Two ranks of an earlier run of the victim that met through PATH and were killed before cleaning up: the file
# holds torch's own keys (the group's members and gloo's addresses), valid as a FileStore log, and no claim.
_EARLIER_RUN = """
import os, subprocess, sys
path, rank = sys.argv[1], sys.argv[2:]
if not rank:
    os.mkdir(os.path.dirname(path), 0o700)
    ranks = [subprocess.Popen([sys.executable, __file__, path, str(r)]) for r in (0, 1)]
    sys.exit(max(process.wait(timeout=90) for process in ranks))
import torch.distributed as dist
dist.init_process_group("gloo", init_method="file://" + path, rank=int(rank[0]), world_size=2)
dist.barrier()
os.chmod(path, 0o600)
os._exit(0)  # killed: no destroy_process_group, no removal
"""


@pytest.mark.parametrize("path_kind", ["per-job", "explicit"])
def test_a_valid_log_left_by_the_victims_earlier_run_stops_every_rank_at_once(users, base, path_kind):
    shared = shared_directory(base, users, "world-writable-sticky")
    url, name = victim_url(shared, path_kind)
    private = private_directory(users, shared)
    stale = private / name
    home = base / f"home-{VICTIM}"
    script = home / "earlier_run.py"
    script.write_text(_EARLIER_RUN)
    made = subprocess.run(
        users.command(VICTIM, [sys.executable, str(script), str(stale)]),
        cwd=home,
        capture_output=True,
        text=True,
        timeout=120,
        env=job_environment(HOME=str(home), GLOO_SOCKET_IFNAME="lo"),
    )
    assert made.returncode == 0, made.stderr[-3000:]
    left = stale.read_bytes()
    assert b"/default_pg/" in left or b"/0" in left, "the earlier run left no torch keys: nothing is tested"
    run = run_victim_ranks(users, base, url, [0, 1])
    assert_refused(run, stale, owner=None)
    assert "exists, but no rank of this run made it" in run.output, run.output
    assert stale.read_bytes() == left, "another run's file is never changed or deleted automatically"
    assert sorted(path.name for path in private.iterdir()) == [name], "claims or drafts were left behind"


@pytest.mark.parametrize("scheme", ["file", "dir"])
def test_an_honest_two_rank_run_in_a_world_writable_sticky_directory_trains(users, base, scheme):
    shared = shared_directory(base, users, "world-writable-sticky")
    run = run_victim_ranks(users, base, f"{scheme}://{shared}/", [0, 1])
    assert run.returncode == 0, run.output
    records = [json.loads(path.read_text()) for path in run.records]
    assert sorted(record["rank"] for record in records) == [0, 1]
    assert len({record["weights_sha256"] for record in records}) == 1
    private = private_directory(users, shared)
    for record in records:
        assert record["setup_calls"][0]["init_method"].startswith(f"{scheme}://{private}/ldh-rendezvous-FLUX_JOB_ID-")
    assert list(shared.iterdir()) == [], "a clean run leaves the shared directory as it found it"


_TRAINER = """
import json, os, sys
from lightning_dist_hooks import Trainer
results = {}
for url in sys.argv[1:]:
    try:
        Trainer(accelerator="cpu", devices=2, strategy="ddp", logger=False, torch_dist_init_method=url)
        results[url] = "accepted"
    except ValueError as error:
        results[url] = str(error)
print(json.dumps(results))
"""


def test_directories_other_users_control_are_refused_at_trainer_construction(users, base):
    world_writable = base / "world-writable"
    world_writable.mkdir()
    world_writable.chmod(0o777)
    attacker_owned = shared_directory(base, users, "attacker-owned")
    real = base / f"home-{VICTIM}"
    link = base / "link-to-victim-home"
    link.symlink_to(real)
    sticky = shared_directory(base, users, "world-writable-sticky")
    plant(users, base, f"import os; os.mkdir({str(sticky / 'rdzv')!r}, 0o777)")
    cases = {
        f"file://{world_writable}/": (str(world_writable), "without the sticky bit", "chmod +t"),
        f"file://{attacker_owned}/": (str(attacker_owned), f"owned by {ATTACKER}", "Use a directory owned by you"),
        f"file://{link}/": (str(link), "is a symbolic link", f"file://{real}/"),
        # A directory created at the victim's explicit file name does not switch to per-job files inside it.
        f"file://{sticky}/rdzv": (str(sticky / "rdzv"), f"owned by {ATTACKER}", "end the URL with a slash"),
        # dir:// takes the same URLs through the same checks.
        f"dir://{world_writable}/": (str(world_writable), "without the sticky bit", "chmod +t"),
        f"dir://{attacker_owned}/": (str(attacker_owned), f"owned by {ATTACKER}", "Use a directory owned by you"),
        f"dir://{sticky}/rdzv": (str(sticky / "rdzv"), f"owned by {ATTACKER}", "end the URL with a slash ('dir://"),
    }
    done = subprocess.run(
        users.command(VICTIM, [sys.executable, "-c", _TRAINER, *cases]),
        cwd=real,
        capture_output=True,
        text=True,
        timeout=120,
        env=job_environment(HOME=str(real)),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(done.stdout.strip().splitlines()[-1])
    for url, expected in cases.items():
        assert f"torch_dist_init_method={url!r}" in results[url], results[url]
        for part in expected:
            assert part in results[url], (url, results[url])


def test_filestores_0644_reopen_exposes_nothing(users, base):
    shared = shared_directory(base, users, "world-writable-sticky")
    private = private_directory(users, shared)
    # FileStore reopens its file by name with O_CREAT and mode 0644 on every operation: after an unlink it makes
    # a world-readable file. Inside the per-user directory nobody else can reach it.
    made = users.python(
        VICTIM,
        textwrap.dedent(f"""
        import os
        from datetime import timedelta
        import torch.distributed as dist
        from lightning_dist_hooks.init_methods import FileInitMethod

        class Rank0:
            def global_rank(self):
                return 0

            def world_size(self):
                return 1

        rendezvous = FileInitMethod().prepare("file://{shared}/rdzv", Rank0())
        path = rendezvous.init_method[len("file://"):]
        store = dist.FileStore(path, 1)
        os.unlink(path)
        store.set("secret", "weights")
        print(path, oct(os.stat(path).st_mode & 0o777))
    """),
        base / f"home-{VICTIM}",
    )
    assert made.returncode == 0, made.stderr[-3000:]
    path, mode = made.stdout.split()
    assert mode == "0o644", "FileStore no longer recreates its file world-readable: this test can go"
    assert Path(path).parent == private
    read = users.python(ATTACKER, f"print(open({path!r}).read())", base / f"home-{ATTACKER}")
    assert read.returncode != 0 and "PermissionError" in read.stderr, read.stdout


def test_a_claim_is_not_left_behind_when_prepare_fails(tmp_path):
    private = tmp_path / f"ldh-uid-{os.geteuid()}"
    private.mkdir(mode=0o700)
    (private / "rdzv").mkdir()  # something that cannot be opened as the rendezvous file
    (tmp_path / "rdzv").mkdir()  # where the old code looked
    with pytest.raises(RuntimeError, match=r"is not a regular file with one link private to this user"):
        FileInitMethod().prepare(f"file://{tmp_path}/rdzv", Rank(0))
    assert sorted(path.name for path in private.iterdir()) == ["rdzv"], "the claim leaked"


def test_a_stale_claim_is_judged_by_the_file_it_names_not_by_when_ranks_arrive(tmp_path):
    # An earlier run's rank 1 claimed a file that is gone now (its claim survived, the file did not).
    private = tmp_path / f"ldh-uid-{os.geteuid()}"
    private.mkdir(mode=0o700)
    (tmp_path / "rdzv.rank1.claim").touch(mode=0o600)  # where the old code kept claims
    gone = private / "gone"
    gone.touch()
    (private / "rdzv.rank1.claim").write_text(f"{gone.stat().st_dev} {gone.stat().st_ino}\n")
    (private / "rdzv.rank1.claim").chmod(0o600)
    # This run's rank 0 arrives first and creates the file; its rank 1 arrives later and finds the old claim.
    first = FileInitMethod().prepare(f"file://{tmp_path}/rdzv", Rank(0))
    second = FileInitMethod().prepare(f"file://{tmp_path}/rdzv", Rank(1))
    assert second.file == first.file and first.file.exists()
    for rendezvous in (first, second):
        FileInitMethod().finish(rendezvous)
    assert sorted(private.iterdir()) == [gone]


def test_a_valid_filestore_log_that_no_claim_records_is_refused_by_every_rank(tmp_path):
    import torch.distributed as dist

    private = tmp_path / f"ldh-uid-{os.geteuid()}"
    private.mkdir(mode=0o700)
    stale = private / "rdzv"
    store = dist.FileStore(str(stale), 2)  # an earlier run's rank, killed after writing its keys
    store.set("/default_pg/0//cpu//0", "198.18.0.1:40000")
    del store
    stale.chmod(0o600)
    left = stale.read_bytes()
    for rank in (0, 1):
        with pytest.raises(
            RuntimeError,
            match=rf"{stale} exists, but no rank of this run made it: none of "
            rf"{stale}.rank0.claim to .rank1.claim records it",
        ):
            FileInitMethod().prepare(f"file://{tmp_path}/rdzv", Rank(rank))
    assert stale.read_bytes() == left
    assert sorted(path.name for path in private.iterdir()) == ["rdzv"]


def test_a_rank_joins_while_the_makers_draft_name_still_links_the_file(tmp_path):
    # Rank 0 has recorded its draft in its claim and linked it to the rendezvous name, and not yet removed the
    # draft name: the file has two links, both known.
    private = tmp_path / f"ldh-uid-{os.geteuid()}"
    private.mkdir(mode=0o700)
    draft, path = private / "rdzv.rank0.draft", private / "rdzv"
    draft.touch(mode=0o600)
    claim = private / "rdzv.rank0.claim"
    claim.write_text(f"{draft.stat().st_dev} {draft.stat().st_ino}\n")
    claim.chmod(0o600)
    os.link(draft, path)
    joined = FileInitMethod().prepare(f"file://{tmp_path}/rdzv", Rank(1))
    assert joined.file == path
    assert (private / "rdzv.rank1.claim").read_text().split() == claim.read_text().split()
    FileInitMethod().finish(joined)
    # A second link that is not the maker's draft is refused.
    other = tmp_path / "other"
    other.touch(mode=0o600)
    os.link(other, private / "rdzv")
    draft.unlink()
    claim.write_text(f"{other.stat().st_dev} {other.stat().st_ino}\n")
    with pytest.raises(RuntimeError, match=r", 2 links is not a regular file with one link private to this user"):
        FileInitMethod().prepare(f"file://{tmp_path}/rdzv", Rank(1))


def _prepare_together(url: str, rank: int, world_size: int, start, results) -> None:
    start.wait(timeout=60)
    try:
        rendezvous = FileInitMethod().prepare(url, Rank(rank, world_size))
    except RuntimeError as error:
        results.put(str(error))
        start.abort()  # the others stop waiting for this rank
        return
    results.put(None)
    try:
        start.wait(timeout=60)  # every rank has joined before any removes the file
    finally:
        FileInitMethod().finish(rendezvous)


def test_ranks_arriving_at_the_same_moment_all_join_the_one_file(tmp_path):
    # Makers and joiners racing, many times over: a joiner must always find the maker's claim whole.
    context = multiprocessing.get_context("fork")
    world_size, rounds = 4, 40
    for round_ in range(rounds):
        url = f"file://{tmp_path}/rdzv{round_}"
        start, results = context.Barrier(world_size), context.Queue()
        ranks = [
            context.Process(target=_prepare_together, args=(url, rank, world_size, start, results))
            for rank in range(world_size)
        ]
        for process in ranks:
            process.start()
        errors = [results.get(timeout=60) for _ in ranks]
        for process in ranks:
            process.join(timeout=60)
        assert errors == [None] * world_size, f"round {round_}: {errors}"
    assert list(tmp_path.iterdir()) == []


def test_finish_removes_each_file_on_its_own_and_reports_what_it_could_not(tmp_path, caplog):
    rendezvous = FileInitMethod().prepare(f"file://{tmp_path}/rdzv", Rank(0))
    rendezvous.file.unlink()
    rendezvous.file.mkdir()
    (rendezvous.file / "keep").mkdir()  # remove_entry removes a directory of files, never one holding a directory
    with caplog.at_level(logging.WARNING):
        FileInitMethod().finish(rendezvous)
    assert not rendezvous.claim.exists(), "the claim must be removed although the file could not be"
    assert f"could not remove the rendezvous files {rendezvous.file}" in caplog.text


def test_the_janitor_leaves_a_file_that_replaced_ours(tmp_path):
    rendezvous = FileInitMethod().prepare(f"file://{tmp_path}/rdzv", Rank(0))
    rendezvous.file.unlink()
    rendezvous.file.write_text("someone else's")  # the same name, another file
    janitor = rendezvous.janitor
    assert janitor is not None
    os.close(janitor._socket_fd)  # the rank dies
    assert janitor.process.wait(timeout=10) == 0
    assert rendezvous.file.read_text() == "someone else's"
    assert not rendezvous.claim.exists()


_KILLED_RANK = """
import os, signal, sys
from pathlib import Path
sys.path.insert(0, {tests!r})
from helpers import Rank
from lightning_dist_hooks.init_methods import FileInitMethod
rendezvous = FileInitMethod().prepare({url!r}, Rank(0))
print(rendezvous.file, rendezvous.claim, flush=True)
rendezvous.file.unlink()
rendezvous.file.write_text("a later run's")  # the same name, another file: only this user can put one there
os.chmod(rendezvous.file, 0o600)
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_the_victims_janitor_removes_only_the_files_its_killed_rank_made(users, base):
    shared = shared_directory(base, users, "world-writable-sticky")
    home = base / f"home-{VICTIM}"
    code = _KILLED_RANK.format(tests=str(REPO / "tests"), url=f"file://{shared}/rdzv")
    killed = users.python(VICTIM, code, home)
    assert killed.returncode == -9, killed.stderr[-3000:]
    file, claim = (Path(part) for part in killed.stdout.split())
    deadline = time.monotonic() + 20
    while claim.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not claim.exists(), "the janitor did not remove the claim of its killed rank"
    assert file.read_text() == "a later run's", "the janitor removed a file it had not been given"
    # Another user cannot have made that swap: the per-user directory is closed to them.
    swap = users.python(ATTACKER, f"open({str(file.parent / 'x')!r}, 'w')", base / f"home-{ATTACKER}")
    assert swap.returncode != 0 and "PermissionError" in swap.stderr, swap.stderr


@pytest.mark.parametrize("kind", ["hard-linked", "group-readable", "fifo"])
def test_a_pre_existing_file_is_used_only_if_it_is_a_private_regular_file_with_one_link(tmp_path, kind):
    private = tmp_path / f"ldh-uid-{os.geteuid()}"
    private.mkdir(mode=0o700)
    path = private / "rdzv"
    if kind == "fifo":
        os.mkfifo(path, 0o600)
    else:
        path.touch(mode=0o600)
        if kind == "hard-linked":
            os.link(path, tmp_path / "elsewhere")
        else:
            path.chmod(0o640)
    with pytest.raises(
        RuntimeError,
        match=rf"{path}' \(a .*owned by .*\).* is not a regular file with one link "
        r"private to this user",
    ):
        FileInitMethod().prepare(f"file://{tmp_path}/rdzv", Rank(0))
    assert sorted(entry.name for entry in private.iterdir()) == ["rdzv"], "the claim must not be left behind"


# --- dir:// only: its store's directory and key files ---------------------------------------------------------


def test_a_leftover_dir_rendezvous_of_the_victims_earlier_run_stops_every_rank_at_once(users, base):
    # A dir:// run whose ranks and janitors were all killed (a crashed node): its rendezvous file, the store's
    # directory it names, and gloo's keys in it, but no claim. A new run must never read those keys.
    shared = shared_directory(base, users, "world-writable-sticky")
    url, name = victim_url(shared, "explicit", "dir")
    private = private_directory(users, shared)
    made = users.python(
        VICTIM,
        textwrap.dedent(f"""
        import os
        os.mkdir({str(private)!r}, 0o700)
        store = os.path.join({str(private)!r}, {name!r} + ".0123456789abcdef.d")
        os.mkdir(store, 0o700)
        for path, content in ((os.path.join({str(private)!r}, {name!r}), os.path.basename(store).encode()),
                              (os.path.join(store, "k.0%2F%2Fcpu%2F%2F0%2F1.1"), b"=an earlier run's address")):
            descriptor = os.open(path, os.O_CREAT | os.O_WRONLY, 0o600)
            os.write(descriptor, content)
            os.close(descriptor)
    """),
        base / f"home-{VICTIM}",
    )
    assert made.returncode == 0, made.stderr
    before = sorted(str(path) for path in private.rglob("*"))
    run = run_victim_ranks(users, base, url, [0, 1])
    assert_refused(run, private / name, owner=None)
    assert "exists, but no rank of this run made it" in run.output, run.output
    assert sorted(str(path) for path in private.rglob("*")) == before, "another run's files are never touched"


_STORE_AS_VICTIM = """
import os, sys
from datetime import timedelta
from pathlib import Path
import torch.distributed as dist
from lightning_dist_hooks.init_methods import DirectoryStore
directory = Path(sys.argv[1])
store = DirectoryStore(os.open(directory, os.O_RDONLY | os.O_DIRECTORY), directory, timedelta(seconds=5))
for key in ("planted", "linked", "foreign"):
    try:
        print(key, "read", store.get(key))
    except dist.DistStoreError as error:
        print(key, "refused", error)
"""


def test_key_files_the_victims_store_did_not_write_are_refused(users, base):
    # The per-user directory keeps other users out of the store's directory; should that fail (an administrator's
    # mistake, a restored backup), each key file is still checked before use. Here root puts in the victim's store
    # directory: a key file open to everyone, a symlink at a key's name to a file of the attacker, and a key file
    # owned by the attacker (mode 0600).
    store = base / f"home-{VICTIM}" / "store.d"
    store.mkdir(mode=0o700)
    os.chown(store, users.uid[VICTIM], users.gid[VICTIM])
    attackers = base / f"home-{ATTACKER}" / "value"
    attackers.write_bytes(b"=attacker's address")
    os.chown(attackers, users.uid[ATTACKER], users.gid[ATTACKER])
    attackers.chmod(0o644)
    (store / "k.planted.1").write_bytes(b"=attacker's address")
    (store / "k.planted.1").chmod(0o666)
    os.chown(store / "k.planted.1", users.uid[VICTIM], users.gid[VICTIM])
    (store / "k.linked.1").symlink_to(attackers)
    (store / "k.foreign.1").write_bytes(b"=attacker's address")
    (store / "k.foreign.1").chmod(0o600)
    os.chown(store / "k.foreign.1", users.uid[ATTACKER], users.gid[ATTACKER])
    done = users.python(VICTIM, _STORE_AS_VICTIM.replace("sys.argv[1]", repr(str(store))), base / f"home-{VICTIM}")
    assert done.returncode == 0, done.stderr[-3000:]
    lines = dict(line.split(" ", 1) for line in done.stdout.strip().splitlines())
    assert lines["planted"].startswith("refused") and "mode 0o666" in lines["planted"], lines
    assert lines["linked"].startswith("refused") and "is a symbolic link" in lines["linked"], lines
    assert lines["foreign"].startswith("refused") and f"uid {users.uid[ATTACKER]}" in lines["foreign"], lines
    assert "attacker" not in done.stdout.replace(str(base / f"home-{ATTACKER}"), ""), "nothing of it was read"


_KILLED_DIR_RANK = """
import os, signal, sys
sys.path.insert(0, {tests!r})
from helpers import Rank
from lightning_dist_hooks.init_methods import DirInitMethod
rendezvous = DirInitMethod().prepare({url!r}, Rank(0))
rendezvous.store.set("key", b"value")
print(rendezvous.file.parent, flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_the_victims_janitor_removes_the_store_directory_of_its_killed_rank(users, base):
    shared = shared_directory(base, users, "world-writable-sticky")
    code = _KILLED_DIR_RANK.format(tests=str(REPO / "tests"), url=f"dir://{shared}/rdzv")
    killed = users.python(VICTIM, code, base / f"home-{VICTIM}")
    assert killed.returncode == -9, killed.stderr[-3000:]
    private = Path(killed.stdout.strip())
    deadline = time.monotonic() + 20
    while private.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert list(shared.iterdir()) == [], "the janitor left the store's directory, its keys, the file or the claim"
