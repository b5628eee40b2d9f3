"""Whole-process lint of real-world inputs, each against its floor baseline, in one run.

Run in an environment that HAS compressed-tensors (and torch) installed — every llm-compressor user's
environment — since that is where importing it on the lint path used to cost seconds:

    python benchmarks/bench_lint_real.py [--workdir DIR] [--repeat 7]

Inputs (generated once under --workdir; checkpoints written with safetensors' own writer, tiny data):

* config-only (floor: a `python -c` that json-parses config.json):
  - the published Qwen3-30B-A3B-FP8 config (`sample_configs/qwen3-30b-a3b-fp8-block`, 145-entry
    `modules_to_not_convert`);
  - a Qwen3-235B-A22B-style FP8 config: 94 layers x 128 experts, a list of the same shape (283 entries);
  - the DeepSeek-V3 config (61 layers, 256 experts, block FP8), and a W4A16 compressed-tensors variant whose
    ignore list names every router and every `kv_a_proj_with_mqa` one by one (llm-compressor style);
* header-only (floor: a `python -c` that opens every shard with `safetensors.safe_open` and lists keys and
  shapes):
  - DeepSeek-V3 names with block-FP8 `weight_scale_inv` companions (163 shards, ~92k tensors; as
    `bench_lint.py`);
  - Qwen3-235B-A22B names quantized W4A16 by compressed-tensors' format (`weight_packed`, `weight_scale`,
    `weight_shape`; 94 layers x 128 experts, ~110k tensors), with a consistent config.

Every lint runs as `python -m weightcheck lint PATH --format json` twice: as is (compressed-tensors
importable) and with compressed-tensors blocked (`sys.modules["compressed_tensors"] = None`), so the two
columns show whether having it installed costs anything. Commands alternate within each repetition; the
figures are medians of wall time.
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

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))

CONFIG_FLOOR = "import json, sys; json.load(open(sys.argv[1] + '/config.json'))"
HEADER_FLOOR = (
    "import sys, pathlib; from safetensors import safe_open\n"
    "n = 0\n"
    "for f in sorted(pathlib.Path(sys.argv[1]).glob('*.safetensors')):\n"
    "    with safe_open(str(f), framework='numpy') as fh:\n"
    "        for k in fh.keys():\n"
    "            fh.get_slice(k).get_shape(); n += 1\n"
)
LINT = "import sys; from weightcheck.cli import main; sys.argv = ['weightcheck', 'lint', *sys.argv[1:]]; main()"
LINT_NO_CT = "import sys; sys.modules['compressed_tensors'] = None; " + LINT.removeprefix("import sys; ")


# ---- inputs -------------------------------------------------------------------------------------------


def qwen3_235b_config() -> dict:
    sample = json.loads((ROOT / "sample_configs" / "qwen3-30b-a3b-fp8-block" / "config.json").read_text())
    config = {k: v for k, v in sample.items() if k != "quantization_config"}
    config.update(
        hidden_size=4096, intermediate_size=12288, moe_intermediate_size=1536, num_attention_heads=64,
        num_key_value_heads=4, num_hidden_layers=94, num_experts=128, max_window_layers=94,
    )  # fmt: skip
    return config


def qwen3_235b_fp8(root: Path) -> Path:
    out = root / "config-qwen3-235b-a22b-fp8"
    config = qwen3_235b_config()
    ignore = ["lm_head"]
    for i in range(config["num_hidden_layers"]):
        ignore += [f"model.layers.{i}.{m}" for m in ("input_layernorm", "mlp.gate", "post_attention_layernorm")]
    config["quantization_config"] = {
        "activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8", "weight_block_size": [128, 128],
        "modules_to_not_convert": ignore,
    }  # fmt: skip
    return _write_config(out, config)


def deepseek_v3_config() -> dict:
    return {
        "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "hidden_size": 7168,
        "intermediate_size": 18432, "moe_intermediate_size": 2048, "num_hidden_layers": 61,
        "num_nextn_predict_layers": 1, "num_attention_heads": 128, "num_key_value_heads": 128,
        "n_routed_experts": 256, "n_shared_experts": 1, "first_k_dense_replace": 3, "moe_layer_freq": 1,
        "q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
        "v_head_dim": 128, "vocab_size": 129280, "tie_word_embeddings": False, "topk_method": "noaux_tc",
        "scoring_func": "sigmoid", "num_experts_per_tok": 8, "n_group": 8, "topk_group": 4,
        "rms_norm_eps": 1e-06, "torch_dtype": "bfloat16",
        "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                                "weight_block_size": [128, 128]},
    }  # fmt: skip


def ct_w4a16(ignore: list[str]) -> dict:
    return {
        "quant_method": "compressed-tensors", "format": "pack-quantized", "quantization_status": "compressed",
        "version": "0.19.0", "ignore": ignore,
        "config_groups": {"group_0": {
            "targets": ["Linear"], "format": "pack-quantized", "input_activations": None, "output_activations": None,
            "weights": {"num_bits": 4, "type": "int", "symmetric": True, "strategy": "group", "group_size": 128,
                        "dynamic": False, "actorder": None, "observer": "minmax"},
        }},
    }  # fmt: skip


def deepseek_v3_w4a16(root: Path) -> Path:
    config = deepseek_v3_config()
    ignore = ["lm_head"]
    for i in range(config["num_hidden_layers"]):
        ignore.append(f"model.layers.{i}.self_attn.kv_a_proj_with_mqa")
        if i >= config["first_k_dense_replace"]:
            ignore.append(f"model.layers.{i}.mlp.gate")
    config["quantization_config"] = ct_w4a16(ignore)
    return _write_config(root / "config-deepseek-v3-w4a16", config)


def _write_config(out: Path, config: dict) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(config, indent=2))
    return out


def qwen3_235b_w4a16_checkpoint(root: Path) -> Path:
    """Qwen3-235B-A22B's names (94 layers x 128 experts) quantized W4A16, tiny dimensions."""
    import torch
    from safetensors.torch import save_file

    ckpt = root / "ckpt-qwen3-235b-a22b-w4a16"
    if (ckpt / "model.safetensors.index.json").exists():
        return ckpt
    layers, experts, shards = 94, 128, 118
    h, heads, kv, hd, inter, moe, vocab = 64, 4, 2, 16, 64, 32, 256
    config = qwen3_235b_config()
    config.update(hidden_size=h, num_attention_heads=heads, num_key_value_heads=kv, head_dim=hd,
                  intermediate_size=inter, moe_intermediate_size=moe, vocab_size=vocab,
                  quantization_config=ct_w4a16(["lm_head", "re:.*mlp.gate$"]))  # fmt: skip
    tensors: list[tuple[str, torch.Tensor]] = []

    def linear(name: str, out: int, inp: int) -> None:
        tensors.append((f"{name}.weight_packed", torch.zeros(out, inp * 4 // 32, dtype=torch.int32)))
        tensors.append((f"{name}.weight_scale", torch.ones(out, -(-inp // 128), dtype=torch.bfloat16)))
        tensors.append((f"{name}.weight_shape", torch.tensor([out, inp], dtype=torch.int64)))

    bf16 = torch.bfloat16
    tensors += [("model.embed_tokens.weight", torch.zeros(vocab, h, dtype=bf16)),
                ("model.norm.weight", torch.ones(h, dtype=bf16)),
                ("lm_head.weight", torch.zeros(vocab, h, dtype=bf16))]  # fmt: skip
    for i in range(layers):
        p = f"model.layers.{i}"
        tensors += [(f"{p}.input_layernorm.weight", torch.ones(h, dtype=bf16)),
                    (f"{p}.post_attention_layernorm.weight", torch.ones(h, dtype=bf16)),
                    (f"{p}.self_attn.q_norm.weight", torch.ones(hd, dtype=bf16)),
                    (f"{p}.self_attn.k_norm.weight", torch.ones(hd, dtype=bf16)),
                    (f"{p}.mlp.gate.weight", torch.zeros(experts, h, dtype=bf16))]  # fmt: skip
        linear(f"{p}.self_attn.q_proj", heads * hd, h)
        linear(f"{p}.self_attn.k_proj", kv * hd, h)
        linear(f"{p}.self_attn.v_proj", kv * hd, h)
        linear(f"{p}.self_attn.o_proj", h, heads * hd)
        for e in range(experts):
            linear(f"{p}.mlp.experts.{e}.gate_proj", moe, h)
            linear(f"{p}.mlp.experts.{e}.up_proj", moe, h)
            linear(f"{p}.mlp.experts.{e}.down_proj", h, moe)
    return _write_shards(ckpt, tensors, shards, config, save_file)


def _write_shards(ckpt: Path, tensors: list, shards: int, config: dict, save_file) -> Path:
    ckpt.mkdir(parents=True, exist_ok=True)
    per = -(-len(tensors) // shards)
    weight_map: dict[str, str] = {}
    total = 0
    for s in range(shards):
        chunk = dict(tensors[s * per : (s + 1) * per])
        fname = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        save_file(chunk, str(ckpt / fname), metadata={"format": "pt"})
        for name, t in chunk.items():
            weight_map[name] = fname
            total += t.numel() * t.element_size()
    (ckpt / "config.json").write_text(json.dumps(config, indent=2))
    (ckpt / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map})
    )
    return ckpt


def inputs(root: Path) -> list[tuple[str, str, Path]]:
    import bench_lint

    return [
        ("config", "Qwen3-30B-A3B-FP8 (published, 145 entries)", ROOT / "sample_configs" / "qwen3-30b-a3b-fp8-block"),
        ("config", "Qwen3-235B-A22B-style FP8 (94x128, 283 entries)", qwen3_235b_fp8(root)),
        ("config", "DeepSeek-V3 FP8 block (61x256)", _write_config(root / "config-deepseek-v3", deepseek_v3_config())),
        ("config", "DeepSeek-V3 W4A16, 120 per-module entries", deepseek_v3_w4a16(root)),
        ("header", "DeepSeek-V3 FP8 block names (163 shards)", bench_lint.generate(root)),
        ("header", "Qwen3-235B-A22B W4A16 names (118 shards)", qwen3_235b_w4a16_checkpoint(root)),
    ]


# ---- timing ------------------------------------------------------------------------------------------


def run_once(argv: list[str], env: dict[str, str]) -> tuple[float, int]:
    t0 = time.perf_counter()
    proc = subprocess.run(argv, env=env, capture_output=True, check=False)
    elapsed = time.perf_counter() - t0
    if proc.returncode not in (0, 1):
        raise SystemExit(f"{argv} failed ({proc.returncode}): {proc.stderr.decode()[-2000:]}")
    return elapsed, proc.returncode


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workdir", type=Path, default=Path(os.environ.get("TMPDIR", "/tmp")) / "weightcheck-bench")
    ap.add_argument("--repeat", type=int, default=7)
    args = ap.parse_args()
    import importlib.util

    if importlib.util.find_spec("compressed_tensors") is None:
        print("warning: compressed-tensors is not installed; the 'installed' column means nothing", file=sys.stderr)
    cases = inputs(args.workdir)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    py = sys.executable
    commands: dict[tuple[int, str], list[str]] = {}
    for i, (kind, _, path) in enumerate(cases):
        floor = CONFIG_FLOOR if kind == "config" else HEADER_FLOOR
        commands[(i, "floor")] = [py, "-c", floor, str(path)]
        tail = [str(path), "--format", "json", "-o", os.devnull]
        commands[(i, "lint")] = [py, "-c", LINT, *tail]
        commands[(i, "lint_no_ct")] = [py, "-c", LINT_NO_CT, *tail]
    findings = {}
    for i, (_, _, path) in enumerate(cases):  # warm the page cache; record the verdict once
        proc = subprocess.run([py, "-c", LINT, str(path), "--format", "json"], env=env, capture_output=True)
        findings[i] = json.loads(proc.stdout)["summary"]
    load_before = os.getloadavg()
    samples: dict[tuple[int, str], list[float]] = {k: [] for k in commands}
    for _ in range(args.repeat):
        for key, argv in commands.items():  # alternate: every command once per repetition
            samples[key].append(run_once(argv, env)[0])
    load_after = os.getloadavg()
    rows = []
    for i, (kind, label, _) in enumerate(cases):
        floor, lint, no_ct = (statistics.median(samples[(i, k)]) for k in ("floor", "lint", "lint_no_ct"))
        rows.append({
            "input": label, "mode": f"{kind}-only", "floor_s": round(floor, 3), "lint_s": round(lint, 3),
            "ratio": round(lint / floor, 2), "lint_ct_blocked_s": round(no_ct, 3),
            "ct_installed_vs_blocked": round(lint / no_ct, 2),
            "findings": {k: findings[i][k] for k in ("error", "warning", "info")},
            "tensors": findings[i]["checked"].get("tensors"),
        })  # fmt: skip
    print(json.dumps({"repeat": args.repeat, "cpus": os.cpu_count(), "load_before": [round(x, 1) for x in load_before],
                      "load_after": [round(x, 1) for x in load_after], "rows": rows}, indent=2))  # fmt: skip
    print()
    print("| input | mode | floor | lint | ratio | lint, CT blocked | installed / blocked |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['input']} | {r['mode']} | {r['floor_s']:.3f} s | {r['lint_s']:.3f} s | {r['ratio']:.2f}x | "
              f"{r['lint_ct_blocked_s']:.3f} s | {r['ct_installed_vs_blocked']:.2f}x |")  # fmt: skip


if __name__ == "__main__":
    main()
