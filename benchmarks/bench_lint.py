"""Header-only lint at DeepSeek-V3 scale of names vs the floor baseline (safe_open + keys + shapes).

Generates (once, cached under --workdir) a checkpoint with DeepSeek-V3's tensor names — 61 decoder layers
(3 dense, 58 MoE with 256 experts, block-FP8 `weight_scale_inv` companions), one MTP layer, 163 shards —
holding tiny tensors, written with safetensors' own writer. Then, in one run, times:

* baseline: `safetensors.safe_open` on every shard, listing keys and shapes (the least any reader does);
* weightcheck lint in-process (all lint rules), and the `weightcheck lint` console script end to end
  (interpreter start-up included) against a `python -c` running the baseline.

Reports medians, the ratio lint / baseline, and bytes read by the header-only reader. Child processes run
with bytecode caching on (as an installed package does) and after an untimed warm-up run. The two console
runs are also timed in CPU time (user + system of the whole child process, far less sensitive to other
jobs on a shared machine than wall time), alternating, optionally with another source tree's lint in the
same rounds; the ratio is given from the two medians and as the median of the per-round ratios (with the
middle half of those), which a machine that slows down during the run moves less (`--baseline-tree DIR`:
a directory holding another checkout's `weightcheck/` and `patterns/`, e.g.
`git archive <commit> weightcheck patterns | tar -x -C DIR`).

    python benchmarks/bench_lint.py [--workdir DIR] [--repeat 5] [--baseline-tree DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from childproc import child_cpu_seconds

N_LAYERS, N_DENSE, N_EXPERTS, N_SHARDS = 61, 3, 256, 163


def layer_names(layer: int) -> list[str]:
    p = f"model.layers.{layer}"
    linear = [
        "self_attn.q_a_proj",
        "self_attn.q_b_proj",
        "self_attn.kv_a_proj_with_mqa",
        "self_attn.kv_b_proj",
        "self_attn.o_proj",
    ]
    names = [
        f"{p}.input_layernorm.weight",
        f"{p}.post_attention_layernorm.weight",
        f"{p}.self_attn.q_a_layernorm.weight",
        f"{p}.self_attn.kv_a_layernorm.weight",
    ]
    if layer < N_DENSE:
        linear += ["mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"]
    else:
        names += [f"{p}.mlp.gate.weight", f"{p}.mlp.gate.e_score_correction_bias"]
        linear += [f"mlp.shared_experts.{x}_proj" for x in ("gate", "up", "down")]
        linear += [f"mlp.experts.{e}.{x}_proj" for e in range(N_EXPERTS) for x in ("gate", "up", "down")]
    if layer == N_LAYERS:  # MTP layer
        names += [
            f"{p}.enorm.weight",
            f"{p}.hnorm.weight",
            f"{p}.shared_head.norm.weight",
            f"{p}.shared_head.head.weight",
            f"{p}.embed_tokens.weight",
        ]
        linear += ["eh_proj"]
    for m in linear:
        names += [f"{p}.{m}.weight", f"{p}.{m}.weight_scale_inv"]
    return names


# Tiny dimensions that make every shape consistent with the config (so the run is clean and times the
# normal path, not error formatting), at DeepSeek-V3's count of layers, experts and shards.
DIMS = dict(
    hidden_size=16,
    num_attention_heads=2,
    q_lora_rank=8,
    kv_lora_rank=8,
    qk_nope_head_dim=4,
    qk_rope_head_dim=4,
    v_head_dim=4,
    intermediate_size=32,
    moe_intermediate_size=8,
    vocab_size=64,
)


def shape_of(name: str) -> tuple[int, ...]:
    d = DIMS
    h, heads = d["hidden_size"], d["num_attention_heads"]
    table = {
        "q_a_proj": (d["q_lora_rank"], h),
        "q_b_proj": (heads * (d["qk_nope_head_dim"] + d["qk_rope_head_dim"]), d["q_lora_rank"]),
        "kv_a_proj_with_mqa": (d["kv_lora_rank"] + d["qk_rope_head_dim"], h),
        "kv_b_proj": (heads * (d["qk_nope_head_dim"] + d["v_head_dim"]), d["kv_lora_rank"]),
        "o_proj": (h, heads * d["v_head_dim"]),
        "eh_proj": (h, 2 * h),
        "q_a_layernorm": (d["q_lora_rank"],),
        "kv_a_layernorm": (d["kv_lora_rank"],),
    }
    parts = name.split(".")
    module = parts[-2]
    if module in table:
        return table[module]
    if ("experts" in parts and "shared_experts" not in parts) or "shared_experts" in parts:
        inter = d["moe_intermediate_size"]
    else:
        inter = d["intermediate_size"]
    if module in ("gate_proj", "up_proj"):
        return (inter, h)
    if module == "down_proj":
        return (h, inter)
    if module == "gate":
        return (256,) if parts[-1] == "e_score_correction_bias" else (256, h)
    if module in ("embed_tokens", "head", "lm_head"):
        return (d["vocab_size"], h)
    return (h,)


def generate(root: Path) -> Path:
    import torch
    from safetensors.torch import save_file

    ckpt = root / "deepseek-v3-names-v2"
    if (ckpt / "model.safetensors.index.json").exists():
        return ckpt
    ckpt.mkdir(parents=True, exist_ok=True)
    names = ["model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"]
    for layer in range(N_LAYERS + 1):
        names += layer_names(layer)
    per_shard = -(-len(names) // N_SHARDS)
    weight_map: dict[str, str] = {}
    total = 0
    for s in range(N_SHARDS):
        chunk = names[s * per_shard : (s + 1) * per_shard]
        fname = f"model-{s + 1:05d}-of-{N_SHARDS:06d}.safetensors"
        tensors = {}
        for n in chunk:
            if n.endswith("weight_scale_inv"):
                t = torch.ones(1, 1, dtype=torch.float32)  # one 128x128 block covers a tiny weight
            elif (
                n.endswith(".weight")
                and len(shape_of(n)) == 2
                and "embed" not in n
                and "gate.weight" not in n
                and "lm_head" not in n
                and "shared_head.head" not in n
            ):
                t = torch.zeros(shape_of(n), dtype=torch.float8_e4m3fn)
            else:
                t = torch.ones(shape_of(n), dtype=torch.float32 if "bias" in n else torch.bfloat16)
            tensors[n] = t
            total += t.numel() * t.element_size()
            weight_map[n] = fname
        save_file(tensors, str(ckpt / fname), metadata={"format": "pt"})
    (ckpt / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map})
    )
    config = {
        "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "num_hidden_layers": N_LAYERS,
        "num_nextn_predict_layers": 1, "n_routed_experts": N_EXPERTS, "first_k_dense_replace": N_DENSE,
        "moe_layer_freq": 1, "n_shared_experts": 1, "tie_word_embeddings": False, **DIMS,
        "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                                "weight_block_size": [128, 128]},
    }  # fmt: skip
    (ckpt / "config.json").write_text(json.dumps(config))
    return ckpt


def baseline(ckpt: Path) -> int:
    from safetensors import safe_open

    count = 0
    for f in sorted(ckpt.glob("*.safetensors")):
        with safe_open(str(f), framework="numpy") as fh:
            for k in fh.keys():
                fh.get_slice(k).get_shape()
                count += 1
    return count


BASELINE_SNIPPET = (
    "import sys, pathlib; from safetensors import safe_open\n"
    "n = 0\n"
    "for f in sorted(pathlib.Path(sys.argv[1]).glob('*.safetensors')):\n"
    "    with safe_open(str(f), framework='numpy') as fh:\n"
    "        for k in fh.keys():\n"
    "            fh.get_slice(k).get_shape(); n += 1\n"
    "print(n)\n"
)


def cpu_seconds(args: list[str], tree: Path | None = None) -> float:
    """User + system CPU seconds of one child process (`childproc.child_cpu_seconds`); lint may exit 1."""
    seconds, code = child_cpu_seconds(args, tree)
    if code not in (0, 1):
        raise SystemExit(f"{args[:4]} exited {code}")
    return seconds


def timed(fn, repeat: int) -> float:
    samples = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workdir", type=Path, default=Path(os.environ.get("TMPDIR", "/tmp")) / "weightcheck-bench")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--baseline-tree", type=Path)
    args = ap.parse_args()
    # As installed: compiled bytecode is cached (pip compiles it at install time, and the floor's safetensors
    # and numpy have theirs). With PYTHONDONTWRITEBYTECODE set and no __pycache__ in a source tree, every lint
    # process would compile weightcheck's modules again (~0.17 s CPU on the 2-core machine), which the floor
    # never pays. Child processes inherit this; a warm-up round below writes the caches before timing.
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)

    ckpt = generate(args.workdir)
    from weightcheck.linting import lint

    n_tensors = baseline(ckpt)
    result = lint(ckpt)
    assert result.checked["tensors"] == n_tensors, (result.checked, n_tensors)
    t_base = timed(lambda: baseline(ckpt), args.repeat)
    t_lint = timed(lambda: lint(ckpt), args.repeat)
    # Header reading plus the file/index rules only (what the safe_open baseline also does, and a bit more).
    t_integrity = timed(lambda: lint(ckpt, select=["WC1", "WC2"]), args.repeat)

    exe = [sys.executable, "-m", "weightcheck", "lint", str(ckpt), "--format", "json", "-o", os.devnull]
    subprocess.run(exe, check=False)  # warm-up: bytecode cache
    t_cli = timed(lambda: subprocess.run(exe, check=False), args.repeat)
    t_cli_base = timed(
        lambda: subprocess.run([sys.executable, "-c", BASELINE_SNIPPET, str(ckpt)], check=True, capture_output=True),
        args.repeat,
    )
    # CPU time, commands alternating within each round: floor, this tree, the baseline tree if given.
    root = Path(__file__).resolve().parent.parent
    lint_args = [sys.executable, "-m", "weightcheck", "lint", str(ckpt), "--format", "json", "-o", os.devnull]
    runs: dict[str, tuple[list[str], Path | None]] = {
        "floor": ([sys.executable, "-c", BASELINE_SNIPPET, str(ckpt)], None),
        "lint": (lint_args, root),
    }
    if args.baseline_tree:
        runs["baseline_tree"] = (lint_args, args.baseline_tree.resolve())
    for cmd, tree in runs.values():  # warm-up, untimed: writes each tree's bytecode cache
        cpu_seconds(cmd, tree)
    cpu: dict[str, list[float]] = {k: [] for k in runs}
    for _ in range(args.repeat):
        for key, (cmd, tree) in runs.items():
            cpu[key].append(cpu_seconds(cmd, tree))
    cpu_med = {k: statistics.median(v) for k, v in cpu.items()}
    # The same ratio taken round by round (each round runs the floor and lint back to back): a machine that
    # slows down or speeds up over the run moves both, where medians of the two series can pair a quiet
    # floor with a disturbed lint. The middle half of the per-round ratios shows the spread.
    per_round = sorted(lint_s / floor_s for lint_s, floor_s in zip(cpu["lint"], cpu["floor"], strict=True))
    quartiles = statistics.quantiles(per_round, n=4) if len(per_round) > 1 else [per_round[0]] * 3
    shard_bytes = sum(f.stat().st_size for f in ckpt.glob("*.safetensors"))
    index_bytes = (ckpt / "model.safetensors.index.json").stat().st_size
    report = {
        "shards": len(list(ckpt.glob("*.safetensors"))),
        "tensors": n_tensors,
        "findings": len(result.findings),
        "baseline_safe_open_s": round(t_base, 3),
        "lint_in_process_s": round(t_lint, 3),
        "ratio_in_process": round(t_lint / t_base, 2),
        "lint_wc1_wc2_only_s": round(t_integrity, 3),
        "ratio_wc1_wc2_only": round(t_integrity / t_base, 2),
        "baseline_cli_s": round(t_cli_base, 3),
        "lint_cli_s": round(t_cli, 3),
        "ratio_cli": round(t_cli / t_cli_base, 2),
        "baseline_cli_cpu_s": round(cpu_med["floor"], 3),
        "lint_cli_cpu_s": round(cpu_med["lint"], 3),
        "ratio_cli_cpu": round(cpu_med["lint"] / cpu_med["floor"], 2),
        "ratio_cli_cpu_per_round_median": round(statistics.median(per_round), 2),
        "ratio_cli_cpu_per_round_middle_half": [round(quartiles[0], 2), round(quartiles[2], 2)],
        **(
            {
                "baseline_tree_cli_cpu_s": round(cpu_med["baseline_tree"], 3),
                "ratio_cli_cpu_vs_baseline_tree": round(cpu_med["lint"] / cpu_med["baseline_tree"], 2),
                "ratio_cli_cpu_vs_baseline_tree_per_round_median": round(
                    statistics.median(a / b for a, b in zip(cpu["lint"], cpu["baseline_tree"], strict=True)), 2
                ),
            }
            if "baseline_tree" in cpu_med
            else {}
        ),
        "load_average": round(os.getloadavg()[0], 2),
        "header_bytes_read": result.checked["header_bytes_read"],
        "index_bytes": index_bytes,
        "shard_bytes_on_disk": shard_bytes,
    }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
