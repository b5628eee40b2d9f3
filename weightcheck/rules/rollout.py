"""WC800–WC849: the step-1 checks on rollout and train debug dumps (`weightcheck rollout`);
WC850–WC869: the run-level checklist lines only `weightcheck doctor` can answer (trainer and engine logs,
the Megatron load directory).

Fired by `weightcheck.rollouts.checks` and `weightcheck.checkup`, not by lint. Default thresholds are the
frameworks' own (see each doc); every one is an option of `weightcheck rollout` and a key of the config
file's `[tool.weightcheck.rollout]` table.
"""

from __future__ import annotations

from weightcheck.findings import Severity
from weightcheck.rules import metadata_rule

_ALSO = {
    "WC801": frozenset({Severity.WARNING}),
    "WC802": frozenset({Severity.WARNING}),
    "WC805": frozenset({Severity.ERROR}),
    "WC812": frozenset({Severity.WARNING}),
}


def _rule(code: str, name: str, severity: Severity, *texts: str, command: str = "rollout") -> None:
    """`metadata_rule` with texts summary, doc, bad, good, fix in that order, and this module's `_ALSO`."""
    metadata_rule(code, name, severity, *texts, command=command, also=_ALSO.get(code, frozenset()))


_rule(
    "WC800",
    "dump-unreadable",
    Severity.ERROR,
    "A debug dump cannot be read: it needs unpickling of arbitrary classes, is too large, damaged, or not a dump.",
    """
    weightcheck loads dumps only with `torch.load(weights_only=True)` plus numpy arrays, dtypes and scalars.
    The frameworks themselves load their dumps with `weights_only=False`, so a dump may hold any object a
    custom rollout function put in `metadata` (miles multi-LoRA `AdapterRef`, PIL images, Enum statuses).
    Such a file is refused with the classes it would import named
    (`torch.serialization.get_unsafe_globals_in_checkpoint`); it is never unpickled.
    """,
    "train_data/0_0.pt  # needs unpickling of miles.utils.types.AdapterRef",
    "rollout_data/0.pt  # dicts, lists, tensors, numpy arrays",
    "Keep custom objects out of Sample fields (convert to dicts or strings before the dump), or inspect the file "
    "in a sandbox you trust.",
)
_rule(
    "WC801",
    "step1-logprobs-not-exact",
    Severity.ERROR,
    "At step 1 log_probs and ref_log_probs differ, within the kernel-jitter band (KL < 1e-4).",
    """
    At the first rollout the actor and the reference are the same weights, so the guides of slime, miles
    and Relax expect log_probs == ref_log_probs exactly (KL 0). A difference with KL < 1e-4 (miles debugging
    guide: "acceptable — kernel-level numerical jitter") points at non-deterministic kernels: Transformer
    Engine's fused attention under context parallelism (`--attention-backend flash`).

    Error when the frameworks' own step-0 CI assertion would fail: slime asserts
    |mean(log_probs) − mean(ref_log_probs)| < 1e-8 (`slime/observability/train_metric_utils.py`, skipped under
    routing replay), miles the same with abs_tol 1e-8, 5e-3 under `--use-rollout-routing-replay`
    (`miles/backends/training_utils/log_utils.py`). Warning when only single tokens differ and the batch means
    still agree. KL is the k3 estimator exp(r) − r − 1, r = ref − log_probs (slime `--kl-loss-type k3`),
    averaged over loss-masked tokens. Thresholds: `--ref-tol`, `--jitter-kl`, `--routing-replay`.
    """,
    "rollout 0: KL 3.1e-07, |mean diff| 2.4e-05 >= 1e-08; sample 4 token 17 differs by 1.2e-03",
    "rollout 0: log_probs == ref_log_probs on every loss-masked token",
    "Force deterministic kernels (`--attention-backend flash` with context parallelism, deterministic mode), or "
    "raise --ref-tol if this jitter is accepted.",
)
_rule(
    "WC802",
    "step1-kl-elevated",
    Severity.ERROR,
    "At step 1 log_probs and ref_log_probs differ beyond jitter (1e-4 <= KL <= 1): actor and reference are not "
    "the same model.",
    """
    Above the jitter band the actor and the reference compute different functions at step 1: `--load` and
    `--ref-load` point at different checkpoints, one of them was converted differently, a layer was not
    loaded, or (MoE) routing differs (miles: R3 legitimately breaks exact equality; `--routing-replay`).
    The finding names the samples with the largest KL and the token positions with the largest difference.
    With `--routing-replay` it is a warning while miles' relaxed assertion (5e-3) still holds.
    """,
    "rollout 0: KL 2.3e-02 (1e-4 < KL <= 1); sample 1 tokens 3, 9, 12",
    "rollout 0: KL 0",
    "Point --ref-load and --load at the same step-0 weights (weightcheck diff REF ACTOR shows where they "
    "differ), and check that both were loaded (weightcheck doctor).",
)
_rule(
    "WC803",
    "step1-kl-large",
    Severity.ERROR,
    "At step 1 the KL between log_probs and ref_log_probs is above 1: a configuration error.",
    """
    The guides of slime, miles and Relax: "If the value is extremely large, there is likely a problem with the
    training configuration" (miles: "Large values (KL > 1). Configuration error. Re-check parallelism and
    precision"). Threshold `--large-kl` (default 1).
    """,
    "rollout 0: KL 4.7 > 1",
    "rollout 0: KL 0",
    "Re-check parallelism (TP/PP/CP/EP sizes of actor and reference) and precision settings; verify the weight "
    "sync (weightcheck verify).",
)
_rule(
    "WC804",
    "train-rollout-logprob-diff",
    Severity.ERROR,
    "The trainer's log_probs and the engine's rollout_log_probs disagree beyond the framework's bound.",
    """
    The engine sampled with the weights it holds; the trainer recomputes the same tokens with its own. A large
    difference means the two hold different weights (a wrong or partial weight sync, a PP/EP offset) or
    different precision. slime asserts `train_rollout_logprob_abs_diff` (per-sample mean of
    |log_probs − rollout_log_probs|, averaged over samples) <= 0.1 at step 0
    (`--ci-train-rollout-logprob-abs-diff-threshold`, `slime/backends/megatron_utils/model.py`); miles asserts
    |mean log_probs − mean rollout_log_probs| <= 0.03 (`miles/backends/training_utils/log_utils.py`). Both are
    checked, per rollout; the finding names the samples and token positions that differ most.
    Thresholds `--train-rollout-diff` and `--train-rollout-mean-tol`.
    """,
    "rollout 0: mean |log_probs − rollout_log_probs| 0.41 > 0.1; sample 7 token 12 differs by 3.2",
    "rollout 0: mean |log_probs − rollout_log_probs| 0.004",
    "Verify the weight sync of this step (weightcheck verify RECORDS --against CKPT): a layer or expert that "
    "landed under the wrong name shows up here first; fix the names it reports and sync again.",
)
_rule(
    "WC805",
    "logprob-elevated",
    Severity.WARNING,
    "Mean negative log-prob per response token is elevated (>= 0.8): the chat-template-mismatch signature.",
    """
    slime's guide: "if the log probability of an instruct model reaches 0.8, it might be because the data does
    not conform to the trained chat template or does not match the cold-start distribution"; miles: "Slightly
    elevated logp on instruct (~0.8 per token). Almost always a chat-template mismatch". Warning from
    `--elevated-nll` (default 0.8); error at 1, where slime's CI sanity bound (−1 < mean log_probs < 0,
    `train_metric_utils.py`) fails. Computed over loss-masked response tokens from the trainer's log_probs
    (train dump) or else the engine's rollout_log_probs. On a pretrained (base) model high values are normal:
    raise the threshold there.
    """,
    "rollout 0: mean −log p 1.32 per token over 412 tokens (>= 0.8)",
    "rollout 0: mean −log p 0.21 per token",
    "Compare the prompts with the model's chat template (tokenizer.apply_chat_template); do not template data "
    "that is already templated.",
)
_rule(
    "WC806",
    "prompt-double-templated",
    Severity.WARNING,
    "A prompt carries the chat template's opening markers twice: data templated before the framework templated it.",
    """
    miles FAQ: "most exploding gradient reports come from feeding already-templated data into a model that
    re-applies its template". Detected when a prompt holds two beginning-of-text markers
    (`<|begin_of_text|>`, `<s>`, `<bos>`, `[gMASK]`), two system headers (`<|im_start|>system`,
    `<|start_header_id|>system`), or a role header whose content opens with another role header.
    """,
    "<|im_start|>system\\n...<|im_start|>user\\n<|im_start|>system\\n...",
    "<|im_start|>system\\n...<|im_start|>user\\nWhat is 2+2?<|im_end|>\\n<|im_start|>assistant\\n",
    "Pass raw messages and let the framework apply the template once (--apply-chat-template), or pass templated "
    "text without it.",
)
_rule(
    "WC807",
    "response-empty",
    Severity.WARNING,
    "Responses with no tokens.",
    """
    An empty response carries no training signal and usually means the engine stopped at once (a stop token in
    the prompt's end, an abort) or the sample failed.
    """,
    "sample 3: response_length 0, status failed",
    "every response has tokens",
    "Look at the engine log for aborts; check --rollout-stop / stop token ids.",
)
_rule(
    "WC808",
    "response-never-ends",
    Severity.WARNING,
    "Most responses are cut at the maximum length (status truncated): the model never emits its stop token.",
    """
    miles FAQ: "Stop tokens are misconfigured. The model is babbling without ever emitting EOS. Set them
    explicitly with --rollout-stop or --rollout-stop-token-ids." Also the template-mismatch signature of a
    pretrained model. Fires when at least `--truncated-fraction` (default 0.5) of a rollout's samples are
    truncated.
    """,
    "rollout 0: 14 of 16 samples truncated at max length",
    "rollout 0: 1 of 16 samples truncated",
    "Set --rollout-stop / --rollout-stop-token-ids; check the chat template; try the instruct model.",
)
_rule(
    "WC809",
    "response-repetition",
    Severity.WARNING,
    "Responses that end in a loop of the same n-gram.",
    """
    A response whose last tokens repeat one n-gram (period 1–16 tokens) over at least `--repeat-min-tokens`
    (default 32) tokens and at least 4 times is degenerate: garbled weights, a wrong template, or sampling
    settings.
    """,
    "sample 5: tokens 88..255 repeat a 3-token n-gram 56 times",
    "responses without a trailing loop",
    "If it happens from the first step, check the weights (weightcheck lint / verify) and the chat template.",
)
_rule(
    "WC810",
    "reward-nan",
    Severity.ERROR,
    "Rewards that are NaN or infinite.",
    """
    A NaN reward turns every advantage of its group into NaN and the loss with it (the playbook's NaN/Inf
    section). Dict rewards are read with `--reward-key`.
    """,
    "sample 2: reward nan",
    "every reward finite",
    "Fix the reward function; confirm --reward-key / --label-key.",
)
_rule(
    "WC811",
    "reward-constant",
    Severity.WARNING,
    "Every reward of a rollout is equal, or every prompt group's rewards are constant: advantages are all zero.",
    """
    With group-normalised advantages (GRPO) a constant group contributes nothing; when all groups are constant
    the step trains on nothing. miles' guide: "Reward signal is broken. Confirm rewards are computed from the
    right key (often a --label-key typo)."
    """,
    "rollout 0: all 64 rewards are 0.0",
    "rollout 0: rewards vary within groups",
    "Confirm --label-key / --reward-key and the reward function on a few samples by hand.",
)
_rule(
    "WC812",
    "loss-mask-invalid",
    Severity.ERROR,
    "A loss mask or per-token field does not fit its response (wrong length, values other than 0/1, all masked).",
    """
    slime and miles require `len(loss_mask) == response_length` (`convert_samples_to_train_data` asserts it) and
    per-token log-probs of the response's length. Error for a length or value mismatch; warning when every
    sample of a rollout is fully masked (nothing is trained).
    """,
    "sample 0: loss_mask has 31 entries, response_length 32",
    "sample 0: loss_mask has 32 entries of 0/1",
    "Build loss_mask in the custom generate function with one entry per response token.",
)
_rule(
    "WC813",
    "train-dump-ranks-inconsistent",
    Severity.ERROR,
    "Per-rank train dumps disagree (TP replicas differ) or cannot be reassembled (a CP rank is missing).",
    """
    miles writes one train dump per rank: TP replicas must hold the same values, and context-parallel slices
    are put back with miles' own zigzag offsets (`cp_utils.py`). Replicas that differ point at a
    non-deterministic or broken TP reduction; a missing CP rank leaves the sample unchecked.
    """,
    "train_data/0_1.pt: log_probs of sample 3 differ from train_data/0_0.pt",
    "train_data/0_{0..7}.pt: replicas agree",
    "Give every rank's file (the whole train_data folder).",
)

# ---- doctor: checklist lines that need logs or the load directory ----
_rule(
    "WC850",
    "checkpoint-not-loaded",
    Severity.ERROR,
    "No evidence that Megatron loaded the checkpoint: the load line is absent, or it started from random.",
    """
    The guides' first check for a garbled first rollout: "Check Megatron's logs — there should be a clear
    'loaded checkpoint from …' line. If absent, fix --load/--ref-load" (miles), and Megatron needs a directory
    with `latest_checkpointed_iteration.txt` (miles FAQ). Megatron-LM prints
    `successfully loaded checkpoint from {load_dir} [ t .., p .. ] at iteration N` when it loaded, and
    `WARNING: could not find the metadata file ... will not load any checkpoints and will start from random`
    when it did not (`megatron/training/checkpointing.py`). slime and miles also take a Hugging Face
    checkpoint as --load / --ref-load and load it into Megatron themselves, logging `Load checkpoint from
    HuggingFace model into Megatron (path=...)` (`_load_checkpoint_hf` in their
    `backends/megatron_utils/checkpoint.py`): such a folder and that line are evidence of a load too. Only a
    log with a Megatron trainer's lines (`using world size: ...`, `number of parameters on (tensor, ...`, a load
    line) is read for this: an SGLang or Ray log without the line says nothing about Megatron.
    """,
    "trainer.log: no 'loaded checkpoint from' line; load/ lacks latest_checkpointed_iteration.txt",
    "trainer.log:812:  successfully loaded checkpoint from /ckpt [ t 1/1, p 1/1 ] at iteration 0",
    "Point --load / --ref-load at a directory holding latest_checkpointed_iteration.txt (or pass --ckpt-step).",
    command="doctor",
)
_rule(
    "WC851",
    "log-illegal-memory-access",
    Severity.ERROR,
    "An engine log reports a CUDA illegal memory access.",
    """
    miles: "illegal memory access in SGLang — OOM in disguise — lower --sglang-mem-fraction-static"; slime's
    guide adds CUDA_LAUNCH_BLOCKING=1, toggling CUDA graphs and speculative decoding, and turning off DeepEP.
    """,
    "sglang.log:4411: CUDA error: an illegal memory access was encountered",
    "(no such line)",
    "Lower --sglang-mem-fraction-static (0.7, then 0.6); then CUDA_LAUNCH_BLOCKING=1, disable CUDA graph / "
    "speculative decoding / DeepEP to narrow it.",
    command="doctor",
)
_rule(
    "WC852",
    "log-worker-crashed",
    Severity.ERROR,
    "A Ray worker died (WorkerCrashed / RaySystemError).",
    """
    miles' log guide: grep for `WorkerCrashed` / `RaySystemError` — ranks died. The first such line names the
    actor; its own worker log (`~/.ray/session_latest/logs/worker-*.err`) holds the cause.
    """,
    "worker-1a2b.err:93: ray.exceptions.WorkerCrashedError: The worker died unexpectedly",
    "(no such line)",
    "Open the dead worker's .err log; OOM kills (dmesg) and NCCL errors are the usual causes.",
    command="doctor",
)
_rule(
    "WC853",
    "log-nccl-timeout",
    Severity.ERROR,
    "A collective timed out (NCCL watchdog).",
    """
    miles: "NCCL hang during weight sync — NCCL_TIMEOUT=900; check NCCL_DEBUG=INFO". Matched on the NCCL
    watchdog's messages (`Watchdog caught collective operation timeout`, `Some NCCL operations have failed or
    timed out`, torch `ProcessGroupNCCL.cpp`).
    """,
    "trainer.log:2210: [Rank 3] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=5, OpType=BROADCAST)",
    "(no such line)",
    "Raise the timeout (NCCL_TIMEOUT=900), rerun with NCCL_DEBUG=INFO, and check that every rank reached the sync.",
    command="doctor",
)
_rule(
    "WC854",
    "log-inductor-cache-corrupt",
    Severity.ERROR,
    "A JSONDecodeError raised from torch inductor: the compile cache is corrupt.",
    """
    miles: "JSONDecodeError from inductor — Cache corrupt; set TORCHINDUCTOR_FORCE_DISABLE_CACHES=1".
    Reported when a JSONDecodeError appears within a traceback that mentions `torch/_inductor`.
    """,
    "worker.err:51: json.decoder.JSONDecodeError: Expecting value (after torch/_inductor/codecache.py)",
    "(no such line)",
    "Add TORCHINDUCTOR_FORCE_DISABLE_CACHES=1 to the Ray env vars (or clear the inductor cache dir) and rerun.",
    command="doctor",
)
