#!/usr/bin/python3
"""A fusermount3 that mounts nothing itself: it asks the proxy server (a root process outside the
container, at the unix socket $FUSE_PROXY_SOCKET) to mount or unmount for it, and passes the
/dev/fuse descriptor it gets back to its caller over $_FUSE_COMMFD, as fusermount3 does. The test
copies it into a directory on PATH as `fusermount3` (tests/unprivileged.rs)."""

import json
import os
import socket
import sys

args = sys.argv[1:]
if not args or args[0] in ("-h", "--help", "-V", "--version"):
    print("fusermount3 (stfs test proxy shim)")
    sys.exit(0)
conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
conn.settimeout(30)
conn.connect(os.environ["FUSE_PROXY_SOCKET"])
conn.sendall(json.dumps({"args": args}).encode() + b"\n")
message, fds, _, _ = socket.recv_fds(conn, 65536, 1)
reply = json.loads(message.decode())
if not reply["ok"]:
    sys.stderr.write(f"fusermount3: {reply['error']}\n")
    sys.exit(1)
if fds:
    comm = socket.socket(fileno=int(os.environ["_FUSE_COMMFD"]))
    # One more descriptor after the FUSE one (this file), as a careless or hostile proxy may send:
    # the daemon must close it (the test looks for it among the daemon's descriptors).
    socket.send_fds(comm, [b"\0"], fds + [os.open(__file__, os.O_RDONLY)])
sys.exit(0)
