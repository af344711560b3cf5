"""Where cargo puts this repository's binaries: `cargo metadata`'s target_directory, which honours
CARGO_TARGET_DIR and .cargo/config.toml, so no script guesses REPO/target/<profile>.

    cargo_paths.binary("stfs")                    # <target>/release/stfs
    cargo_paths.binary("slowfs", example=True)    # <target>/release/examples/slowfs
    cargo_paths.binary("stfs", profile="profiling")

Without cargo on PATH (the offline GPU machine, where --stfs names the kit's binary) the answer is
REPO/target, cargo's own default, so the help text still reads sensibly.
"""

import functools
import json
import os
import shutil
import subprocess

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@functools.lru_cache(maxsize=None)
def target_dir():
    cargo = shutil.which("cargo") or os.path.expanduser("~/.cargo/bin/cargo")
    if not os.path.exists(cargo):
        return os.path.join(REPO, "target")
    out = subprocess.run([cargo, "metadata", "--format-version", "1", "--no-deps"], cwd=REPO,
                         capture_output=True, text=True, timeout=120, check=True).stdout
    return json.loads(out)["target_directory"]


def binary(name, profile="release", example=False):
    """The path cargo builds `name` at (a bin, or an example with example=True) under `profile`."""
    # cargo writes the dev profile to debug/, every other profile to a folder named after it.
    folder = "debug" if profile in ("dev", "test") else profile
    return os.path.join(target_dir(), folder, *(["examples"] if example else []), name)
