"""`weightcheck rollout` on a rollout-sized dump, against the frameworks' own way of reading it.

Writes (under --workdir) a `--dump-details` folder shaped as slime writes it: a rollout dump of --samples
samples of --tokens tokens (prompt + response, log-probs per response token) and its one-file train dump,
then measures, interleaved and repeated (medians):

(a) loading only: weightcheck's safe loader (globals listed without unpickling, then
    `torch.load(weights_only=True)`) vs the baseline the frameworks use, `torch.load(weights_only=False)`;
(b) the whole `check_rollout` (load + every WC8xx check) vs that baseline load alone.

    python benchmarks/bench_rollout.py [--samples 1024] [--tokens 4096] [--repeat 5] [--workdir DIR] [--json F]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path


def build(root: Path, samples: int, tokens: int) -> None:
    import torch

    gen = torch.Generator().manual_seed(0)
    response = tokens // 2
    rows, train = [], []
    for i in range(samples):
        toks = torch.randint(10, 150_000, (tokens,), generator=gen).tolist()
        lp = (-torch.rand(response, generator=gen)).tolist()
        rows.append(
            dict(
                index=i,
                group_index=i // 8,
                prompt="p" * 200,
                tokens=toks,
                response="r" * 800,
                response_length=response,
                loss_mask=[1] * response,
                rollout_log_probs=lp,
                reward=float(i % 2),
                status="completed",
                metadata={},
                spec_info={},
                prefix_cache_info={},
            )
        )
        t = torch.tensor(lp)
        train.append(
            dict(
                rollout_position=i,
                sample_index=i,
                tokens=torch.tensor(toks),
                response_lengths=response,
                total_lengths=tokens,
                loss_masks=torch.ones(response, dtype=torch.int),
                log_probs=t,
                ref_log_probs=t.clone(),
                rollout_log_probs=t.clone(),
                advantages=t.clone(),
            )
        )
    (root / "rollout_data").mkdir(parents=True)
    (root / "train_data").mkdir()
    torch.save({"rollout_id": 0, "samples": rows}, root / "rollout_data" / "0.pt")
    torch.save(
        {"format_version": 2, "rollout_id": 0, "rank": 0, "samples": train, "dp_shards": []},
        root / "train_data" / "0.pt",
    )


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=1024)
    parser.add_argument("--tokens", type=int, default=4096)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    import torch

    from weightcheck.rollouts import check_rollout
    from weightcheck.rollouts.loading import load_dump

    work = Path(tempfile.mkdtemp(dir=args.workdir))
    build(work, args.samples, args.tokens)
    files = [work / "rollout_data" / "0.pt", work / "train_data" / "0.pt"]
    size = sum(f.stat().st_size for f in files)
    base, safe, full = [], [], []
    for _ in range(args.repeat):
        base.append(timed(lambda: [torch.load(f, weights_only=False, map_location="cpu") for f in files]))
        safe.append(timed(lambda: [load_dump(f) for f in files]))
        result = None

        def run() -> None:
            nonlocal result
            result = check_rollout(work)

        full.append(timed(run))
        assert result is not None and not result.nothing_checked
    out = {
        "bytes": size,
        "samples": args.samples,
        "tokens": args.tokens,
        "baseline_torch_load_unsafe_s": statistics.median(base),
        "safe_load_s": statistics.median(safe),
        "check_rollout_s": statistics.median(full),
    }
    out["safe_load_vs_baseline"] = out["safe_load_s"] / out["baseline_torch_load_unsafe_s"]
    out["check_rollout_vs_baseline"] = out["check_rollout_s"] / out["baseline_torch_load_unsafe_s"]
    print(json.dumps(out, indent=2))
    if args.json:
        args.json.write_text(json.dumps(out, indent=2))
    import shutil

    shutil.rmtree(work)


if __name__ == "__main__":
    sys.exit(main())
