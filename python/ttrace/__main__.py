"""``python -m ttrace lib``: the path of the shipped ``libttrace.so`` (for
``LD_PRELOAD=$(python -m ttrace lib) torchrun ...``); ``python -m ttrace cli``: the ``ttrace``
executable."""

import sys

from . import cli_path, lib_path


def main() -> int:
    what = sys.argv[1] if len(sys.argv) > 1 else "lib"
    if what == "lib":
        print(lib_path())
    elif what == "cli":
        print(cli_path())
    else:
        print("usage: python -m ttrace [lib|cli]", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
