"""`python -m selscan ...` and the `selscan` console script: run the selscan command (doctor, run, bench).

The command is the C++ program of apps/selscan. An installed package carries it as selscan/bin/selscan, next to
the library it links (selscan/libselscan.so); in a source checkout it sits next to the library the binding loads
(build/<preset>/selscan). With SELSCAN_LIBRARY set, the command built beside that library comes first.
"""

import os
import subprocess
import sys

_EXE = "selscan.exe" if sys.platform == "win32" else "selscan"


def command_candidates():
    """Where the command is looked for, in order (the first existing file is run)."""
    found = []
    env = os.environ.get("SELSCAN_LIBRARY")
    if env:
        found.append(os.path.join(os.path.dirname(os.path.abspath(env)), _EXE))
    pkg = sys.modules.get(__package__)
    for pkg_dir in getattr(pkg, "__path__", [os.path.dirname(os.path.abspath(__file__))]):
        found.append(os.path.join(pkg_dir, "bin", _EXE))
    if not env:
        # Loading the library is only needed to find a source checkout's build tree.
        try:
            from . import _lib
        except ImportError:
            return found
        found.append(os.path.join(os.path.dirname(_lib.library_path), _EXE))
    return found


def main(argv=None):
    args = list(sys.argv[1:] if argv is None else argv)
    candidates = command_candidates()
    for exe in candidates:
        if os.path.isfile(exe) and os.access(exe, os.X_OK):
            break
    else:
        sys.stderr.write(
            "selscan: the selscan command is not part of this installation (looked for "
            + ", ".join(candidates)
            + "). Install the package with pip (it builds the command into selscan/bin), or build it in a checkout: "
            "cmake --workflow --preset cpu, then ./build/cpu/selscan.\n")
        return 2
    if sys.platform == "win32":
        return subprocess.call([exe] + args)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(exe, [exe] + args)
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main())
