"""Data-reading throughput and memory: `lint --content` and `diff` on a generated multi-GB bf16 checkpoint.

Generates (under --workdir, removed at the end unless --keep) a Llama-shaped bf16 checkpoint of about
--size-gb GB (hidden 4096, intermediate 11008, embeddings and lm_head 32000 x 4096, ~1 GB shards) written
with safetensors' own writer, and a byte-identical copy for diff. With the page cache warm, it measures,
interleaved and repeated (medians):

(a) `lint --content` throughput vs `cat > /dev/null` of the same files (target >= 0.7x), and vs the naive
    peer — `safetensors.torch.load_file` per shard, then `torch.isnan(t).any()` and `(t == 0).all()` per
    tensor (target: weightcheck >= 1.5x faster);
(b) `diff A B` throughput vs reading both checkpoints with `cat` (target >= 0.5x), and vs the naive
    load-everything diff (`load_file` of every shard of both, `torch.equal` per tensor);
(c) peak RSS of each (one subprocess per measurement, `wait4` rusage) against 2 x the largest tensor
    + 300 MB.

Each contender runs in its own subprocess; it imports first and times only the work, so interpreter and
torch start-up are excluded (they are included in the RSS, which is what a user sees).

    python benchmarks/bench_content.py [--size-gb 4] [--repeat 3] [--workdir DIR] [--keep] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

HIDDEN, INTERMEDIATE, VOCAB = 4096, 11008, 32000
SHARD_BYTES = 1 << 30
MB = 1 << 20


# ---- generation ---------------------------------------------------------------------------------
def layer_shapes(layer: int) -> dict[str, tuple[int, ...]]:
    p = f"model.layers.{layer}"
    return {
        f"{p}.input_layernorm.weight": (HIDDEN,),
        f"{p}.self_attn.q_proj.weight": (HIDDEN, HIDDEN),
        f"{p}.self_attn.k_proj.weight": (HIDDEN // 4, HIDDEN),
        f"{p}.self_attn.v_proj.weight": (HIDDEN // 4, HIDDEN),
        f"{p}.self_attn.o_proj.weight": (HIDDEN, HIDDEN),
        f"{p}.post_attention_layernorm.weight": (HIDDEN,),
        f"{p}.mlp.gate_proj.weight": (INTERMEDIATE, HIDDEN),
        f"{p}.mlp.up_proj.weight": (INTERMEDIATE, HIDDEN),
        f"{p}.mlp.down_proj.weight": (HIDDEN, INTERMEDIATE),
    }


def plan(size_bytes: int) -> dict[str, tuple[int, ...]]:
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (VOCAB, HIDDEN)}
    fixed = 2 * VOCAB * HIDDEN * 2
    per_layer = sum(2 * _numel(s) for s in layer_shapes(0).values())
    for layer in range(max(1, (size_bytes - fixed) // per_layer)):
        shapes.update(layer_shapes(layer))
    shapes["model.norm.weight"] = (HIDDEN,)
    shapes["lm_head.weight"] = (VOCAB, HIDDEN)
    return shapes


def _numel(shape: tuple[int, ...]) -> int:
    total = 1
    for d in shape:
        total *= d
    return total


def generate(root: Path, size_gb: float) -> Path:
    """Write the checkpoint (safetensors' writer, ~1 GB shards, an index) unless it already exists."""
    import torch
    from safetensors.torch import save_file

    ckpt = root / "ckpt-a"
    if (ckpt / "model.safetensors.index.json").exists():
        return ckpt
    shutil.rmtree(ckpt, ignore_errors=True)
    ckpt.mkdir(parents=True)
    shapes = plan(int(size_gb * (1 << 30)))
    # One pool of N(0, 0.02) values; tensors are windows of it at different offsets (fast to build,
    # realistic values, no two tensors equal).
    pool = (torch.randn(64 * MB) * 0.02).to(torch.bfloat16)
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for i, (name, shape) in enumerate(shapes.items()):
        n = _numel(shape)
        if len(shape) == 1:
            tensor = torch.ones(shape, dtype=torch.bfloat16)
        else:
            start = (i * 7919 * 1024) % (pool.numel() - 1)
            reps = -(-(start + n) // pool.numel())
            tensor = pool.repeat(reps)[start : start + n].reshape(shape).clone()
        if size + 2 * n > SHARD_BYTES and shards[-1]:
            shards.append({})
            size = 0
        shards[-1][name] = tensor
        size += 2 * n
    weight_map = {}
    total = len(shards)
    for k, tensors in enumerate(shards, start=1):
        file = f"model-{k:05d}-of-{total:05d}.safetensors"
        save_file(tensors, str(ckpt / file), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(tensors, file))
    index = {"metadata": {"total_size": sum(2 * _numel(s) for s in shapes.values())}, "weight_map": weight_map}
    (ckpt / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": HIDDEN,
        "intermediate_size": INTERMEDIATE,
        "num_hidden_layers": sum(1 for n in shapes if n.endswith("q_proj.weight")),
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "vocab_size": VOCAB,
        "tie_word_embeddings": False,
        "dtype": "bfloat16",
    }
    (ckpt / "config.json").write_text(json.dumps(config, indent=2))
    return ckpt


def shard_files(ckpt: Path) -> list[str]:
    return [str(p) for p in sorted(ckpt.glob("*.safetensors"))]


def largest_tensor_bytes(ckpt: Path) -> int:
    from weightcheck.checkpoint import load_checkpoint

    return max(info.nbytes for info in load_checkpoint(ckpt).all_tensors().values())


# ---- workers (run in a subprocess: `--worker MODE PATH...`) ---------------------------------------
def _warm_up() -> None:
    """Start torch's thread pool and first-use paths outside the timed region (for every contender)."""
    import torch

    sample = torch.randn(1 << 20).to(torch.bfloat16)
    torch.aminmax(sample)
    torch.isnan(sample).any()
    torch.equal(sample.view(torch.int16), sample.view(torch.int16))


def worker(mode: str, paths: list[str]) -> dict[str, float]:
    import torch

    if mode == "generate":
        start = time.perf_counter()
        generate(Path(paths[0]), float(paths[1]))
        return {"seconds": time.perf_counter() - start}
    _warm_up()
    if mode == "weightcheck-content":
        from weightcheck.linting import lint

        lint(paths[0])  # header-only: loads the rule modules, reads no tensor data
        start = time.perf_counter()
        result = lint(paths[0], options={"content": True})
        seconds = time.perf_counter() - start
        assert not [f for f in result.findings if f.code.startswith("WC6")], result.findings
    elif mode == "naive-content":
        from safetensors.torch import load_file

        start = time.perf_counter()
        bad = 0
        for shard in shard_files(Path(paths[0])):
            tensors = load_file(shard)
            for tensor in tensors.values():
                bad += bool(torch.isnan(tensor).any()) + bool((tensor == 0).all())
            del tensors
        seconds = time.perf_counter() - start
    elif mode == "weightcheck-diff":
        import weightcheck.compare.classify  # noqa: F401  (imports outside the timed region)
        from weightcheck.diffing import diff

        start = time.perf_counter()
        result = diff(paths[0], paths[1])
        seconds = time.perf_counter() - start
        assert result.exit_code() == 0 and result.checked["failed"] == 0, result.findings
    elif mode == "naive-diff":
        from safetensors.torch import load_file

        start = time.perf_counter()
        a: dict[str, torch.Tensor] = {}
        b: dict[str, torch.Tensor] = {}
        for shard in shard_files(Path(paths[0])):
            a.update(load_file(shard))
        for shard in shard_files(Path(paths[1])):
            b.update(load_file(shard))
        differ = sum(not torch.equal(a[k], b[k]) for k in a)
        seconds = time.perf_counter() - start
        assert differ == 0
    else:
        raise SystemExit(f"unknown worker mode {mode}")
    return {"seconds": seconds}


def run_worker(mode: str, *args: str | Path) -> tuple[float, int]:
    """(seconds of work, peak RSS in bytes) of one worker subprocess."""
    proc = subprocess.Popen(
        [sys.executable, __file__, "--worker", mode, *map(str, args)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stderr is not None
    out, err = proc.stdout.read(), proc.stderr.read()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise RuntimeError(f"{mode} failed ({proc.returncode}):\n{err[-3000:]}")
    seconds = json.loads(out.strip().splitlines()[-1])["seconds"]
    return seconds, usage.ru_maxrss * 1024


def cat_seconds(files: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(["cat", *files], stdout=subprocess.DEVNULL, check=True)
    return time.perf_counter() - start


# ---- report ---------------------------------------------------------------------------------------
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--worker", nargs="+", help=argparse.SUPPRESS)
    ap.add_argument(
        "--workdir", type=Path, default=Path(os.environ.get("TMPDIR", "/tmp")) / "weightcheck-bench-content"
    )
    ap.add_argument("--size-gb", type=float, default=4.0)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--keep", action="store_true", help="keep the generated checkpoints (re-used by the next run)")
    ap.add_argument("--skip-naive-diff", action="store_true", help="skip the load-everything diff (2x size of RAM)")
    ap.add_argument("--json", type=Path, help="also write the figures here")
    args = ap.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker[0], args.worker[1:])))
        return

    wall = time.perf_counter()
    args.workdir.mkdir(parents=True, exist_ok=True)
    try:
        # Generation runs in a subprocess: this process stays small (a forked child inherits its peak RSS).
        gen_seconds, _ = run_worker("generate", args.workdir, str(args.size_gb))
        t0 = time.perf_counter()
        a = args.workdir / "ckpt-a"
        b = args.workdir / "ckpt-b"
        if not b.exists():
            shutil.copytree(a, b)  # a real copy: its own page-cache pages, like a second checkpoint
        gen_seconds += time.perf_counter() - t0
        files_a, files_b = shard_files(a), shard_files(b)
        size_a = sum(os.path.getsize(f) for f in files_a)
        largest = largest_tensor_bytes(a)
        for _ in range(2):  # warm the page cache for both checkpoints
            cat_seconds(files_a + files_b)

        rows: dict[str, list[float]] = {k: [] for k in ("cat_a", "content", "naive_content", "cat_ab", "diff")}
        rss: dict[str, int] = {}
        for _ in range(args.repeat):
            rows["cat_a"].append(cat_seconds(files_a))
            seconds, peak = run_worker("weightcheck-content", a)
            rows["content"].append(seconds)
            rss["content"] = max(rss.get("content", 0), peak)
            seconds, peak = run_worker("naive-content", a)
            rows["naive_content"].append(seconds)
            rss["naive_content"] = max(rss.get("naive_content", 0), peak)
            rows["cat_ab"].append(cat_seconds(files_a + files_b))
            seconds, peak = run_worker("weightcheck-diff", a, b)
            rows["diff"].append(seconds)
            rss["diff"] = max(rss.get("diff", 0), peak)
        naive_diff = None
        if not args.skip_naive_diff:
            naive_diff, rss["naive_diff"] = run_worker("naive-diff", a, b)

        med = {k: statistics.median(v) for k, v in rows.items()}
        gbps = {
            k: (size_a if k in ("cat_a", "content", "naive_content") else 2 * size_a) / v / 1e9 for k, v in med.items()
        }
        bound = 2 * largest + 300 * MB
        figures = {
            "checkpoint_bytes": size_a,
            "shards": len(files_a),
            "largest_tensor_bytes": largest,
            "generate_seconds": round(gen_seconds, 1),
            "median_seconds": {k: round(v, 3) for k, v in med.items()},
            "throughput_gb_s": {k: round(v, 2) for k, v in gbps.items()},
            "content_vs_cat": round(med["cat_a"] / med["content"], 2),
            "content_speedup_vs_naive": round(med["naive_content"] / med["content"], 2),
            "diff_vs_cat_both": round(med["cat_ab"] / med["diff"], 2),
            "peak_rss_mb": {k: round(v / MB) for k, v in rss.items()},
            "rss_bound_mb": round(bound / MB),
            "repeat": args.repeat,
        }
        if naive_diff is not None:
            figures["naive_diff_seconds"] = round(naive_diff, 3)
            figures["diff_speedup_vs_naive"] = round(naive_diff / med["diff"], 2)
        figures["wall_seconds"] = round(time.perf_counter() - wall, 1)
        figures["load_average_1min"] = round(os.getloadavg()[0], 2)
        report(figures)
        if args.json:
            args.json.write_text(json.dumps(figures, indent=2))
    finally:
        if not args.keep:
            shutil.rmtree(args.workdir / "ckpt-a", ignore_errors=True)
            shutil.rmtree(args.workdir / "ckpt-b", ignore_errors=True)


def report(f: dict) -> None:
    gb = f["checkpoint_bytes"] / 1e9
    tp, rss, bound = f["throughput_gb_s"], f["peak_rss_mb"], f["rss_bound_mb"]

    def verdict(ok: bool) -> str:
        return "meets target" if ok else "BELOW TARGET"

    print(
        f"checkpoint: {gb:.2f} GB bf16 in {f['shards']} shards; largest tensor {f['largest_tensor_bytes'] / MB:.0f} MB"
    )
    print(f"medians of {f['repeat']}, page cache warm (GB/s of checkpoint bytes; diff counts both checkpoints)\n")
    print("| measurement | GB/s | peak RSS (MB) |")
    print("|---|---|---|")
    print(f"| cat A > /dev/null | {tp['cat_a']} | |")
    print(f"| weightcheck lint --content | {tp['content']} | {rss['content']} |")
    print(f"| naive: load_file per shard + isnan/zero checks | {tp['naive_content']} | {rss['naive_content']} |")
    print(f"| cat A B > /dev/null | {tp['cat_ab']} | |")
    print(f"| weightcheck diff A B | {tp['diff']} | {rss['diff']} |")
    if "naive_diff_seconds" in f:
        naive_gbps = 2 * gb / f["naive_diff_seconds"]
        print(f"| naive diff: load everything + torch.equal | {naive_gbps:.2f} | {rss['naive_diff']} |")
    print()
    print(f"(a) lint --content / cat: {f['content_vs_cat']}x (target >= 0.7x: {verdict(f['content_vs_cat'] >= 0.7)})")
    print(
        f"    lint --content vs naive peer: {f['content_speedup_vs_naive']}x faster "
        f"(target >= 1.5x: {verdict(f['content_speedup_vs_naive'] >= 1.5)})"
    )
    print(f"(b) diff / cat both: {f['diff_vs_cat_both']}x (target >= 0.5x: {verdict(f['diff_vs_cat_both'] >= 0.5)})")
    if "diff_speedup_vs_naive" in f:
        print(f"    diff vs naive load-everything diff: {f['diff_speedup_vs_naive']}x faster")
    print(
        f"(c) peak RSS bound 2 x largest + 300 MB = {bound} MB: lint --content {rss['content']} MB "
        f"({verdict(rss['content'] <= bound)}), diff {rss['diff']} MB ({verdict(rss['diff'] <= bound)})"
    )
    print(
        f"\nwall time {f['wall_seconds']} s (generation {f['generate_seconds']} s); load average "
        f"{f['load_average_1min']} on {os.cpu_count()} cores (other load slows the 2-thread reductions, not cat)"
    )


if __name__ == "__main__":
    main()
