"""``python -m guard._limited_exec LIMIT_BYTES -- PROG ARGS...``: exec PROG under RLIMIT_AS.

A wrapper instead of ``preexec_fn`` because the latter is unsafe in threaded parents.
"""

from __future__ import annotations

import os
import resource
import sys


def main(argv: list[str]) -> None:
    if len(argv) < 3 or argv[1] != "--":
        sys.exit("usage: python -m guard._limited_exec LIMIT_BYTES -- PROG [ARGS...]")
    limit = int(argv[0])
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    os.execvp(argv[2], argv[2:])


if __name__ == "__main__":
    main(sys.argv[1:])
