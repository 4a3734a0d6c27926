"""Facts and helpers every test folder shares: where things are, and a free loopback port."""

from __future__ import annotations

import socket
from pathlib import Path

__all__ = ["REPO_ROOT", "TESTS_DIR", "free_port"]

TESTS_DIR = Path(__file__).resolve().parent
REPO_ROOT = TESTS_DIR.parent


def free_port(host: str = "127.0.0.1") -> int:
    """A port nobody listens on right now. Racy in principle (released before the caller binds
    it); the servers the tests start report a taken port, so a collision fails loudly."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port
