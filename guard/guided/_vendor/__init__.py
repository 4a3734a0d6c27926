"""Third-party code the guard must run exactly as its upstream does, copied byte for byte.

Each file's upstream (project, version, path, lines), its digest and its licence are recorded
in README.md beside it; the licence texts are the LICENSE-* files. Nothing here is edited by
hand, linted or type-checked (pyproject.toml excludes the folder); each is updated from its
upstream, and tests/guard/guided/test_vendor.py checks the recorded digests (and the text
against the installed upstream when it is set up).
"""
