"""Named presets: sets of policy values chosen as a whole (``preset: seed``).

A module of its own, importing nothing of the guard, so that the command line can list the
names without loading the policy machinery.

A preset supplies values beneath the policy's own: a field the policy file or a
``SCHEDGUARD_*`` variable sets wins over the preset's, and the preset's wins over the default.
The default policy is sized for ordinary OpenAI traffic in front of a real server (limits from
the upstream's context window, the published API limits); ``seed`` restores the seed's numbers
(docs/SEED.md: 2048 prompt tokens, outputs of at most 2048 with 256 injected when a request
sets none, the fan-out caps the reference scheduler's hardened profile uses), for operators who
want the tight budgets of the original patch in front of a small model.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, get_args

__all__ = ["PRESETS", "PRESET_NAMES", "PresetName", "apply_preset", "preset_summary"]

PresetName = Literal["default", "seed"]
PRESET_NAMES: tuple[PresetName, ...] = get_args(PresetName)

PRESETS: Mapping[str, Mapping[str, Any]] = {
    "default": {},
    "seed": {
        "limits": {
            "tokens": {
                "max_prompt_tokens": 2048,
                "max_output_tokens": 2048,
                "default_max_tokens": 256,
            },
            "fanout": {
                "max_n": 16,
                "max_best_of": 2,
                "max_logprobs": 5,
                "max_top_logprobs": 5,
                "max_prompt_logprobs": 5,
                "max_prompts": 64,
                "max_embedding_inputs": 64,
                "max_messages": 512,
                "max_content_parts": 256,
            },
        },
    },
}


def _merge_under(values: Mapping[str, Any], preset: Mapping[str, Any]) -> dict[str, Any]:
    """``values`` with ``preset``'s entries where ``values`` has none (mappings merged)."""
    out = dict(values)
    for key, value in preset.items():
        mine = out.get(key)
        if key not in out:
            out[key] = _copy(value)
        elif isinstance(mine, Mapping) and isinstance(value, Mapping):
            out[key] = _merge_under(mine, value)
    return out


def _copy(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _copy(v) for k, v in value.items()}
    return value


def apply_preset(data: Mapping[str, Any]) -> Mapping[str, Any]:
    """The policy data with its ``preset``'s values beneath its own; ``data`` itself when it
    names none (or an unknown one: the field's validation reports that)."""
    name = data.get("preset", "default")
    preset = PRESETS.get(name) if isinstance(name, str) else None
    if not preset:
        return data
    return _merge_under(data, preset)


def _paths(values: Mapping[str, Any], prefix: str = "") -> list[str]:
    out: list[str] = []
    for key, value in values.items():
        path = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.extend(_paths(value, path + "."))
        else:
            out.append(f"`{path}: {value}`")
    return out


def preset_summary(name: PresetName) -> str:
    """What a preset sets, as a Markdown list of ``path: value`` (for the field's docs)."""
    paths = _paths(PRESETS[name])
    return ", ".join(paths) if paths else "nothing"
