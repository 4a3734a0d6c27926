"""``python -m guard.policy [--markdown | --yaml]``: the policy reference or the defaults."""

from __future__ import annotations

import sys

from guard.policy._load import default_policy, policy_to_yaml


def _main(argv: list[str]) -> int:
    if argv == ["--markdown"]:
        from guard.policy._docs import policy_reference

        sys.stdout.write(policy_reference())
        return 0
    if argv == ["--yaml"] or not argv:
        sys.stdout.write(policy_to_yaml(default_policy()))
        return 0
    sys.stderr.write("usage: python -m guard.policy [--markdown | --yaml]\n")
    return 2


raise SystemExit(_main(sys.argv[1:]))
