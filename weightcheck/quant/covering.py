"""Ignore-list entries that cover a set of module names for every consumer: what WC3xx findings propose as
their fix (and what `lint --fix` then writes). Knowledge of ignore-list syntax, below the rules that use it."""

from __future__ import annotations

import re
from collections.abc import Iterable


def ignore_entries(names: Iterable[str]) -> list[str]:
    """The ignore entries that cover `names` and their layer/expert peers: one anchored-suffix regex per
    distinct tail after the last numeric id (`model.layers.3.mlp.gate` → `re:.*mlp\\.gate($|\\..*)`),
    matched by module-name and parameter-name consumers alike."""
    out: dict[str, None] = {}
    for name in names:
        parts = name.split(".")
        last_id = max((i for i, p in enumerate(parts) if p.isdigit()), default=-1)
        tail = parts[last_id + 1 :] if last_id + 1 < len(parts) else parts[-1:]
        if last_id == -1 and len(parts) > 1:
            tail = parts[-1:]  # model.embed_tokens → embed_tokens (also language_model.model.embed_tokens)
        out["re:.*" + re.escape(".".join(tail)) + r"($|\..*)"] = None
    return list(out)


def covering_entries(names: list[str], consumer_keys: Iterable[str]) -> list[str]:
    """`ignore_entries(names)`, plus the exact name for any consumer the regex form does not cover."""
    from weightcheck.quant.matchers import get_consumer

    regexes = ignore_entries(names)
    exact: list[str] = []
    used = False
    for key in consumer_keys:
        consumer = get_consumer(key)
        for name in names:
            probe = f"{name}.weight" if consumer.level == "param" else name
            if consumer.matches(probe, regexes):
                used = True
            else:
                exact.append(name)  # e.g. modules_to_not_convert readers that take no `re:` entries
    return list(dict.fromkeys([*(regexes if used else []), *exact]))
