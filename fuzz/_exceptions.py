"""Every exception the fuzz package defines, in one place.

Three families: what a caller of the package catches (:class:`EngineUnavailable`,
:class:`WorkerError`); what a fuzz target raises to report a bug (:class:`CheckFailed`,
:class:`AppInternalError`, :class:`InvariantViolation`: any exception a target does not document
is a crash, and these name the crash); and the control flow of a run (:class:`SoftTimeout`,
:class:`CostFinding`, :class:`RoundOver`). The module imports nothing at run time, so the worker
and the atheris harness can load it before anything is instrumented.
"""

from __future__ import annotations

__all__ = [
    "AppInternalError",
    "CheckFailed",
    "CostFinding",
    "EngineUnavailable",
    "InvariantViolation",
    "RemoteTargetRefused",
    "RoundOver",
    "SoftTimeout",
    "TargetUnreachable",
    "WorkerError",
]


# ---------------------------------------------------------------------------- for callers


class EngineUnavailable(RuntimeError):
    """The engine exists but cannot run here (e.g. atheris is not installed)."""


class WorkerError(RuntimeError):
    """The oracle's worker could not be started (the target failed to import or warm up)."""


class RemoteTargetRefused(ValueError):
    """A live campaign was pointed at a host that is not loopback without ``allow_remote``."""


class TargetUnreachable(RuntimeError):
    """A live server (target, guard or metrics endpoint) did not answer when the campaign
    started, so there is nothing to fuzz."""


# ------------------------------------------------------------------ raised by fuzz targets


class CheckFailed(Exception):
    """A guard check raised instead of returning a verdict (``request_check_failed``)."""


class AppInternalError(Exception):
    """The app answered 500 ``internal_error``: an exception escaped the gateway's handling."""


class InvariantViolation(AssertionError):
    """A scheduler invariant did not hold."""


# --------------------------------------------------------------------------- control flow


class SoftTimeout(BaseException):
    """Raised by the CPU timer inside the target (BaseException: targets that catch Exception
    to map it to their own errors must not swallow it)."""


class CostFinding(Exception):
    """Raised inside the atheris harness for an input the oracle calls a finding, so that
    libFuzzer saves it as a ``crash-*`` artifact. The message names the verdict, cause and
    cost (:meth:`fuzz.oracle.Outcome.summary`)."""


class RoundOver(BaseException):
    """Ends a Hypothesis round at the deadline (or at the first finding when asked). A
    BaseException: Hypothesis lets it through at once instead of treating it as a failing
    example to shrink."""
