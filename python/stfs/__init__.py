"""stfs from Python: mount a safetensors checkpoint as a directory of raw tensor files, and load its
tensors as NumPy memmaps or torch tensors on the device you name.

    import stfs

    with stfs.mount("model.safetensors", cache_size="1G") as mp:   # a temporary mount point
        print(sorted(p.name for p in mp.iterdir()))
        tensors = stfs.load(mp)                                    # name -> read-only np.memmap

    weights = stfs.load("model.safetensors", framework="torch", device="cuda")

The `stfs` binary this package runs is the one pip installed beside it (or $STFS_BIN, or `stfs` on
PATH). Mounting needs /dev/fuse and the right to mount (root, or fusermount3 for a user).
"""
from ._engine import Checkpoint, SafeOpen, open
from ._load import entries, is_mount_dir, load
from ._mount import DEFAULT_TIMEOUT, StfsError, find_binary, is_mounted, mount, mount_flags, unmount

try:
    from importlib.metadata import PackageNotFoundError, version as _version

    __version__ = _version("stfs")
except PackageNotFoundError:  # imported from a source checkout, not installed
    __version__ = "0+unknown"

__all__ = [
    "Checkpoint", "DEFAULT_TIMEOUT", "SafeOpen", "StfsError", "entries", "find_binary", "is_mount_dir", "is_mounted", "load", "mount",
    "mount_flags", "open", "unmount", "__version__",
]
