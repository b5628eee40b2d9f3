"""`weightcheck layout`: which global layers (and experts) each Megatron / SGLang rank holds.

No checkpoint, no GPU: the maps of `weightcheck.layout` printed for one configuration, so an engineer can
see before a sync which trainer stage feeds which engine stage, and a script can read the same as JSON.

JSON document (`--format json`, schema_version 1.0; keys are stable, absent sections are null)::

    {"schema_version": "1.0", "tool": {"name": "weightcheck", "version": "0.1.0"}, "command": "layout",
     "megatron": {
       "config": {"num_layers": 28, "pp_size": 4, "vp_size": null, "first_stage_layers": 4,
                  "last_stage_layers": 6, "layout": null, "account_for_embedding": false,
                  "account_for_loss": false, "mtp_num_layers": null},
       "stages": [{"pp_rank": 0, "vp_stage": 0, "offset": 0, "num_layers": 4, "layers": [0, 1, 2, 3],
                   "ranges": "0..3", "sglang_pp_ranks": [0]}, ...],       # sglang_pp_ranks null without --sglang-pp
       "mtp": [{"index": 0, "megatron_prefix": "mtp.layers.0", "hf_layer": 28, "pp_rank": 3, "vp_stage": 0}]},
     "sglang": {"pp_size": 2, "partition": null, "partition_applied": false,
                "stages": [{"pp_rank": 0, "start": 0, "end": 14, "num_layers": 14,
                            "megatron_stages": [{"pp_rank": 0, "vp_stage": 0}, ...]}, ...]} | null,
     "ep": {"ep_size": 8, "num_experts": 256, "experts_per_rank": 32,
            "ranks": [{"ep_rank": 0, "start": 0, "end": 32, "experts": "0..31"}, ...]} | null,
     "notes": ["..."]}

Megatron stages are listed rank-major (`(pp_rank, vp_stage)` sorted); `ranges` is collapsed like `0..3,8..11`;
`[start, end)` are half-open. An invalid configuration is a usage error (exit 2).
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

import click

from weightcheck.cli import cli, config_and_output_options
from weightcheck.collapse import format_ranges
from weightcheck.layout import (
    MegatronPipeline,
    StageKey,
    ep_rank_experts,
    mtp_hf_layer,
    sglang_pp_ranges,
    stage_feeds,
    suggest_uneven_split,
)
from weightcheck.version import __version__

SCHEMA_VERSION = "1.0"


def build_report(
    pipe: MegatronPipeline,
    *,
    sglang_pp: int | None,
    sglang_partition: str | None,
    ep_size: int | None,
    num_experts: int | None,
) -> dict[str, Any]:
    """The JSON document described in the module docstring (raises ValueError for invalid settings)."""
    notes: list[str] = []
    stages = pipe.stage_layers()
    sglang: dict[str, Any] | None = None
    feeds: dict[StageKey, list[int]] = {}
    if sglang_pp is not None:
        ranges = sglang_pp_ranges(pipe.num_layers, sglang_pp, sglang_partition)
        applied = sglang_partition is not None and sglang_pp > 1
        if sglang_partition is not None and not applied:
            notes.append("SGLang ignores SGLANG_PP_LAYER_PARTITION when pp_size == 1; --sglang-partition not applied")
        feeds = stage_feeds(stages, ranges)
        sglang = {
            "pp_size": sglang_pp,
            "partition": sglang_partition,
            "partition_applied": applied,
            "stages": [
                {
                    "pp_rank": rank,
                    "start": start,
                    "end": end,
                    "num_layers": end - start,
                    "megatron_stages": [
                        {"pp_rank": key[0], "vp_stage": key[1]} for key in stages if rank in feeds[key]
                    ],
                }
                for rank, (start, end) in enumerate(ranges)
            ],
        }
    mtp: list[dict[str, Any]] = []
    mtp_stage = pipe.mtp_stage()
    if mtp_stage is not None and pipe.mtp_num_layers:
        for index in range(pipe.mtp_num_layers):
            mtp.append(
                {
                    "index": index,
                    "megatron_prefix": f"mtp.layers.{index}",
                    "hf_layer": mtp_hf_layer(index, pipe.num_layers),
                    "pp_rank": mtp_stage[0],
                    "vp_stage": mtp_stage[1],
                }
            )
    ep: dict[str, Any] | None = None
    if num_experts is not None:
        size = ep_size or 1
        ranks = [ep_rank_experts(rank, num_experts, size) for rank in range(size)]
        ep = {
            "ep_size": size,
            "num_experts": num_experts,
            "experts_per_rank": num_experts // size,
            "ranks": [
                {"ep_rank": rank, "start": r.start, "end": r.stop, "experts": format_ranges(r)}
                for rank, r in enumerate(ranks)
            ],
        }
    return {
        "schema_version": SCHEMA_VERSION,
        "tool": {"name": "weightcheck", "version": __version__},
        "command": "layout",
        "megatron": {
            "config": {
                "num_layers": pipe.num_layers,
                "pp_size": pipe.pp_size,
                "vp_size": pipe.vp_size,
                "first_stage_layers": pipe.first_stage_layers,
                "last_stage_layers": pipe.last_stage_layers,
                "layout": pipe.layout,
                "account_for_embedding": pipe.account_for_embedding,
                "account_for_loss": pipe.account_for_loss,
                "mtp_num_layers": pipe.mtp_num_layers,
            },
            "stages": [
                {
                    "pp_rank": key[0],
                    "vp_stage": key[1],
                    "offset": pipe.offset(*key),
                    "num_layers": len(layers),
                    "layers": layers,
                    "ranges": format_ranges(layers),
                    "sglang_pp_ranks": feeds[key] if sglang is not None else None,
                }
                for key, layers in stages.items()
            ],
            "mtp": mtp,
        },
        "sglang": sglang,
        "ep": ep,
        "notes": notes,
    }


def _describe(cfg: dict[str, Any]) -> str:
    parts = [f"{cfg['num_layers']} layers", f"pp={cfg['pp_size']}"]
    if cfg["vp_size"]:
        parts.append(f"vpp={cfg['vp_size']}")
    if cfg["first_stage_layers"] is not None:
        parts.append(f"first stage {cfg['first_stage_layers']}")
    if cfg["last_stage_layers"] is not None:
        parts.append(f"last stage {cfg['last_stage_layers']}")
    if cfg["layout"]:
        parts.append(f"layout {cfg['layout']!r}")
    if cfg["account_for_embedding"]:
        parts.append("embedding accounted")
    if cfg["account_for_loss"]:
        parts.append("loss accounted")
    if cfg["mtp_num_layers"]:
        parts.append(f"mtp={cfg['mtp_num_layers']}")
    return ", ".join(parts)


def _tables(doc: dict[str, Any]) -> list[tuple[str, list[str], list[list[str]]]]:
    """(title, header, rows) for each section of the text report."""
    meg = doc["megatron"]
    sglang = doc["sglang"]
    out: list[tuple[str, list[str], list[list[str]]]] = []
    header = ["pp_rank", "vp_stage", "offset", "layers", "global ids"]
    if sglang is not None:
        header.append("→ SGLang pp_rank")
    rows = []
    for st in meg["stages"]:
        row = [str(st["pp_rank"]), str(st["vp_stage"]), str(st["offset"]), str(st["num_layers"]), st["ranges"] or "—"]
        if sglang is not None:
            row.append(",".join(map(str, st["sglang_pp_ranks"])) or "—")
        rows.append(row)
    out.append((f"Megatron: {_describe(meg['config'])}", header, rows))
    if meg["mtp"]:
        out.append(
            (
                "MTP (no pipeline offset)",
                ["megatron", "HF layer", "pp_rank", "vp_stage"],
                [[m["megatron_prefix"], str(m["hf_layer"]), str(m["pp_rank"]), str(m["vp_stage"])] for m in meg["mtp"]],
            )
        )
    if sglang is not None:
        how = f"partition {sglang['partition']}" if sglang["partition_applied"] else "default partition"
        out.append(
            (
                f"SGLang: pp={sglang['pp_size']}, {how}",
                ["pp_rank", "start", "end", "layers", "← Megatron pp_rank/vp_stage"],
                [
                    [
                        str(st["pp_rank"]),
                        str(st["start"]),
                        str(st["end"]),
                        str(st["num_layers"]),
                        ", ".join(f"{m['pp_rank']}/{m['vp_stage']}" for m in st["megatron_stages"]) or "—",
                    ]
                    for st in sglang["stages"]
                ],
            )
        )
    ep = doc["ep"]
    if ep is not None:
        out.append(
            (
                f"EP: {ep['num_experts']} experts over ep={ep['ep_size']} ({ep['experts_per_rank']} per rank)",
                ["ep_rank", "global experts"],
                [[str(r["ep_rank"]), r["experts"]] for r in ep["ranks"]],
            )
        )
    return out


def render_text(doc: dict[str, Any], *, rich: bool) -> str | None:
    """Plain aligned text (returned), or rich tables printed straight to the terminal (returns None)."""
    tables = _tables(doc)
    if rich:
        from rich.console import Console
        from rich.table import Table

        console = Console(highlight=False)
        for title, header, rows in tables:
            console.print(title, style="bold", soft_wrap=True)  # a table title would wrap to the table width
            table = Table()
            for col in header:
                table.add_column(col)
            for row in rows:
                table.add_row(*row)
            console.print(table)
        for note in doc["notes"]:
            console.print(f"note: {note}", style="dim")
        return None
    lines: list[str] = []
    for title, header, rows in tables:
        if lines:
            lines.append("")
        lines.append(title)
        widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
        for row in [header, *rows]:
            lines.append("  " + "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
    lines.extend(f"note: {note}" for note in doc["notes"])
    return "\n".join(lines)


def _usage_error(exc: ValueError, pipe_kwargs: dict[str, Any]) -> click.UsageError:
    message = str(exc)
    plain = not (
        pipe_kwargs["first_stage_layers"] or pipe_kwargs["last_stage_layers"] or pipe_kwargs["layout"]
    ) and not (pipe_kwargs["account_for_embedding"] or pipe_kwargs["account_for_loss"])
    if plain and "not divisible by pp_size" in message:
        hint = suggest_uneven_split(pipe_kwargs["num_layers"], pipe_kwargs["pp_size"], pipe_kwargs["vp_size"])
        if hint:
            message += f" (e.g. --first-stage-layers {hint[0]} --last-stage-layers {hint[1]})"
    mtp = re.search(r"holds (\d+) MTP layers", message)
    if pipe_kwargs["layout"] and mtp:
        message += f" (pass --mtp {mtp.group(1)})"
    return click.UsageError(message)


@cli.command()
@click.option("--num-layers", type=click.IntRange(min=1), required=True, help="Decoder layers (num_hidden_layers).")
@click.option("--pp", type=click.IntRange(min=1), default=1, show_default=True, help="Megatron pipeline size.")
@click.option("--vpp", type=click.IntRange(min=1), default=None, help="Megatron virtual pipeline size.")
@click.option("--first-stage-layers", type=int, default=None, help="num_layers_in_first_pipeline_stage.")
@click.option("--last-stage-layers", type=int, default=None, help="num_layers_in_last_pipeline_stage.")
@click.option("--layout", default=None, help="pipeline_model_parallel_layout, e.g. 'Ettt|(tt|)*29,m|L'.")
@click.option("--account-embedding", is_flag=True, help="account_for_embedding_in_pipeline_split.")
@click.option("--account-loss", is_flag=True, help="account_for_loss_in_pipeline_split.")
@click.option("--mtp", type=click.IntRange(min=0), default=None, help="MTP layers (mtp_num_layers).")
@click.option("--sglang-pp", type=click.IntRange(min=1), default=None, help="SGLang pipeline size.")
@click.option(
    "--sglang-partition",
    default=None,
    help="SGLANG_PP_LAYER_PARTITION, e.g. '16,15,15,15' (implies --sglang-pp from its length).",
)
@click.option("--ep", "ep_size", type=click.IntRange(min=1), default=None, help="Expert-parallel size.")
@click.option("--num-experts", type=click.IntRange(min=1), default=None, help="Routed experts (needs --ep > 1 or 1).")
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default=None, help="text (default) or json.")
@config_and_output_options()
def layout(
    num_layers: int,
    pp: int,
    vpp: int | None,
    first_stage_layers: int | None,
    last_stage_layers: int | None,
    layout: str | None,
    account_embedding: bool,
    account_loss: bool,
    mtp: int | None,
    sglang_pp: int | None,
    sglang_partition: str | None,
    ep_size: int | None,
    num_experts: int | None,
    fmt: str | None,
    config_path: Path | None,
    output: Any,
) -> None:
    """Show which global layers each Megatron (pp_rank, vp_stage) and SGLang pp_rank holds.

    Offsets follow megatron-core's get_transformer_layer_offset (even, uneven first/last, VPP, layout
    strings); SGLang's partition follows get_pp_indices. Example: weightcheck layout --num-layers 28 --pp 4
    --first-stage-layers 4 --last-stage-layers 6 --sglang-pp 2
    """
    from weightcheck.cli import config_format

    fmt = config_format(None, config_path, ("text", "json"), fmt)
    if ep_size is not None and num_experts is None:
        raise click.UsageError("--ep needs --num-experts")
    if sglang_partition is not None and sglang_pp is None:
        sglang_pp = len(sglang_partition.split(","))
    pipe_kwargs: dict[str, Any] = {
        "num_layers": num_layers,
        "pp_size": pp,
        "vp_size": vpp,
        "first_stage_layers": first_stage_layers,
        "last_stage_layers": last_stage_layers,
        "layout": layout,
        "account_for_embedding": account_embedding,
        "account_for_loss": account_loss,
        "mtp_num_layers": mtp,
    }
    try:
        pipe = MegatronPipeline(**pipe_kwargs)
    except ValueError as exc:
        raise _usage_error(exc, pipe_kwargs) from None
    try:
        doc = build_report(
            pipe, sglang_pp=sglang_pp, sglang_partition=sglang_partition, ep_size=ep_size, num_experts=num_experts
        )
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    if fmt == "json":
        click.echo(json.dumps(doc, indent=2), file=output)
        return
    text = render_text(doc, rich=output.isatty() and output is sys.stdout)
    if text is not None:
        click.echo(text, file=output)
