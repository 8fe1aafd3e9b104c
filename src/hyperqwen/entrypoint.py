"""The container's entrypoint: `single | batch | prepare | init | verify [args] | <any command>`.

`init` (compose's one-shot `init` service, run as root with only CHOWN/FOWNER/DAC_OVERRIDE) creates the models
and cache folders and gives them to the user the other services run as, so a fresh host needs no mkdir/chown.
`prepare` checks that it can write the models folder first and turns a permission error into one line that
names the path and the chown that fixes it.
`single` and `batch` refuse a MODE knob that contradicts the compose profile, take the GPU lock (both server
profiles at once are refused before either loads), run the same checks as `verify.sh` (no live server yet)
and refuse to start the server when one fails, unless SKIP_VERIFY is on.
"""

from __future__ import annotations

import errno
import fcntl
import os
import secrets
import shutil
import signal
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

from hyperqwen.cli import main as hyperqwen_main
from hyperqwen.config.apikey import key_file_path
from hyperqwen.config.knobs import KNOBS_BY_NAME, MODES
from hyperqwen.config.load import load_only
from hyperqwen.config.settings import Settings, SettingsError
from hyperqwen.exit_codes import Exit

USAGE = "usage: hyperqwen-entrypoint single|batch|prepare|init|verify [ARGS...] | COMMAND [ARGS...]"

# Set by compose.yaml: the host folder behind /models (for messages), the ids the services run as, and the
# lock file (on the shared cache volume) that keeps two server profiles off one GPU. Read from the environment
# as compose sets them; the knobs the entrypoint reads (MODELS_DIR, API_KEY_FILE, VLLM_API_KEY, MODE,
# SKIP_VERIFY) go through the settings loader instead (`_knobs`).
HOST_MODELS_ENV = "HYPERQWEN_MODELS_HOST"
UID_ENV, GID_ENV = "HYPERQWEN_UID", "HYPERQWEN_GID"
GPU_LOCK_ENV = "HYPERQWEN_GPU_LOCK"
# The other server's lock is probed after this pause, so two servers started together both see each other.
LOCK_SETTLE_S = float(os.environ.get("HYPERQWEN_GPU_LOCK_SETTLE_S", "3"))


def _say(message: str) -> None:
    print(f"hyperqwen: {message}", file=sys.stderr, flush=True)


def _knobs(*names: str) -> Settings:
    """The knobs `names` as every command resolves them (defaults < profile < ./.env < environment), each
    checked by the knob table. Only these are read: a bad value of another knob is left to the command that
    uses it, so init and the lock never stop on it. Raises SettingsError."""
    return load_only(os.environ, names)


def _refuse_knob(exc: SettingsError, code: int) -> int:
    """One line naming the bad knob (the loader's message), and the exit status the command would give."""
    first = next((p for p in exc.problems if p.severity == "error"), exc.problems[0])
    _say(first.message)
    return code


def _models_dir() -> Path:
    return Path(_knobs("MODELS_DIR").knobs.models_dir)


# --- folders and permissions ---------------------------------------------------------------------------------


def _ids() -> tuple[int, int]:
    """The uid:gid the services run as (compose's HYPERQWEN_UID/GID), else this process's."""
    try:
        uid = int(os.environ.get(UID_ENV) or os.getuid())
        gid = int(os.environ.get(GID_ENV) or os.getgid())
    except ValueError:
        _say(
            f"{UID_ENV}/{GID_ENV} must be numeric ids (see `id -u` / `id -g` on the host), "
            f"got {os.environ.get(UID_ENV)!r}:{os.environ.get(GID_ENV)!r}"
        )
        raise SystemExit(Exit.BAD_INPUT) from None
    return uid, gid


def host_path(path: Path, models: Path | None = None) -> str:
    """How the user finds `path` on the host: under HYPERQWEN_MODELS_HOST when it is inside MODELS_DIR
    (`models`; default: the MODELS_DIR knob)."""
    host = os.environ.get(HOST_MODELS_ENV)
    if host:
        models = models if models is not None else _models_dir()
        try:
            relative = path.relative_to(models)
        except ValueError:
            return str(path)
        # Joined as text: Path("./models") would drop the "./" the user wrote in .env.
        return host if str(relative) == "." else f"{host.rstrip('/')}/{relative}"
    return str(path)


def permission_line(path: Path, uid: int, gid: int, models: Path | None = None) -> str:
    """One line: which path, who owns it, and the command that fixes it. models: MODELS_DIR (default: the knob)."""
    models = models if models is not None else _models_dir()
    try:
        st = path.stat()
        owner = f"owned by {st.st_uid}:{st.st_gid}"
    except OSError:
        owner = "not accessible"
    shown = host_path(path, models)
    inside = "" if shown == str(path) else f" ({path} in the container)"
    if path.is_relative_to(models):
        fix = f"sudo chown -R {uid}:{gid} {shown}"
    else:  # the cache is a named volume: fix it from a root container
        fix = f"docker compose run --rm --user 0 init   (or: sudo chown -R {uid}:{gid} {shown})"
    return f"{shown}{inside} is {owner} and uid {uid} cannot write it; fix: {fix}"


def _walk(root: Path) -> Iterator[Path]:
    yield root
    for dirpath, dirnames, filenames in os.walk(root):
        for name in (*dirnames, *filenames):
            yield Path(dirpath) / name


def ensure_writable_dirs(paths: Sequence[Path], uid: int, gid: int, models: Path) -> list[str]:
    """Create each folder and, when running as root, give everything in it to uid:gid. Returns problems
    (one line each) for what is still not writable by uid. models: MODELS_DIR, for the messages."""
    problems = []
    for path in paths:
        try:
            path.mkdir(parents=True, exist_ok=True)
            if os.geteuid() == 0:
                for entry in _walk(path):
                    st = entry.lstat()
                    if (st.st_uid, st.st_gid) != (uid, gid):
                        os.lchown(entry, uid, gid)
        except PermissionError as exc:
            problems.append(permission_line(Path(exc.filename or path), uid, gid, models))
            continue
        if not _writable_by(path, uid, gid):
            problems.append(permission_line(path, uid, gid, models))
    return problems


def _writable_by(path: Path, uid: int, gid: int) -> bool:
    if os.geteuid() == uid or os.geteuid() != 0:
        return os.access(path, os.W_OK | os.X_OK)
    st = path.stat()
    if st.st_uid == uid:
        return bool(st.st_mode & 0o300 == 0o300)
    if st.st_gid == gid:
        return bool(st.st_mode & 0o030 == 0o030)
    return bool(st.st_mode & 0o003 == 0o003)


def ensure_api_key(settings: Settings, uid: int, gid: int) -> None:
    """Make sure the API key file exists, so the server, the monitor and the WebUI share one key from the first
    start (on loopback too: other local users and browser pages cannot use the API). With no key anywhere a new
    one is made; with VLLM_API_KEY set, that key is written (the WebUI's compose secret needs a file; the server
    and the WebUI still take the environment's key first). settings: MODELS_DIR, API_KEY_FILE and VLLM_API_KEY."""
    path = key_file_path(settings)
    if path.exists():
        return
    models = Path(settings.knobs.models_dir)
    from_env = settings.knobs.vllm_api_key
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write((from_env or secrets.token_hex(16)) + "\n")
    if os.geteuid() == 0:
        os.chown(path, uid, gid)
    if from_env:
        _say(f"wrote VLLM_API_KEY to {host_path(path, models)} (mode 0600) for the WebUI's compose secret")
    else:
        _say(f"created an API key in {host_path(path, models)}; clients send it as 'Authorization: Bearer <key>'")


def run_init(paths: Sequence[str]) -> int:
    """compose's `init` service: create and own the models and cache folders, create the key file."""
    uid, gid = _ids()
    try:
        settings = _knobs("MODELS_DIR", "API_KEY_FILE", "VLLM_API_KEY")
    except SettingsError as exc:
        return _refuse_knob(exc, Exit.BAD_INPUT)
    models = Path(settings.knobs.models_dir)
    targets = [Path(p) for p in paths] or [models, Path(os.environ.get("XDG_CACHE_HOME", "/cache"))]
    problems = ensure_writable_dirs(targets, uid, gid, models)
    for line in problems:
        _say(line)
    if problems:
        return Exit.FAILED
    ensure_api_key(settings, uid, gid)
    _say(f"folders ready for uid {uid}:{gid}: " + ", ".join(host_path(p, models) for p in targets))
    return Exit.OK


def run_prepare(rest: Sequence[str]) -> int:
    uid, gid = os.getuid(), os.getgid()
    try:
        models = _models_dir()
    except SettingsError as exc:
        return _refuse_knob(exc, Exit.FAILED)  # prepare's own status for a bad knob (prepare/errors.py)
    problems = ensure_writable_dirs([models], uid, gid, models)
    if problems:
        _say(problems[0])
        return Exit.FAILED
    try:
        return hyperqwen_main(["prepare", *rest])
    except PermissionError as exc:
        path = Path(exc.filename) if exc.filename else models
        _say(permission_line(path, uid, gid, models))
        return Exit.FAILED


# --- the server -------------------------------------------------------------------------------------------


def check_mode(profile: str, settings: Settings) -> str | None:
    """A MODE knob (from .env through env_file) must agree with the profile that picked this service."""
    mode = settings.knobs.mode
    if settings.explicit("MODE") and mode != profile:
        return (
            f"MODE={mode} (from .env or the environment) contradicts the compose profile {profile!r}: "
            f"start `docker compose --profile {mode} up -d`, or remove MODE from .env (the profile picks the mode)"
        )
    return None


def _lock_is_held(path: Path) -> bool:
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
            return True
        raise
    finally:
        os.close(fd)
    return False


def take_gpu_lock(lock: Path, profile: str) -> str | None:
    """Hold `<lock>.<profile>` for this process's lifetime (the fd stays open across exec); refuse when the
    other server profile holds its own. Returns the refusal line, or None when this server may load."""
    lock.parent.mkdir(parents=True, exist_ok=True)
    mine = lock.with_name(f"{lock.name}.{profile}")
    fd = os.open(mine, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return f"another {profile} server already holds {mine}; stop it first (docker compose down)"
    os.set_inheritable(fd, True)
    # Both servers of `--profile single --profile batch` start together: wait until each holds its own lock,
    # then both see the other and both refuse, so neither loads the model.
    time.sleep(LOCK_SETTLE_S)
    others = [m for m in MODES if m != profile and _lock_is_held(lock.with_name(f"{lock.name}.{m}"))]
    if others:
        return (
            f"the {others[0]} server of this stack is on the same GPU; select one server profile: "
            f"`docker compose --profile {profile} up -d` or `--profile {others[0]}`, not both "
            f"(run `docker compose down` first)"
        )
    return None


def _refuse_and_wait(line: str) -> int:
    """Say why, then idle until stopped: exiting would let the restart policy retry into the same conflict."""
    _say(line)
    _say("not starting the server; this container idles until `docker compose down`")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(Exit.TERMINATED))
    while True:
        time.sleep(3600)


def run_server(profile: str, rest: Sequence[str]) -> int:
    try:
        settings = _knobs("MODE", "SKIP_VERIFY")
    except SettingsError as exc:
        return _refuse_knob(exc, Exit.BAD_INPUT)
    problem = check_mode(profile, settings)
    if problem:
        _say(problem)
        return Exit.BAD_INPUT
    lock = os.environ.get(GPU_LOCK_ENV)
    if lock:
        refusal = take_gpu_lock(Path(lock), profile)
        if refusal:
            return _refuse_and_wait(refusal)
    os.environ["MODE"] = profile
    if not settings.knobs.skip_verify:
        code = hyperqwen_main(["verify"])
        if code != 0:
            _say(
                "verify failed (see FAIL lines above); not starting the server. "
                "Fix the cause, or set SKIP_VERIFY=true to start anyway."
            )
            return code
    return hyperqwen_main(["serve", "--mode", profile, *rest])


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv) or [KNOBS_BY_NAME["MODE"].default]
    command, rest = args[0], args[1:]
    if command in MODES:
        return run_server(command, rest)
    if command == "init":
        return run_init(rest)
    if command == "prepare":
        return run_prepare(rest)
    if command == "verify":
        return hyperqwen_main([command, *rest])
    if command in ("-h", "--help", "help"):
        print(USAGE)
        return Exit.OK
    program = shutil.which(command)
    if program is None:
        _say(
            f"{command!r} is neither a mode ({', '.join(MODES)}), prepare, init, verify, nor a command on PATH.\n"
            + USAGE
        )
        return Exit.NOT_FOUND
    os.execv(program, [command, *rest])
    return Exit.OK  # pragma: no cover


if __name__ == "__main__":
    sys.exit(main())
