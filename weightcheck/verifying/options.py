"""Options of `weightcheck verify` that describe the run being checked (not the records)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class TrainerLayout:
    """How the trainer that pushed the weights was parallelised (Megatron); None = unknown."""

    pp_size: int | None = None
    vp_size: int | None = None
    first_stage_layers: int | None = None
    last_stage_layers: int | None = None
    layout: str | None = None
    ep_size: int | None = None

    def filled_from(self, meta: Mapping[str, Any]) -> TrainerLayout:
        """Fields not set here taken from trainer manifest metadata."""
        values = {key: getattr(self, key) for key in self.__dataclass_fields__}
        for key in values:
            if values[key] is None and meta.get(key) is not None:
                values[key] = meta[key]
        return TrainerLayout(**values)
