"""The `stfs` command of the wheel: a console script that runs the CLI inside the extension module
(stfs._native.main), since one wheel holds an extension or a binary, not both (pyproject.toml says why
this one). It never returns: the process ends with the command's exit status, as the binary's does."""
import os
import sys


def main() -> None:
    from ._native import main as run

    run([os.fsencode(arg) for arg in sys.argv])
