"""Running the stfs binary: finding it, mounting, unmounting, and turning its failures into exceptions."""
from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import sysconfig
import tempfile
import time
from pathlib import Path
from typing import Iterator, List, Optional, Sequence, Union

#: Seconds any single wait on the binary may take (a mount, an unmount) unless `timeout=` says otherwise.
DEFAULT_TIMEOUT = 60.0
#: How long an unmount that reports "busy" is retried before the mount is detached lazily, unless this
#: process itself still maps or opens files there (then at once). A child being forked elsewhere holds
#: copies of our descriptors for a moment; anything longer is a real user.
BUSY_RETRY_SECONDS = 1.0
#: How long processes left by a mount that was given up on (timed out, interrupted) are waited for
#: after SIGTERM, before SIGKILL.
STRAY_EXIT_SECONDS = 5.0
#: The environment variable that marks the processes of one `stfs mount` run (the command and the
#: daemon it forks, which inherits it), so they can be found once the command is gone.
_MOUNT_ID_ENV = "STFS_PY_MOUNT_ID"

PathLike = Union[str, bytes, "os.PathLike[str]", "os.PathLike[bytes]"]


def _path(path) -> str:
    """`path` (str, bytes or os.PathLike of either) as a str, bytes decoded as the os module does
    (os.fsdecode: a name that is not UTF-8 keeps its bytes as surrogate escapes). One with a NUL,
    which no system call takes, is refused (StfsError), not left to fail deep inside."""
    path = os.fsdecode(os.fspath(path))
    if "\0" in path:
        raise StfsError(f"stfs: {path!r}: a path cannot hold a NUL byte")
    return path


def _utf8(path: str, why: str) -> str:
    """`path`'s bytes decoded as UTF-8 (the same str under a UTF-8 filesystem encoding; the real
    name where an ASCII locale spells it with surrogate escapes); a path that is not UTF-8 is
    refused (StfsError) naming it, its bytes escaped, and saying `why` that matters."""
    raw = os.fsencode(path)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise StfsError(f"stfs: {raw.decode('utf-8', 'backslashreplace')}: the path is not UTF-8, {why}") from None


def _argument(path: str) -> str:
    """`path` as an argument for the binary, which takes only UTF-8: a path that is not UTF-8 is
    refused here, naming it."""
    _utf8(path, "and the stfs binary takes only UTF-8 paths (rename it, or reach it through a link whose path is UTF-8)")
    return path


class StfsError(RuntimeError):
    """A failure of the stfs binary. ``str(error)`` is its one-line message (``stfs: PATH: problem``,
    or clap's ``error: ...`` line for a usage error); ``returncode``, ``stderr`` and ``command`` keep
    the rest."""

    def __init__(self, message: str, *, command: Optional[Sequence[str]] = None, returncode: Optional[int] = None, stderr: str = ""):
        super().__init__(message)
        self.message = message
        self.command = list(command) if command is not None else None
        self.returncode = returncode
        self.stderr = stderr


def find_binary() -> str:
    """The stfs executable: ``$STFS_BIN`` if set, else the one installed with this package (in the
    scripts directory of the install scheme whose site-packages holds it), else ``stfs`` on PATH."""
    env = os.environ.get("STFS_BIN")
    if env:
        if not (os.path.isfile(env) and os.access(env, os.X_OK)):
            raise StfsError(f"STFS_BIN={env}: not an executable file")
        return env
    here = Path(__file__).resolve().parent.parent
    for scheme in sysconfig.get_scheme_names():
        try:
            paths = sysconfig.get_paths(scheme)
        except (KeyError, ValueError):
            continue
        libs = {Path(paths[k]).resolve() for k in ("purelib", "platlib") if k in paths}
        if here in libs and "scripts" in paths:
            candidate = Path(paths["scripts"]) / "stfs"
            if candidate.is_file() and os.access(candidate, os.X_OK):
                return str(candidate)
    found = shutil.which("stfs")
    if found:
        return found
    raise StfsError("stfs: the stfs binary was not found (pip install stfs puts it on PATH; or set STFS_BIN)")


def _mount_info(path, binary: Optional[str] = None, timeout: float = DEFAULT_TIMEOUT) -> dict:
    """What is mounted at `path` (links to it followed), as the binary reads /proc/self/mountinfo
    (``stfs mount-info``): {"path", "mounted", "stfs", "fs_type", "source"}. One reading of mountinfo's
    rules (its escapes, stacked mounts, a mount point that is not UTF-8) for the binary and the package."""
    binary = binary or find_binary()
    # Not realpath: it would lstat the mount's root, which a stopped daemon never answers; the binary
    # follows links up to the last component without touching what is mounted there.
    target = os.path.abspath(_path(path))
    command = [binary, "mount-info", "--", target]
    out = _run(command, timeout)
    if out.returncode != 0:
        raise StfsError(_message(out.stderr, f"stfs: {target}: mount-info failed"), command=command,
                        returncode=out.returncode, stderr=out.stderr)
    try:
        info = json.loads(out.stdout)
        info["mounted"], info["stfs"]  # noqa: B018 - the fields every caller reads
    except (ValueError, TypeError, KeyError):
        raise StfsError(f"stfs: {binary} mount-info gave no answer for {target} (an stfs binary older than this "
                        "package?)", command=command, returncode=out.returncode, stderr=out.stderr) from None
    return info


def is_mounted(path: PathLike, *, timeout: float = DEFAULT_TIMEOUT, binary: Optional[str] = None) -> bool:
    """Whether `path` is a mount point, by /proc/self/mountinfo (read by the stfs binary, within
    `timeout` seconds)."""
    return bool(_mount_info(path, binary, timeout)["mounted"])


def _held_here(mountpoint: str) -> bool:
    """Whether this process maps (np.memmap, torch.from_file) or has open a file under `mountpoint`."""
    # Resolved up to the mount point, never into it (a stopped daemon would hold the lstat).
    prefix = os.fsencode(os.path.join(os.path.realpath(os.path.dirname(os.path.abspath(mountpoint))),
                                      os.path.basename(os.path.abspath(mountpoint)))) + b"/"
    try:
        with open("/proc/self/maps", "rb") as f:  # bytes: a mapped file's name need not be UTF-8
            for line in f:
                fields = line.rstrip(b"\n").split(maxsplit=5)  # address perms offset dev inode [path]
                if len(fields) == 6 and fields[5].startswith(prefix):
                    return True
        for fd in os.listdir("/proc/self/fd"):
            with contextlib.suppress(OSError):
                if os.readlink(os.fsencode(f"/proc/self/fd/{fd}")).startswith(prefix):
                    return True
    except OSError:
        pass
    return False


def _message(stderr: str, fallback: str) -> str:
    """The binary's one-line message: the first non-empty line of its stderr."""
    for line in stderr.splitlines():
        if line.strip():
            return line.strip()
    return fallback


def _run(command: List[str], timeout: float, env: Optional[dict] = None) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(command, stdin=subprocess.DEVNULL, capture_output=True, encoding="utf-8",
                              errors="replace", timeout=timeout, env=env)
    except subprocess.TimeoutExpired as e:
        raise StfsError(f"stfs: `{' '.join(command[1:3])}` did not finish within {timeout:g} s", command=command) from e
    except OSError as e:
        raise StfsError(f"stfs: cannot run {command[0]}: {e.strerror or e}", command=command) from e


def _check(command: List[str], timeout: float, env: Optional[dict] = None) -> None:
    out = _run(command, timeout, env)
    if out.returncode != 0:
        message = _message(out.stderr, f"stfs: {command[1]} failed with exit status {out.returncode}")
        raise StfsError(message, command=command, returncode=out.returncode, stderr=out.stderr)


def mount_flags(options: dict) -> List[str]:
    """Command-line flags for keyword options: ``cache_size="1G"`` is ``--cache-size 1G``, ``npy=True``
    is ``--npy`` (False and None leave a flag out), a list or tuple repeats the flag (``header=[...]``),
    ``as_="f32"`` is ``--as f32`` (``as`` is a Python keyword) and ``o="a,b"`` is ``-o a,b`` (mount()
    passes ``o`` in the environment instead, as STFS_OPTIONS_*: it may hold a header); a value
    that begins with ``-`` is attached (``--log-file=-x.log``), so it is not taken for a flag. Names are
    not checked here: the binary refuses an unknown one, and mount() raises its message."""
    flags: List[str] = []
    for name, value in options.items():
        if name in ("foreground", "f"):
            raise ValueError("stfs.mount: a foreground mount does not return; run the stfs binary for that")
        if name == "o":
            flag = "-o"
        elif name in ("as_", "as_dtype"):
            flag = "--as"
        else:
            flag = "--" + name.replace("_", "-")
        values = value if isinstance(value, (list, tuple)) else [value]
        for v in values:
            if v is None or v is False:
                continue
            if v is True:
                flags.append(flag)
            else:
                v = _path(v) if isinstance(v, (os.PathLike, bytes)) else str(v)
                # A value that begins with "-" (a relative path "-x.log") would be taken for a flag:
                # attached with "=", it is the flag's value.
                flags += [f"{flag}={v}"] if v.startswith("-") else [flag, v]
    return flags


def unmount(mountpoint: PathLike, *, timeout: float = DEFAULT_TIMEOUT, binary: Optional[str] = None) -> None:
    """Unmounts with ``stfs umount``. While it reports busy it is retried for up to
    BUSY_RETRY_SECONDS (not at all if this process holds files there); then the mount is detached
    lazily (``stfs umount --lazy``): it leaves the filesystem at once, and its daemon goes on serving
    files that are still open or mapped until the last of them is closed. Raises StfsError if even
    that fails."""
    binary = binary or find_binary()
    mp = _path(mountpoint)
    deadline = time.monotonic() + min(BUSY_RETRY_SECONDS, timeout)
    delay = 0.02
    while True:
        out = _run([binary, "umount", "--", mp], timeout)
        if out.returncode == 0:
            return
        # Busy means mounted: retried without asking the binary whether it is (a process each).
        if "busy" not in out.stderr:
            if not is_mounted(mp, timeout=timeout, binary=binary):
                return
            break
        if time.monotonic() + delay > deadline or _held_here(mp):
            break
        time.sleep(delay)
        delay = min(delay * 2, 0.25)
    out = _run([binary, "umount", "--lazy", "--", mp], timeout)
    if out.returncode != 0 and is_mounted(mp, timeout=timeout, binary=binary):
        raise StfsError(_message(out.stderr, f"stfs: {mp}: unmount failed"), command=[binary, "umount", "--lazy", "--", mp],
                        returncode=out.returncode, stderr=out.stderr)


def _header_env(headers) -> Optional[dict]:
    """The environment for the binary carrying `headers` (``"Name: value"`` strings) as STFS_HEADER_*
    variables, which only this user can read (/proc/PID/environ), never on the command line, which
    every user can (``ps``); None when there are none."""
    headers = [headers] if isinstance(headers, str) else [h for h in (headers or []) if h is not None]
    if not headers:
        return None
    env = dict(os.environ)
    n = 0
    for header in headers:
        while f"STFS_HEADER_PY{n:04d}" in env:
            n += 1
        env[f"STFS_HEADER_PY{n:04d}"] = str(header)
    return env


def _options_env(env: dict, options: dict) -> None:
    """Moves ``o`` (an ``-o`` list, or a list of them) out of `options` into `env` as STFS_OPTIONS_*
    variables, which the binary reads as ``-o`` lists taken before the command line's: a ``header=``
    option in one never reaches a command line, and the lists are cut by the binary's one rule."""
    value = options.pop("o", None)
    if value is None or value is False or value is True:
        return
    n = 0
    for text in value if isinstance(value, (list, tuple)) else [value]:
        if text is None:
            continue
        while f"STFS_OPTIONS_PY{n:04d}" in env:
            n += 1
        env[f"STFS_OPTIONS_PY{n:04d}"] = str(text)


def _marked(pid: int, mark: bytes) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return mark in f.read().split(b"\0")
    except OSError:  # gone, or not this user's
        return False


def _stop_marked(token: str, seconds: float) -> None:
    """Stops what a mount run that was given up on left behind: the `stfs mount` command itself is
    gone (subprocess killed it), but the daemon it forked goes on and mounts. Those processes are
    the ones (this user's, not this one) whose environment holds ``STFS_PY_MOUNT_ID=token``, which the
    daemon inherits. SIGTERM makes a daemon unmount its own mount and exit (one that has not mounted
    yet just exits). /proc is looked at again until none is left, so a process forked meanwhile
    gets its SIGTERM too; after `seconds`, those left are killed (a mount one leaves stale is
    cleared by `stfs umount`)."""
    mark = f"{_MOUNT_ID_ENV}={token}".encode()
    deadline = time.monotonic() + seconds
    signalled = set()
    while True:
        pids = [int(p) for p in os.listdir("/proc") if p.isdigit() and int(p) != os.getpid() and _marked(int(p), mark)]
        if not pids:
            return
        late = time.monotonic() >= deadline
        for pid in pids:
            if late or pid not in signalled:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL if late else signal.SIGTERM)
                signalled.add(pid)
        if late:
            return
        time.sleep(0.02)


def _mount(source: PathLike, mountpoint: Optional[PathLike], timeout: float, options: dict):
    """Mounts and returns (binary, mount point, the temporary directory made for it or None).
    ``header=`` keywords and ``o`` lists travel in the environment (see _header_env, _options_env), the
    rest as flags."""
    options = dict(options)
    headers = options.pop("header", None)
    headers = [headers] if isinstance(headers, str) else [h for h in (headers or []) if h is not None]
    env = _header_env(headers) or dict(os.environ)
    _options_env(env, options)
    token = secrets.token_hex(16)
    env[_MOUNT_ID_ENV] = token
    flags = mount_flags(options)
    binary = find_binary()
    source = _argument(_path(source))
    if mountpoint is not None:
        mountpoint = _argument(_path(mountpoint))
    made = None
    if mountpoint is None:
        _argument(tempfile.gettempdir())
        made = tempfile.mkdtemp(prefix="stfs-")
        mp = Path(made)
    else:
        # Absolute now: the block may change the working directory, and the unmount at its end
        # must still name this mount point.
        mp = Path(os.path.abspath(mountpoint))
    # `--` ends the flags: a source or mount point that begins with "-" is still a path.
    command = [binary, "mount", *flags, "--", source, str(mp)]
    mounted_before = made is None and os.path.isdir(mp) and is_mounted(mp, timeout=timeout, binary=binary)
    try:
        _check(command, timeout, env)
    except BaseException:
        # A mount given up on (timed out, or interrupted: KeyboardInterrupt) may still come up: the
        # command was killed, but not the daemon it forked, which mounts on its own. Stop that daemon
        # first, then take down a mount that is there (but never one that was there before: then
        # stfs refused to mount over it).
        with contextlib.suppress(OSError):
            _stop_marked(token, min(STRAY_EXIT_SECONDS, timeout))
        # A binary that cannot say (the one that just failed) leaves the mount point as it is: the
        # error the caller sees is the mount's, not this look's.
        with contextlib.suppress(StfsError):
            if not mounted_before and is_mounted(mp, timeout=timeout, binary=binary):
                _run([binary, "umount", "--lazy", "--", str(mp)], timeout)
        if made is not None:
            with contextlib.suppress(OSError):
                os.rmdir(made)
        raise
    return binary, mp, made


def _release(binary: str, mp: Path, made: Optional[str], timeout: float, quiet: bool) -> None:
    try:
        unmount(mp, timeout=timeout, binary=binary)
    except StfsError:
        if not quiet:
            raise
        return
    if made is not None:
        with contextlib.suppress(OSError):
            os.rmdir(made)


@contextlib.contextmanager
def mount(source: PathLike, mountpoint: Optional[PathLike] = None, *, timeout: float = DEFAULT_TIMEOUT, **options) -> Iterator[Path]:
    """Mounts `source` (a .safetensors file, a *.index.json, a directory of shards or an http(s) URL)
    with ``stfs mount`` and yields the mount point as a pathlib.Path; unmounts when the block ends,
    also when it raises.

    With no `mountpoint`, a fresh temporary directory is mounted on and removed afterwards; the path
    yielded is absolute either way (a relative `mountpoint` is taken from the working directory at
    the call, and a chdir in the block changes nothing). Keyword
    options become mount flags (see mount_flags): ``mount(ckpt, cache_size="1G", npy=True)``. A failure
    of the binary raises StfsError with its one-line message. Each call of the binary is bounded by
    `timeout` seconds; a mount given up on (timed out, or KeyboardInterrupt during the wait) is taken
    down, its daemon included, never left to come up afterwards. If files of the mount are still open
    or mapped when the block ends, the mount is detached lazily (see unmount), so arrays mapped from
    it stay readable until they are freed. Only the process that mounted unmounts: a child forked
    inside the block (os.fork) leaves the mount alone when it leaves the block."""
    binary, mp, made = _mount(source, mountpoint, timeout, options)
    owner = os.getpid()
    try:
        yield mp
    except BaseException:
        # Do not let a failing unmount hide the exception the block raised.
        if os.getpid() == owner:
            _release(binary, mp, made, timeout, quiet=True)
        raise
    # A child forked inside the block (os.fork) that leaves it leaves the mount to the process that
    # made it: it must not unmount it from under that process.
    if os.getpid() == owner:
        _release(binary, mp, made, timeout, quiet=False)
