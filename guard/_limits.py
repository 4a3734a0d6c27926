"""What a limit set is made of, so that each one is declared once.

A limit set (:class:`~guard.http.FramingLimits`, :class:`~guard.json.JsonLimits`,
:class:`~guard.guided.GuidedLimits`, ...) is a frozen pydantic dataclass next to the code it
bounds; each field carries its default, its bounds and its description. The policy uses the
class itself as its section (``limits.guided`` *is* a ``GuidedLimits``), so YAML and
``SCHEDGUARD_*`` values are validated by the same declaration, docs/POLICY.md is generated from
its descriptions, and the guard reads the policy's objects: nothing is copied field by field.

A limit set whose fields are checked together (a validator across fields, or that needs to know
which fields a policy set) is a :class:`LimitsModel` instead: a frozen pydantic model with the
same rules.

Validation costs a few microseconds when an object is built (once per policy, or in a test);
reading a field is a plain attribute read, as for any dataclass.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["LIMITS_CONFIG", "LimitsModel", "NonNegInt", "PosFloat", "PosInt"]

# Unknown fields are errors (a misspelt limit must not be ignored); defaults are checked too.
LIMITS_CONFIG = ConfigDict(extra="forbid", validate_default=True)

# Ints are strict (no "12" or 12.0 or true); YAML and the environment give real ints.
PosInt = Annotated[int, Field(strict=True, gt=0)]
NonNegInt = Annotated[int, Field(strict=True, ge=0)]
PosFloat = Annotated[float, Field(gt=0, allow_inf_nan=False)]


class LimitsModel(BaseModel):
    """A limit set as a pydantic model: unknown fields are errors, values are immutable."""

    model_config = ConfigDict(**LIMITS_CONFIG, frozen=True)
