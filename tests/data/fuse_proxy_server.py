#!/usr/bin/python3
"""A fusermount proxy server, as SkyPilot's fuse-proxy: runs as root outside the container and
mounts FUSE for processes inside it that have no /dev/fuse and no privilege. A client (the
fusermount3 shim) connects to the unix socket argv[1] and sends its fusermount3 arguments; the
server learns its pid and uid from SO_PEERCRED, opens /dev/fuse, enters the client's mount
namespace (/proc/PID/ns/mnt) in a forked child and mounts there with fd=N, user_id=UID, then sends
the descriptor back (SCM_RIGHTS). `-u [-z] -- MP` unmounts a FUSE mount the same user made.
Prints `ready` once listening; runs until killed."""

import ctypes
import json
import os
import socket
import stat
import struct
import sys

libc = ctypes.CDLL(None, use_errno=True)
CLONE_NEWNS = 0x00020000
MS_RDONLY, MS_NOSUID, MS_NODEV = 1, 2, 4
MNT_DETACH = 2
KERNEL_OPTIONS = {"allow_other", "default_permissions"}
IGNORED = {"ro", "rw", "nosuid", "nodev", "noatime", "relatime", "auto_unmount"}


def parse(args):
    """(unmount, lazy, options, mount point) from fusermount3's arguments."""
    unmount = lazy = False
    options = []
    rest = list(args)
    while rest:
        arg = rest.pop(0)
        if arg == "--":
            break
        if arg == "-u":
            unmount = True
        elif arg == "-z":
            lazy = True
        elif arg == "-o":
            options.extend(o for o in rest.pop(0).split(",") if o)
        elif arg.startswith("-"):
            raise ValueError(f"unknown option {arg}")
        else:
            rest.insert(0, arg)
            break
    if len(rest) != 1:
        raise ValueError("expected one mount point")
    return unmount, lazy, options, rest[0]


def in_namespace_of(pid, action):
    """Runs action() in a child that entered pid's mount namespace; raises its error."""
    read_end, write_end = os.pipe()
    ns = os.open(f"/proc/{pid}/ns/mnt", os.O_RDONLY)
    child = os.fork()
    if child == 0:
        os.close(read_end)
        try:
            if libc.setns(ns, CLONE_NEWNS) != 0:
                raise OSError(ctypes.get_errno(), "setns")
            action()
            os._exit(0)
        except Exception as e:  # noqa: BLE001 - the child reports any failure
            os.write(write_end, str(e).encode())
            os._exit(1)
    os.close(write_end)
    os.close(ns)
    error = b""
    while chunk := os.read(read_end, 4096):
        error += chunk
    os.close(read_end)
    _, status = os.waitpid(child, 0)
    if status != 0:
        raise OSError(error.decode() or f"child status {status}")


def mount(pid, uid, gid, options, mountpoint):
    fsname, subtype, kernel = "fuse-proxy", None, []
    for option in options:
        key, _, value = option.partition("=")
        if key == "fsname":
            fsname = value
        elif key == "subtype":
            subtype = value
        elif key in KERNEL_OPTIONS:
            kernel.append(key)
        elif key not in IGNORED:
            raise ValueError(f"option {option} refused")
    flags = MS_NOSUID | MS_NODEV | (MS_RDONLY if "ro" in options else 0)
    fs_type = f"fuse.{subtype}" if subtype else "fuse"
    device = os.open("/dev/fuse", os.O_RDWR | os.O_CLOEXEC)

    def attach():
        st = os.stat(mountpoint)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != uid:
            raise PermissionError(f"{mountpoint}: not a directory of uid {uid}")
        data = ",".join([f"fd={device}", "rootmode=40000", f"user_id={uid}", f"group_id={gid}", *kernel])
        if libc.mount(fsname.encode(), mountpoint.encode(), fs_type.encode(), flags, data.encode()) != 0:
            raise OSError(ctypes.get_errno(), f"mount {mountpoint}: {os.strerror(ctypes.get_errno())}")

    try:
        in_namespace_of(pid, attach)
    except BaseException:
        os.close(device)
        raise
    return device


def unmount(pid, uid, lazy, mountpoint):
    with open(f"/proc/{pid}/mountinfo") as table:
        mine = [
            line for line in table
            if line.split()[4] == mountpoint and line.split(" - ")[1].startswith("fuse")
            and f"user_id={uid}" in line.split(" - ")[1].split()[2].split(",")
        ]
    if not mine:
        raise PermissionError(f"{mountpoint}: no FUSE mount of uid {uid}")

    def detach():
        if libc.umount2(mountpoint.encode(), MNT_DETACH if lazy else 0) != 0:
            raise OSError(ctypes.get_errno(), f"umount {mountpoint}: {os.strerror(ctypes.get_errno())}")

    in_namespace_of(pid, detach)


def serve(conn):
    pid, uid, gid = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
    request = b""
    while not request.endswith(b"\n"):
        chunk = conn.recv(65536)
        if not chunk:
            return
        request += chunk
    fds = []
    try:
        is_unmount, lazy, options, mountpoint = parse(json.loads(request)["args"])
        if is_unmount:
            unmount(pid, uid, lazy, mountpoint)
        else:
            fds = [mount(pid, uid, gid, options, mountpoint)]
        reply = {"ok": True}
    except Exception as e:  # noqa: BLE001 - every failure goes back to the client
        reply = {"ok": False, "error": str(e)}
    socket.send_fds(conn, [json.dumps(reply).encode()], fds)
    for fd in fds:
        os.close(fd)


def main():
    path = sys.argv[1]
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    os.chmod(path, 0o666)
    server.listen(16)
    print("ready", flush=True)
    while True:
        conn, _ = server.accept()
        with conn:
            conn.settimeout(30)
            try:
                serve(conn)
            except OSError as e:
                print(f"client: {e}", file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
