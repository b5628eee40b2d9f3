"""Manifest parts relabelled like the checkpoint path: virtual pipeline stages (VPP), and a gathered stream
that sends names twice because one rank forgot its offset; the stage guess names no rank the run may not
have; wording after the engine raised; a square tensor sent transposed. Engines are tests/test_tap.py's
SGLang-style modules with the tap on; references are safetensors checkpoints and ManifestWriter parts."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import save_file
from test_tap import Engine, stream

from weightcheck import tap
from weightcheck.findings import Finding, Result
from weightcheck.manifest import ManifestWriter, manifest_part_path
from weightcheck.verifying import TrainerLayout, verify

Named = list[tuple[str, torch.Tensor]]


def layer(name: str) -> int:
    return int(name.split(".")[1])


def relayer(named: Named, shift: int) -> Named:
    return [(re.sub(r"^layers\.(\d+)", lambda m: f"layers.{int(m.group(1)) + shift}", n), t) for n, t in named]


def codes(result: Result, code: str) -> list[Finding]:
    return [f for f in result.findings if f.code == code]


@pytest.fixture
def run(tmp_path: Path) -> Callable[..., tuple[Path, Path, Path]]:
    """`run(clean, sends, parts, layers=, moe=)`: a checkpoint of `clean`, the engine fed `sends` (one
    load_weights call each, one sync "v1"), and manifest parts `[(trainer meta, named tensors)]`."""

    runs: list[int] = []

    def make(
        clean: Named,
        sends: list[Named],
        parts: list[tuple[dict[str, Any], Named]],
        layers: int,
        moe: bool = False,
        keep: bool = False,
    ) -> tuple[Path, Path, Path]:
        runs.append(len(runs))
        here = tmp_path / f"run{len(runs)}"
        ckpt, records, manifests = here / "ckpt", here / "records", here / "manifests"
        ckpt.mkdir(parents=True)
        save_file({n: t.contiguous() for n, t in clean}, str(ckpt / "model.safetensors"))
        tap.configure(records, keep_tensors=keep)
        try:
            engine = Engine(layers, moe=moe)
            tap.wrap(engine)
            with tap.sync("v1"):
                for named in sends:
                    # An engine refusing a tensor raises; the test's sync goes on (the tap records WC739).
                    with contextlib.suppress(RuntimeError):
                        engine.load_weights(iter(named))
        finally:
            tap.configure(None)
        for meta, named in parts:
            path = manifest_part_path(
                manifests, "v1", pp_rank=meta.get("pp_rank") or 0, ep_rank=meta.get("ep_rank") or 0
            )
            writer = ManifestWriter(path, weight_version="v1", **meta)
            writer.add_many(named)
            writer.write()
        return ckpt, records, manifests / "v1"

    return make


# ---- VPP: pp 2 × vp 2, 8 layers: (0,0) 0..1, (1,0) 2..3, (0,1) 4..5, (1,1) 6..7 ------------------------

VPP = {"pp_size": 2, "vp_size": 2, "num_layers": 8}


def _vpp_chunks(clean: Named) -> dict[tuple[int, int], Named]:
    owner = {0: (0, 0), 1: (0, 0), 2: (1, 0), 3: (1, 0), 4: (0, 1), 5: (0, 1), 6: (1, 1), 7: (1, 1)}
    chunks: dict[tuple[int, int], Named] = {key: [] for key in sorted(set(owner.values()))}
    for name, tensor in clean:
        chunks[owner[layer(name)]].append((name, tensor))
    return chunks


@pytest.mark.parametrize(
    ("buggy", "stage"),
    [
        ((1, 1), "pp_rank 1 vp_stage 1"),  # its local ids collide with another rank's part
        ((0, 1), "pp_rank 0 vp_stage 1"),  # its local ids collide with its own first virtual stage
    ],
)
def test_vpp_offset_bug_against_parts_names_the_virtual_stage(run: Any, buggy: tuple[int, int], stage: str) -> None:
    clean = stream(8)
    chunks = _vpp_chunks(clean)
    offset = min(layer(n) for n, _ in chunks[buggy])
    chunks[buggy] = relayer(chunks[buggy], -offset)  # this virtual stage forgot its offset
    rank_streams = [chunks[(p, 0)] + chunks[(p, 1)] for p in (0, 1)]  # a rank sends its chunks in order
    parts = [({**VPP, "pp_rank": p}, rank_streams[p]) for p in (0, 1)]
    ckpt, records, manifests = run(clean, rank_streams, parts, layers=8)

    for against, trainer in ((manifests, None), (ckpt, TrainerLayout(pp_size=2, vp_size=2))):
        result = verify(records, against, trainer=trainer)
        (shift,) = codes(result, "WC725")
        assert f"layers 0..1 from {stage} shifted by −{offset}" in shift.message, shift.message
        assert f"{stage} sent its local layer ids without its offset {offset}" in shift.message
        assert not codes(result, "WC721"), [f.message for f in codes(result, "WC721")]


def test_vpp_clean_parts_give_no_finding(run: Any) -> None:
    clean = stream(8)
    chunks = _vpp_chunks(clean)
    rank_streams = [chunks[(p, 0)] + chunks[(p, 1)] for p in (0, 1)]
    _, records, manifests = run(clean, rank_streams, [({**VPP, "pp_rank": p}, rank_streams[p]) for p in (0, 1)], 8)
    result = verify(records, manifests)
    assert result.findings == [], [f.message for f in result.findings]


# ---- a gathered stream (every EP rank's experts on one sender) ----------------------------------------------


def test_gathered_stream_sending_local_expert_ids_is_one_expert_shift(run: Any) -> None:
    clean = stream(2, moe=True)

    def expert(name: str) -> int | None:
        found = re.search(r"experts\.(\d+)\.", name)
        return int(found.group(1)) if found else None

    dense = [(n, t) for n, t in clean if expert(n) is None]
    rank0 = [(n, t) for n, t in clean if expert(n) is not None and expert(n) < 2]  # type: ignore[operator]
    rank1 = [
        (n.replace(f"experts.{expert(n)}.", f"experts.{expert(n) - 2}."), t) for n, t in clean if (expert(n) or 0) >= 2
    ]
    sent = dense + rank0 + rank1  # EP rank 1 named its experts 2..3 with its local ids 0..1
    meta = {"pp_size": 1, "ep_size": 2, "num_layers": 2, "num_experts": 4}
    _, records, manifests = run(clean, [sent], [(meta, sent)], layers=2, moe=True)
    result = verify(records, manifests)
    (shift,) = codes(result, "WC726")
    assert "experts 0..1 from ep_rank 1 shifted by −2" in shift.message, shift.message
    assert not codes(result, "WC721")


# ---- the stage guess without a layout ------------------------------------------------------------------


def test_assumed_split_names_no_rank_the_run_may_not_have(run: Any) -> None:
    clean = stream(4)
    sent = [(n, t) for n, t in clean if layer(n) != 3] + relayer([(n, t) for n, t in clean if layer(n) == 3], -3)
    _, records, _ = run(clean, [sent], [], layers=4)
    ckpt = records.parent / "ckpt"  # the run folder of this push
    (shift,) = codes(verify(records, ckpt), "WC725")
    # One layer a stage: 4 stages, or pp 2 × vp 2. "pp_rank 3" would name a rank a 2-rank run lacks.
    assert "pp_rank 3" not in shift.details["stage"] and "layers 3" in shift.details["stage"]
    assert "--trainer-vp" in shift.message
    (exact,) = codes(verify(records, ckpt, trainer=TrainerLayout(pp_size=2, vp_size=2)), "WC725")
    assert exact.details["stage"] == "pp_rank 1 vp_stage 1"


# ---- the engine raised -----------------------------------------------------------------------------------


def test_after_the_engine_raised_sent_tensors_are_not_called_dropped_or_never_sent(run: Any) -> None:
    clean = stream(2)
    bad = "layers.0.k_proj.weight"
    # A non-square tensor sent transposed: the stacked loader's copy raises (as SGLang's does).
    sent = [(n, torch.zeros(8, 9) if n == bad else t) for n, t in clean]
    position = [n for n, _ in sent].index(bad)
    unconsumed = {n for n, _ in sent[position + 1 :]}
    assert unconsumed
    ckpt, records, manifests = run(clean, [sent], [({"pp_size": 1, "num_layers": 2}, sent)], layers=2)
    for against, said in ((manifests, "sent by the trainer"), (ckpt, "never received by the engine")):
        result = verify(records, against)
        assert codes(result, "WC739")
        (raised,) = [f for f in codes(result, "WC731") if bad in f.details["names"]]
        assert "the engine raised while loading it" in raised.message and "silently" not in raised.message
        assert "no parameter of the engine takes this name" not in raised.message
        (missing,) = codes(result, "WC722")
        assert set(missing.details["names"]) == unconsumed and said in missing.message
        assert "never sent in this sync" not in missing.message and "WC739" in missing.message


@pytest.mark.parametrize("keep", [False, True], ids=["digest", "kept-tensor"])
def test_square_tensor_sent_transposed_is_named(run: Any, keep: bool) -> None:
    clean = stream(2)
    name = "layers.1.k_proj.weight"
    sent = [(n, t.t().contiguous() if n == name else t) for n, t in clean]
    ckpt, records, _ = run(clean, [sent], [], layers=2, keep=keep)
    (mismatch,) = codes(verify(records, ckpt), "WC727")
    assert "sent transposed" in mismatch.message and mismatch.details["class"] == "transposed"
    # Other wrong bytes of a square tensor stay "bytes differ" (or "values differ" with a kept tensor).
    sent = [(n, t.roll(1, 0).contiguous() if n == name else t) for n, t in clean]
    ckpt, records, _ = run(clean, [sent], [], layers=2, keep=keep)
    (mismatch,) = codes(verify(records, ckpt), "WC727")
    assert "transposed" not in mismatch.message
