"""Rollout and train debug dumps shaped as slime, miles and Relax build them, with honest numbers.

Numbers come from a tiny real transformers model (Qwen2, 4 layers, fixed seed) briefly fine-tuned on a toy
chat template, so that it is an "instruct" model for that template: on well-formed prompts its responses
have a low per-token negative log-prob, on re-templated prompts it does not. Rollouts are sampled from it at
temperature 1 the way an engine does (`rollout_log_probs` from the incremental forward), and the trainer's
`log_probs` / `ref_log_probs` come from a full-sequence forward, as Megatron computes them.

Dump structures follow the frameworks' writers at these commits (read through their public source):
- slime THUDM/slime@624b824a: `slime/observability/rollout_data_utils.py:save_debug_rollout_data`
  (`{"rollout_id", "samples": [Sample.to_dict()]}`, `status` as its string value, `spec_info` /
  `prefix_cache_info` as dicts) and `slime/observability/train_data_utils.py:_build_dump_payload`
  (`format_version` 2, one file per rollout, per-sample dicts with `rollout_position`, CP fields restored).
- miles radixark/miles@31f1ca96: `miles/ray/rollout/debug_data.py:save_debug_rollout_data` (adds
  `metadata`), `miles/utils/train_dump_utils.py:save_debug_train_data_for_rank` (one file per rank:
  `dict(rollout_id, rank, rollout_data, cp_rank, cp_size, qkv_format)`), per-token fields sliced by
  `miles/backends/training_utils/cp_utils.py:slice_log_prob_with_cp` (zigzag, two chunks per CP rank),
  `partition` decoded as a numpy int64 array (`train_data_conversion.py` ValueSpec "ndarray").
- Relax redai-infra/Relax@2765d18a: `relax/utils/training/train_dump_utils.py` (rollout samples gain
  `decoded_tokens`; train dumps per rank hold `samples=[{"sample_index": local i, <field>: .tolist()}]`).
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

# Toy chat template: special tokens and their text (Qwen-style markers, so prompts read like real ones).
SYS, USER, ASSIST, END, EOS, SYSTEM_PROMPT = 2, 3, 4, 5, 6, 7
FIRST_WORD, VOCAB = 10, 18
_TEXT = {
    SYSTEM_PROMPT: "You are a helpful assistant.",
    SYS: "<|im_start|>system\n",
    USER: "<|im_start|>user\n",
    ASSIST: "<|im_start|>assistant\n",
    END: "<|im_end|>\n",
    EOS: "<|endoftext|>",
}
MAX_NEW = 8


def text(tokens: list[int]) -> str:
    return "".join(_TEXT.get(t, f"w{t} ") for t in tokens)


def prompt_tokens(system: int, words: list[int], retemplated: bool = False) -> list[int]:
    user = [USER, *words, END]
    if retemplated:  # a prompt that was already templated, templated again by the framework
        user = [USER, SYS, system, END, USER, *words, END, END]
    return [SYS, system, END, *user, ASSIST]


def answer(words: list[int]) -> list[int]:
    span = VOCAB - FIRST_WORD
    return [FIRST_WORD + (w - FIRST_WORD + 1) % span for w in words] + [EOS]


def build_model(seed: int = 0, train_steps: int = 400) -> Any:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,  # a trainer with PP=2 holds one per stage (the doctor fixture)
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        tie_word_embeddings=False,
    )
    model = Qwen2ForCausalLM(config)
    if train_steps:
        # SFT on the toy template: the answer follows the user's word. Half of each batch is the same data with
        # template tokens inserted at random places and a random answer, so that, like a real instruct model,
        # it is confident under its template only.
        gen = torch.Generator().manual_seed(seed)
        opt = torch.optim.Adam(model.parameters(), lr=3e-3)
        threads = torch.get_num_threads()
        torch.set_num_threads(1)  # a model this small only loses time to threads on a shared machine
        model.train()
        for _ in range(train_steps):
            batch, masks = [], []
            for j in range(32):
                system = SYSTEM_PROMPT
                words = torch.randint(FIRST_WORD, VOCAB, (1,), generator=gen).tolist()
                p, r = prompt_tokens(system, words), answer(words)
                if j % 2:
                    for _ in range(int(torch.randint(1, 4, (1,), generator=gen))):
                        at = int(torch.randint(1, len(p) - 1, (1,), generator=gen))
                        p.insert(at, int(torch.randint(SYS, EOS, (1,), generator=gen)))
                    r = torch.randint(FIRST_WORD, VOCAB, (len(r),), generator=gen).tolist()
                batch.append(p + r)
                masks.append([0] * len(p) + [1] * len(r))
            width = max(len(b) for b in batch)
            ids = torch.tensor([b + [0] * (width - len(b)) for b in batch])
            labels = torch.tensor(
                [
                    [t if m else -100 for t, m in zip(b, mk, strict=True)] + [-100] * (width - len(b))
                    for b, mk in zip(batch, masks, strict=True)
                ]
            )
            loss = model(input_ids=ids, labels=labels).loss
            opt.zero_grad()
            loss.backward()
            opt.step()
        torch.set_num_threads(threads)
    model.eval()
    return model


@torch.no_grad()
def full_log_probs(model: Any, tokens: list[int], response_length: int) -> list[float]:
    """The trainer's view: one forward over prompt+response, log p of each response token."""
    ids = torch.tensor([tokens])
    logp = torch.log_softmax(model(input_ids=ids).logits.float(), dim=-1)[0]
    start = len(tokens) - response_length
    return [float(logp[i - 1, tokens[i]]) for i in range(start, len(tokens))]


@torch.no_grad()
def sample(model: Any, prompt: list[int], gen: torch.Generator) -> tuple[list[int], list[float], str]:
    """The engine's view: token by token at temperature 1; stops at EOS or MAX_NEW tokens."""
    tokens = list(prompt)
    logps: list[float] = []
    for _ in range(MAX_NEW):
        logits = model(input_ids=torch.tensor([tokens])).logits[0, -1].float()
        probs = torch.softmax(logits, dim=-1)
        tok = int(torch.multinomial(probs, 1, generator=gen))
        logps.append(float(torch.log(probs[tok])))
        tokens.append(tok)
        if tok == EOS:
            return tokens[len(prompt) :], logps, "completed"
    return tokens[len(prompt) :], logps, "truncated"


@dataclass
class Rollout:
    """One rollout: slime-shaped Sample dicts plus the trainer's per-sample columns."""

    samples: list[dict[str, Any]]
    log_probs: list[list[float]]
    ref_log_probs: list[list[float]]


def make_rollout(model: Any, *, retemplated: bool = False, seed: int = 1, n: int = 8, group: int = 2) -> Rollout:
    gen = torch.Generator().manual_seed(seed)
    samples = []
    for i in range(n):
        if i % group == 0:
            system = SYSTEM_PROMPT
            words = torch.randint(FIRST_WORD, VOCAB, (1,), generator=gen).tolist()
        prompt = prompt_tokens(system, words, retemplated)
        response, logps, status = sample(model, prompt, gen)
        correct = response == answer(words)
        samples.append(
            # Sample.to_dict() of slime@624b824a: every dataclass field, status as its value
            dict(
                group_index=i // group,
                index=i,
                rollout_id=None,
                prompt=text(prompt),
                tokens=prompt + response,
                multimodal_inputs=None,
                multimodal_train_inputs=None,
                multimodal_train_input_id=None,
                apply_chat_template_kwargs={},
                response=text(response),
                response_length=len(response),
                label=text(answer(words)),
                reward=1.0 if correct else 0.0,
                loss_mask=[1] * len(response),
                weight_versions=["1"],
                rollout_log_probs=logps,
                rollout_top_p_token_ids=None,
                rollout_top_p_token_offsets=None,
                rollout_routed_experts=None,
                remove_sample=False,
                teacher_log_probs=None,
                status=status,
                metadata={},
                generate_function_path=None,
                custom_rm_path=None,
                train_metadata=None,
                session_id=None,
                non_generation_time=0.0,
                spec_info={
                    "spec_accept_token_num": 0,
                    "spec_draft_token_num": 0,
                    "spec_verify_ct": 0,
                    "completion_token_num": 0,
                },
                prefix_cache_info={"cached_tokens": 0, "total_prompt_tokens": len(prompt)},
            )
        )
    log_probs = [full_log_probs(model, s["tokens"], s["response_length"]) for s in samples]
    return Rollout(samples, log_probs, [list(x) for x in log_probs])


def varied(rollout: Rollout) -> bool:
    """Some prompt group's rewards differ (so group-normalised advantages are not all zero)."""
    groups: dict[int, set[float]] = {}
    for s in rollout.samples:
        groups.setdefault(s["group_index"], set()).add(s["reward"])
    return any(len(v) > 1 for v in groups.values())


def with_reference(rollout: Rollout, ref_model: Any) -> Rollout:
    ref = [full_log_probs(ref_model, s["tokens"], s["response_length"]) for s in rollout.samples]
    return Rollout(rollout.samples, rollout.log_probs, ref)


def with_jittered_reference(rollout: Rollout, model: Any) -> Rollout:
    """The same weights, the reference's forward run in bf16 autocast: other kernels and rounding, as a
    reference computed by a different attention backend would be."""
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ref = [full_log_probs(model, s["tokens"], s["response_length"]) for s in rollout.samples]
    return Rollout(rollout.samples, rollout.log_probs, ref)


def perturbed(model: Any, layer: int = 2, scale: float = 0.5, seed: int = 7) -> Any:
    """A reference model that differs from the actor in one layer (its MLP down-projection)."""
    other = copy.deepcopy(model)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        w = other.model.layers[layer].mlp.down_proj.weight
        w.add_(torch.randn(w.shape, generator=gen) * scale * w.abs().mean())
    return other


def tp_shards_swapped(model: Any) -> Any:
    """A reference whose output head was assembled from its two TP shards in the wrong order (a
    configuration error: the vocabulary rows of the two halves are exchanged)."""
    other = copy.deepcopy(model)
    with torch.no_grad():
        w = other.lm_head.weight
        half = w.shape[0] // 2
        w.copy_(torch.cat([w[half:], w[:half]]))
    return other


def pp_shifted(model: Any) -> Any:
    """An engine after a sync whose second pipeline stage forgot its layer offset: layer 1's weights landed
    on layer 0, and layer 1 kept what it had."""
    other = copy.deepcopy(model)
    other.model.layers[0].load_state_dict(model.model.layers[1].state_dict())
    return other


def served_by(rollout_model: Any, train_model: Any, *, seed: int = 1, n: int = 8) -> Rollout:
    """Rollout sampled by an engine holding `rollout_model`, log-probs recomputed by a trainer holding
    `train_model` (the reference is the trainer's own weights)."""
    rollout = make_rollout(rollout_model, seed=seed, n=n)
    log_probs = [full_log_probs(train_model, s["tokens"], s["response_length"]) for s in rollout.samples]
    return Rollout(rollout.samples, log_probs, [list(x) for x in log_probs])


def _advantages(samples: list[dict[str, Any]]) -> list[torch.Tensor]:
    """GRPO-style: reward minus its group's mean, broadcast over the response."""
    groups: dict[int, list[float]] = {}
    for s in samples:
        groups.setdefault(s["group_index"], []).append(s["reward"])
    return [
        torch.full((s["response_length"],), s["reward"] - sum(groups[s["group_index"]]) / len(groups[s["group_index"]]))
        for s in samples
    ]


# ---------------------------------------------------------------- writers
def write_slime(rollout: Rollout, root: Path, rollout_id: int = 0) -> Path:
    """`--dump-details root`: root/rollout_data/{id}.pt and root/train_data/{id}.pt (one file, slime)."""
    (root / "rollout_data").mkdir(parents=True, exist_ok=True)
    (root / "train_data").mkdir(parents=True, exist_ok=True)
    torch.save({"rollout_id": rollout_id, "samples": rollout.samples}, root / "rollout_data" / f"{rollout_id}.pt")
    adv = _advantages(rollout.samples)
    per_sample = []
    for pos, s in enumerate(rollout.samples):
        per_sample.append(
            {
                "data_parallel_rank": 0,
                "sample_index": s["index"],
                "rollout_position": pos,
                "tokens": torch.tensor(s["tokens"], dtype=torch.long),
                "response_lengths": s["response_length"],
                "total_lengths": len(s["tokens"]),
                "loss_masks": torch.tensor(s["loss_mask"], dtype=torch.int),
                "rewards": s["reward"],
                "truncated": int(s["status"] == "truncated"),
                "rollout_log_probs": torch.tensor(s["rollout_log_probs"], dtype=torch.float32),
                "log_probs": torch.tensor(rollout.log_probs[pos], dtype=torch.float32),
                "ref_log_probs": torch.tensor(rollout.ref_log_probs[pos], dtype=torch.float32),
                "advantages": adv[pos],
                "returns": adv[pos].clone(),
            }
        )
    payload = {
        "format_version": 2,
        "rollout_id": rollout_id,
        "rank": 0,
        "samples": per_sample,
        "dp_shards": [
            {
                "rank": 0,
                "data_parallel_rank": 0,
                "sample_indices": [s["index"] for s in rollout.samples],
                "partition": list(range(len(rollout.samples))),
                "num_microbatches": [1],
            }
        ],
        "raw_reward": [s["reward"] for s in rollout.samples],
    }
    torch.save(payload, root / "train_data" / f"{rollout_id}.pt")
    return root


def cp_slice(values: list[float], total: int, response: int, cp_rank: int, cp_size: int) -> list[float]:
    """miles `slice_log_prob_with_cp` (thd): this CP rank's two zigzag chunks of a response's values."""
    if cp_size == 1:
        return values
    chunk = (total + 2 * cp_size - 1) // (2 * cp_size)
    prompt = total - response
    out: list[float] = []
    for lo, hi in (
        (cp_rank * chunk, (cp_rank + 1) * chunk),
        ((2 * cp_size - cp_rank - 1) * chunk, (2 * cp_size - cp_rank) * chunk),
    ):
        a, b = max(lo, prompt - 1), min(hi, total - 1)
        if a < b:
            out += values[a - (prompt - 1) : b - (prompt - 1)]
    return out


def write_miles(rollout: Rollout, root: Path, rollout_id: int = 0, tp: int = 2, cp: int = 2) -> Path:
    """`--dump-details root` of miles: one train file per rank (TP replicas repeat, CP slices)."""
    (root / "rollout_data").mkdir(parents=True, exist_ok=True)
    (root / "train_data").mkdir(parents=True, exist_ok=True)
    torch.save(
        dict(rollout_id=rollout_id, metadata={}, samples=rollout.samples), root / "rollout_data" / f"{rollout_id}.pt"
    )
    adv = _advantages(rollout.samples)
    for rank in range(tp * cp):
        cp_rank = rank // tp  # Megatron's rank order puts TP fastest, then CP
        data: dict[str, Any] = {
            "tokens": [torch.tensor(s["tokens"], dtype=torch.long) for s in rollout.samples],
            "response_lengths": [s["response_length"] for s in rollout.samples],
            "total_lengths": [len(s["tokens"]) for s in rollout.samples],
            "loss_masks": [torch.tensor(s["loss_mask"], dtype=torch.int) for s in rollout.samples],
            "rewards": [s["reward"] for s in rollout.samples],
            "raw_reward": [s["reward"] for s in rollout.samples],
            "truncated": [int(s["status"] == "truncated") for s in rollout.samples],
            "sample_indices": [s["index"] for s in rollout.samples],
            "rollout_ids": [s["index"] for s in rollout.samples],
            "partition": np.arange(len(rollout.samples), dtype=np.int64),
        }

        def sliced(columns: list[list[float]], cp_rank: int = cp_rank) -> list[torch.Tensor]:
            return [
                torch.tensor(cp_slice(v, len(s["tokens"]), s["response_length"], cp_rank, cp), dtype=torch.float32)
                for v, s in zip(columns, rollout.samples, strict=True)
            ]

        data["rollout_log_probs"] = sliced([s["rollout_log_probs"] for s in rollout.samples])
        data["log_probs"] = sliced(rollout.log_probs)
        data["ref_log_probs"] = sliced(rollout.ref_log_probs)
        data["advantages"] = sliced([a.tolist() for a in adv])
        torch.save(
            dict(rollout_id=rollout_id, rank=rank, rollout_data=data, cp_rank=cp_rank, cp_size=cp, qkv_format="thd"),
            root / "train_data" / f"{rollout_id}_{rank}.pt",
        )
    return root


def write_relax(rollout: Rollout, root: Path, rollout_id: int = 0, dp: int = 2) -> Path:
    """`--dump-details root` of Relax: rollout samples with decoded_tokens; train dumps per DP rank."""
    (root / "rollout_data").mkdir(parents=True, exist_ok=True)
    (root / "train_data").mkdir(parents=True, exist_ok=True)
    samples = [{**s, "decoded_tokens": [text([t]) for t in s["tokens"]]} for s in rollout.samples]
    torch.save(dict(rollout_id=rollout_id, samples=samples), root / "rollout_data" / f"{rollout_id}.pt")
    adv = _advantages(rollout.samples)
    n = len(rollout.samples)
    for rank in range(dp):
        mine = list(range(rank * n // dp, (rank + 1) * n // dp))
        train = []
        for local, pos in enumerate(mine):
            s = rollout.samples[pos]
            train.append(
                {
                    "sample_index": local,
                    "tokens": s["tokens"],
                    "response_lengths": s["response_length"],
                    "total_lengths": len(s["tokens"]),
                    "rewards": s["reward"],
                    "loss_masks": s["loss_mask"],
                    "rollout_log_probs": s["rollout_log_probs"],
                    "log_probs": rollout.log_probs[pos],
                    "ref_log_probs": rollout.ref_log_probs[pos],
                    "advantages": adv[pos].tolist(),
                    "decoded_tokens": [text([t]) for t in s["tokens"]],
                }
            )
        torch.save(
            dict(rollout_id=rollout_id, rank=rank, samples=train), root / "train_data" / f"{rollout_id}_{rank}.pt"
        )
    return root


def framework_step0(rollout: Rollout) -> dict[str, float]:
    """What slime's / miles' step-0 CI assertions compute: batch means of per-sample means."""

    def mean_of_means(cols: list[list[float]]) -> float:
        return sum(sum(c) / len(c) for c in cols) / len(cols)

    lp = mean_of_means(rollout.log_probs)
    return {
        "ref_diff": abs(lp - mean_of_means(rollout.ref_log_probs)),
        "train_rollout_abs_diff": sum(
            sum(abs(a - b) for a, b in zip(x, s["rollout_log_probs"], strict=True)) / len(x)
            for x, s in zip(rollout.log_probs, rollout.samples, strict=True)
        )
        / len(rollout.samples),
        "mean_log_probs": lp,
        "kl": sum(
            sum(math.expm1(r - a) - (r - a) for a, r in zip(x, y, strict=True)) / len(x)
            for x, y in zip(rollout.log_probs, rollout.ref_log_probs, strict=True)
        )
        / len(rollout.samples),
    }
