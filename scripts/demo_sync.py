"""Write tap records of one weight sync without an engine, to try `weightcheck verify` anywhere (CPU, no SGLang).

A stand-in engine holds one parameter per checkpoint tensor; the checkpoint's own tensors are pushed into it
through the tap, as a trainer's sync would push them into SGLang. `--drop-layer N` leaves one layer out of
the push (what a pipeline stage that never sent its layers looks like).

    python scripts/demo_sync.py sample_configs/tiny-glm4-moe-w4a16-router-packed /tmp/wc-records --drop-layer 1
    weightcheck verify /tmp/wc-records --against sample_configs/tiny-glm4-moe-w4a16-router-packed

Needs `weightcheck[content]`.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Iterable, Iterator
from pathlib import Path

import torch
from safetensors import safe_open
from torch import nn

from weightcheck import tap


def _default_loader(param: torch.Tensor, loaded: torch.Tensor) -> None:
    param.data.copy_(loaded)


class StandInEngine(nn.Module):
    """One parameter per name; `load_weights` copies what it receives, like an engine's default loader."""

    def __init__(self, tensors: dict[str, torch.Tensor]) -> None:
        super().__init__()
        self._keys = {name: name.replace(".", "__") for name in tensors}
        for name, t in tensors.items():
            self.register_parameter(self._keys[name], nn.Parameter(torch.zeros_like(t), requires_grad=False))

    def named_parameters(self, *args: object, **kwargs: object) -> Iterator[tuple[str, nn.Parameter]]:  # type: ignore[override]
        for name, key in self._keys.items():
            yield name, getattr(self, key)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        params = dict(self.named_parameters())
        for name, tensor in weights:
            if name in params:
                # The tap attaches its recording weight_loader to each parameter, as SGLang models call it.
                getattr(params[name], "weight_loader", _default_loader)(params[name], tensor)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkpoint", type=Path)
    parser.add_argument("records", type=Path)
    parser.add_argument("--drop-layer", type=int, default=None)
    parser.add_argument("--weight-version", default="step-1")
    args = parser.parse_args()
    tensors: dict[str, torch.Tensor] = {}
    for shard in sorted(args.checkpoint.glob("*.safetensors")):
        with safe_open(shard, "pt") as fh:
            for name in fh.keys():
                tensors[name] = fh.get_tensor(name)
    sent = [
        (n, t)
        for n, t in tensors.items()
        if args.drop_layer is None or not re.search(rf"\.layers\.{args.drop_layer}\.", n)
    ]
    tap.configure(args.records)
    tap.set_engine_hooks(tap.EngineHooks(default_loader=_default_loader))
    tap.install(StandInEngine)
    engine = StandInEngine(tensors)
    with tap.sync(args.weight_version):
        engine.load_weights(iter(sent))
    tap.uninstall(StandInEngine)
    print(f"pushed {len(sent)} of {len(tensors)} tensors; records under {args.records}")


if __name__ == "__main__":
    main()
