"""The step-1 checks of the slime / miles / Relax debugging guides, on normalized dumps -> findings.

Each check reads `RolloutDump` / `TrainDump` objects (no file formats here) and reports through the WC8xx
rules registered in `weightcheck.rules.rollout`. Every finding names the rollout, the samples and the token
positions behind it, and the guides' cause it points at (`details.cause`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from weightcheck.findings import Finding, Location, Severity
from weightcheck.rollouts.readers import DumpSet, RolloutDump, RolloutSample, TrainDump, TrainSample

# How many samples / token positions a finding lists (the JSON details keep the same bounded lists).
_TOP = 5


@dataclass
class Thresholds:
    """Defaults are the frameworks' own (cited in each rule's doc); CLI options and `[tool.weightcheck.rollout]`
    override them."""

    ref_tol: float = 1e-8  # slime/miles step-0 |mean log_probs - mean ref_log_probs|
    routing_replay_ref_tol: float = 5e-3  # miles, under --use-rollout-routing-replay
    routing_replay: bool = False
    jitter_kl: float = 1e-4  # miles guide: KL < 1e-4 is kernel jitter
    large_kl: float = 1.0  # guides: KL > 1 is a configuration error
    train_rollout_diff: float = 0.1  # slime --ci-train-rollout-logprob-abs-diff-threshold default
    train_rollout_mean_tol: float = 0.03  # miles isclose(mean log_probs, mean rollout_log_probs, abs_tol=0.03)
    elevated_nll: float = 0.8  # guides: ~0.8 per token on an instruct model
    nll_error: float = 1.0  # slime CI sanity bound: -1 < mean log_probs < 0
    truncated_fraction: float = 0.5
    repeat_min_tokens: int = 32
    step1_rollout: int = 0  # the rollout id whose dumps are "step 1" (slime/miles check rollout_id == 0)
    reward_key: str | None = None

    @classmethod
    def keys(cls) -> dict[str, str]:
        """Config-file key (kebab-case) -> attribute."""
        return {f.name.replace("_", "-"): f.name for f in fields(cls)}

    def updated(self, values: dict[str, Any], where: str = "") -> Thresholds:
        known = self.keys()
        out = Thresholds(**{f.name: getattr(self, f.name) for f in fields(self)})
        for key, value in values.items():
            attr = known.get(key, key if key in known.values() else None)
            if attr is None:
                raise ValueError(f"unknown rollout setting {key!r}{where} (known: {', '.join(sorted(known))})")
            current = getattr(out, attr)
            if value is None:
                continue
            if isinstance(current, bool) or attr == "routing_replay":
                if not isinstance(value, bool):
                    raise ValueError(f"rollout setting {key!r}{where} must be true or false")
            elif attr == "reward_key":
                if not isinstance(value, str):
                    raise ValueError(f"rollout setting {key!r}{where} must be a string")
            elif (
                isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0
            ):
                raise ValueError(f"rollout setting {key!r}{where} must be a non-negative number")
            elif attr in ("repeat_min_tokens", "step1_rollout"):
                value = int(value)
            setattr(out, attr, value)
        return out


@dataclass
class Report:
    findings: list[Finding] = field(default_factory=list)
    checked: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    # One line per step-1 verdict, for `doctor` ("log_probs == ref_log_probs", "KL 2e-2"...).
    verdicts: dict[str, str] = field(default_factory=dict)

    def add(
        self,
        code: str,
        message: str,
        *,
        file: str | None,
        where: str | None = None,
        severity: Severity | None = None,
        **details: Any,
    ) -> None:
        from weightcheck.rules import get_rule

        rule = get_rule(code)
        assert rule is not None, code
        cause = details.get("cause")
        self.findings.append(
            Finding(
                code=code,
                name=rule.name,
                severity=severity or rule.severity,
                # the guides' cause this points at, in the text report too
                message=f"{message} [points at: {cause}]" if cause else message,
                location=Location(file=file, tensor=where),
                details={k: v for k, v in details.items() if v is not None},
            )
        )

    def count(self, key: str, n: int = 1) -> None:
        self.checked[key] = self.checked.get(key, 0) + n


def _fmt(x: float) -> str:
    return f"{x:.3g}" if abs(x) >= 1e-3 or x == 0 else f"{x:.2e}"


def _masked(values: Sequence[float], mask: Sequence[int] | None) -> list[int]:
    """Positions that count: loss-masked ones (rollout log-probs are 0.0 on tool tokens)."""
    if mask is None or len(mask) != len(values):
        return list(range(len(values)))
    return [i for i, m in enumerate(mask) if m]


def _names(samples: Iterable[Any]) -> str:
    items = [s.name for s in samples]
    more = f" and {len(items) - _TOP} more" if len(items) > _TOP else ""
    return ", ".join(items[:_TOP]) + more


def _rollout_label(rollout_id: Any) -> str:
    return f"rollout {rollout_id}" if rollout_id is not None else "rollout ?"


# ---------------------------------------------------------------- step 1: log_probs vs ref_log_probs
def _pairs(sample: TrainSample, a: str, b: str) -> list[tuple[int, float, float]] | None:
    x, y = getattr(sample, a), getattr(sample, b)
    if x is None or y is None:
        return None
    if len(x) != len(y):
        return None
    return [(i, x[i], y[i]) for i in _masked(x, sample.loss_mask)]


def check_step1_ref(dump: TrainDump, th: Thresholds, report: Report) -> None:
    file = dump.files[0] if len(dump.files) == 1 else f"{dump.files[0]} (+{len(dump.files) - 1} ranks)"
    per_sample: list[tuple[TrainSample, float, float, float, list[tuple[int, float]]]] = []
    tokens = 0
    differing = 0
    bad_length = []
    for sample in dump.samples:
        pairs = _pairs(sample, "log_probs", "ref_log_probs")
        if pairs is None:
            if sample.log_probs is not None and sample.ref_log_probs is not None:
                bad_length.append(sample)
            continue
        if not pairs:
            continue
        kl = 0.0
        diffs = []
        for i, lp, ref in pairs:
            r = ref - lp
            # k3 = exp(r) - r - 1, via expm1 so that kernel-jitter-sized r (1e-8) does not round to 0
            kl += math.expm1(min(r, 50.0)) - r if math.isfinite(r) else math.inf
            if lp != ref:
                diffs.append((i, abs(lp - ref)))
        tokens += len(pairs)
        differing += len(diffs)
        mean_lp = sum(p[1] for p in pairs) / len(pairs)
        mean_ref = sum(p[2] for p in pairs) / len(pairs)
        per_sample.append((sample, kl / len(pairs), mean_lp, mean_ref, diffs))
    if bad_length:
        report.add(
            "WC812",
            f"{_rollout_label(dump.rollout_id)}: log_probs and ref_log_probs lengths differ for {_names(bad_length)}",
            file=file,
            samples=[s.position for s in bad_length[:_TOP]],
        )
    if not per_sample:
        return
    report.count("step1_samples", len(per_sample))
    report.count("step1_tokens", tokens)
    kl = sum(p[1] for p in per_sample) / len(per_sample)
    # slime/miles compare batch means of per-sample means (`sum_of_sample_mean`), not per-token values
    mean_diff = abs(sum(p[2] for p in per_sample) / len(per_sample) - sum(p[3] for p in per_sample) / len(per_sample))
    label = _rollout_label(dump.rollout_id)
    if differing == 0:
        report.verdicts["step1-ref"] = f"{label}: log_probs == ref_log_probs on all {tokens} loss-masked tokens (KL 0)"
        return
    worst = sorted(per_sample, key=lambda p: -p[1])
    worst_samples = [p[0] for p in worst if p[4]][:_TOP]
    positions = {p[0].position: [i for i, _ in sorted(p[4], key=lambda d: -d[1])[:_TOP]] for p in worst if p[4]}
    positions = dict(list(positions.items())[:_TOP])
    top = worst[0]
    top_pos, top_diff = max(top[4], key=lambda d: d[1]) if top[4] else (0, 0.0)
    tol = th.routing_replay_ref_tol if th.routing_replay else th.ref_tol
    assertion_fails = not (mean_diff < tol)
    framework = (
        f"slime/miles step-0 assertion |mean(log_probs) − mean(ref_log_probs)| < {tol:g}: "
        f"{_fmt(mean_diff)} → {'fails' if assertion_fails else 'passes'}"
    )
    common = dict(
        rollout_id=dump.rollout_id,
        kl=kl,
        mean_abs_diff_of_means=mean_diff,
        tokens=tokens,
        tokens_differing=differing,
        samples=[s.position for s in worst_samples],
        positions={str(k): v for k, v in positions.items()},
        framework_assertion="fails" if assertion_fails else "passes",
    )
    where = f"{top[0].name} token {top_pos}"
    detail = (
        f"{differing} of {tokens} tokens differ; worst: {_names(worst_samples)}; "
        f"{top[0].name} token {top_pos} differs by {_fmt(top_diff)}; {framework}"
    )
    if kl > th.large_kl:
        report.verdicts["step1-ref"] = f"{label}: KL {_fmt(kl)} > {th.large_kl:g} (configuration error)"
        report.add(
            "WC803",
            f"{label}: KL(log_probs ‖ ref_log_probs) {_fmt(kl)} > {th.large_kl:g} at step 1 — {detail}",
            file=file,
            where=where,
            cause="configuration error (parallelism or precision)",
            **common,
        )
    elif kl >= th.jitter_kl:
        report.verdicts["step1-ref"] = f"{label}: KL {_fmt(kl)} beyond jitter (actor ≠ reference)"
        report.add(
            "WC802",
            f"{label}: KL(log_probs ‖ ref_log_probs) {_fmt(kl)} at step 1, above the jitter band {th.jitter_kl:g}: "
            f"actor and reference differ — {detail}",
            file=file,
            where=where,
            # Under routing replay the reference does not replay the routes, so the two legitimately differ
            # (miles relaxes its assertion to 5e-3): only the assertion's verdict makes it an error then.
            severity=Severity.WARNING if th.routing_replay and not assertion_fails else None,
            cause="reference model differs from the actor (--ref-load vs --load, a layer not loaded or converted "
            "differently)",
            **common,
        )
    else:
        report.verdicts["step1-ref"] = (
            f"{label}: KL {_fmt(kl)} < {th.jitter_kl:g} (kernel jitter); "
            f"framework assertion {common['framework_assertion']}"
        )
        report.add(
            "WC801",
            f"{label}: log_probs ≠ ref_log_probs at step 1 within the jitter band "
            f"(KL {_fmt(kl)} < {th.jitter_kl:g}) — {detail}",
            file=file,
            where=where,
            severity=Severity.ERROR if assertion_fails else Severity.WARNING,
            cause="non-deterministic kernels (Transformer Engine fused attention under CP: --attention-backend flash)",
            **common,
        )


# ---------------------------------------------------------------- train vs rollout log-probs
def check_train_rollout(dump: TrainDump, th: Thresholds, report: Report) -> None:
    file = dump.files[0] if len(dump.files) == 1 else f"{dump.files[0]} (+{len(dump.files) - 1} ranks)"
    rows = []
    for sample in dump.samples:
        pairs = _pairs(sample, "log_probs", "rollout_log_probs")
        if not pairs:
            continue
        diffs = [(i, abs(lp - ro)) for i, lp, ro in pairs]
        rows.append(
            (
                sample,
                sum(d for _, d in diffs) / len(diffs),
                sum(p[1] for p in pairs) / len(pairs),
                sum(p[2] for p in pairs) / len(pairs),
                diffs,
            )
        )
    if not rows:
        return
    report.count("train_rollout_samples", len(rows))
    abs_diff = sum(r[1] for r in rows) / len(rows)  # slime train_rollout_logprob_abs_diff (sum_of_sample_mean)
    mean_gap = abs(sum(r[2] for r in rows) / len(rows) - sum(r[3] for r in rows) / len(rows))
    label = _rollout_label(dump.rollout_id)
    report.verdicts.setdefault("train-rollout", "")
    line = f"{label}: mean |log_probs − rollout_log_probs| {_fmt(abs_diff)}"
    if abs_diff <= th.train_rollout_diff and mean_gap <= th.train_rollout_mean_tol:
        report.verdicts["train-rollout"] = (
            report.verdicts["train-rollout"] + "; " if report.verdicts["train-rollout"] else ""
        ) + line
        return
    worst = sorted(rows, key=lambda r: -r[1])[:_TOP]
    positions = {r[0].position: [i for i, _ in sorted(r[4], key=lambda d: -d[1])[:_TOP]] for r in worst}
    top = worst[0]
    top_pos, top_diff = max(top[4], key=lambda d: d[1])
    report.verdicts["train-rollout"] = line + " (too large)"
    report.add(
        "WC804",
        f"{label}: trainer and engine disagree: mean |log_probs − rollout_log_probs| {_fmt(abs_diff)} (slime bound "
        f"{th.train_rollout_diff:g}), |mean gap| {_fmt(mean_gap)} (miles bound {th.train_rollout_mean_tol:g}); worst "
        f"{_names(r[0] for r in worst)}; {top[0].name} token {top_pos} differs by {_fmt(top_diff)}",
        file=file,
        where=f"{top[0].name} token {top_pos}",
        cause="trainer and engine hold different weights (weight sync, PP/EP offset) or precision",
        rollout_id=dump.rollout_id,
        abs_diff=abs_diff,
        mean_gap=mean_gap,
        samples=[r[0].position for r in worst],
        positions={str(k): v for k, v in positions.items()},
    )


# ---------------------------------------------------------------- chat-template signature
def check_nll(label: str, file: str, samples: Sequence[Any], attr: str, th: Thresholds, report: Report) -> None:
    total = 0.0
    n = 0
    per = []
    for sample in samples:
        values = getattr(sample, attr)
        if values is None:
            continue
        idx = _masked(values, sample.loss_mask)
        vals = [values[i] for i in idx if math.isfinite(values[i])]
        if not vals:
            continue
        total += -sum(vals)
        n += len(vals)
        per.append((sample, -sum(vals) / len(vals)))
    if not n:
        return
    report.count("nll_tokens", n)
    nll = total / n
    source = "trainer log_probs" if attr == "log_probs" else "engine rollout_log_probs"
    report.verdicts.setdefault("nll", f"{label}: mean −log p {_fmt(nll)} per token ({source})")
    if nll < th.elevated_nll:
        return
    worst = sorted(per, key=lambda p: -p[1])[:_TOP]
    report.verdicts["nll"] = f"{label}: mean −log p {_fmt(nll)} per token (elevated)"
    report.add(
        "WC805",
        f"{label}: mean −log p {_fmt(nll)} per response token over {n} tokens ({source}) >= {th.elevated_nll:g}: the "
        f"chat-template-mismatch signature; worst {', '.join(f'{s.name} ({_fmt(v)})' for s, v in worst)}",
        file=file,
        where=worst[0][0].name,
        severity=Severity.ERROR if nll >= th.nll_error else Severity.WARNING,
        cause="data does not follow the model's chat template, or does not match the cold-start distribution",
        nll=nll,
        tokens=n,
        samples=[s.position for s, _ in worst],
    )


_BOT = ("<|begin_of_text|>", "<bos>", "[gMASK]", "<|startoftext|>")
_SYSTEM = ("<|im_start|>system", "<|start_header_id|>system", "<|system|>", "<start_of_turn>system")
_NESTED = re.compile(
    r"(<\|im_start\|>(?:user|system)\s*\n?\s*<\|im_start\|>)"
    r"|(<\|start_header_id\|>user<\|end_header_id\|>\s*(?:<\|begin_of_text\|>|<\|start_header_id\|>))"
    r"|(\[INST\]\s*\[INST\])"
    r"|(<start_of_turn>user\s*\n?\s*<start_of_turn>)"
)


def double_template(prompt: str) -> str | None:
    """Why a prompt looks templated twice, or None."""
    for marker in _BOT:
        if prompt.count(marker) >= 2:
            return f"{marker!r} appears {prompt.count(marker)} times"
    # "<s>[INST]" is Llama-2/Mistral's normal opening (and every turn of theirs repeats it): only a doubled
    # "<s><s>" at the very start is a second template.
    if prompt.startswith("<s>") and prompt[3:].lstrip().startswith("<s>"):
        return "'<s>' appears twice at the start"
    for marker in _SYSTEM:
        if prompt.count(marker) >= 2:
            return f"{marker!r} appears {prompt.count(marker)} times"
    match = _NESTED.search(prompt)
    if match:
        return f"a role header opens with another template header ({match.group(0)[:40]!r})"
    return None


def check_templates(dump: RolloutDump, report: Report) -> None:
    hits = []
    for sample in dump.samples:
        if not sample.prompt:
            continue
        report.count("prompts")
        why = double_template(sample.prompt)
        if why:
            hits.append((sample, why))
    if hits:
        report.add(
            "WC806",
            f"{_rollout_label(dump.rollout_id)}: {len(hits)} prompt(s) templated twice: {hits[0][0].name}: {hits[0][1]}"
            + (f"; also {_names(s for s, _ in hits[1:])}" if len(hits) > 1 else ""),
            file=dump.file if not hits[0][0].file.startswith(dump.file + ":") else hits[0][0].file,
            where=hits[0][0].name,
            cause="already-templated data fed to a model that re-applies its chat template",
            samples=[s.position for s, _ in hits[:_TOP]],
        )


# ---------------------------------------------------------------- degenerate responses
def _response_tokens(sample: RolloutSample) -> list[int] | None:
    if sample.tokens is None or sample.response_length is None:
        return None
    if sample.response_length == 0:
        return []
    return sample.tokens[-sample.response_length :]


def trailing_loop(tokens: Sequence[int], min_tokens: int) -> tuple[int, int] | None:
    """(period, covered tokens) of a loop the response ends in, or None."""
    best = None
    for period in range(1, 17):
        run = 0
        for i in range(len(tokens) - 1, period - 1, -1):
            if tokens[i] != tokens[i - period]:
                break
            run += 1
        covered = run + period
        if covered >= max(min_tokens, 4 * period) and (best is None or covered > best[1]):
            best = (period, covered)
    return best


def check_responses(dump: RolloutDump, th: Thresholds, report: Report) -> None:
    label = _rollout_label(dump.rollout_id)
    empty, truncated, loops, masks = [], [], [], []
    for sample in dump.samples:
        report.count("responses")
        if sample.response_length == 0 or (
            sample.response_length is None and sample.tokens is None and not sample.response
        ):
            empty.append(sample)
        if sample.status == "truncated":
            truncated.append(sample)
        response = _response_tokens(sample)
        if response:
            loop = trailing_loop(response, th.repeat_min_tokens)
            if loop:
                loops.append((sample, loop, len(response)))
        if sample.loss_mask is not None and sample.response_length is not None:
            if len(sample.loss_mask) != sample.response_length:
                masks.append(
                    (sample, f"loss_mask has {len(sample.loss_mask)} entries, response_length {sample.response_length}")
                )
            elif any(m not in (0, 1) for m in sample.loss_mask):
                masks.append((sample, "loss_mask holds values other than 0 and 1"))
        if (
            sample.rollout_log_probs is not None
            and sample.response_length is not None
            and len(sample.rollout_log_probs) != sample.response_length
        ):
            masks.append(
                (
                    sample,
                    f"rollout_log_probs has {len(sample.rollout_log_probs)} entries, "
                    f"response_length {sample.response_length}",
                )
            )
    if empty:
        report.add(
            "WC807",
            f"{label}: {len(empty)} empty response(s): {_names(empty)}",
            file=dump.file,
            where=empty[0].name,
            cause="engine stopped at once or the sample failed",
            samples=[s.position for s in empty[:_TOP]],
        )
    n = len(dump.samples)
    if n and truncated and len(truncated) / n >= th.truncated_fraction:
        report.add(
            "WC808",
            f"{label}: {len(truncated)} of {n} samples truncated at the maximum length: {_names(truncated)}",
            file=dump.file,
            where=truncated[0].name,
            cause="stop tokens misconfigured / chat template (the model never emits EOS)",
            samples=[s.position for s in truncated[:_TOP]],
        )
    if loops:
        s, (period, covered), length = loops[0]
        report.add(
            "WC809",
            f"{label}: {len(loops)} response(s) end in a loop: {s.name} tokens {length - covered}..{length - 1} "
            f"repeat a {period}-token n-gram {covered // period} times"
            + (f"; also {_names(x[0] for x in loops[1:])}" if len(loops) > 1 else ""),
            file=dump.file,
            where=s.name,
            cause="degenerate generation (garbled weights or template)",
            samples=[x[0].position for x in loops[:_TOP]],
            positions={str(s.position): [length - covered, length - 1]},
        )
    if masks:
        s, why = masks[0]
        report.add(
            "WC812",
            f"{label}: {len(masks)} sample(s) with a per-token field that does not fit the response: {s.name}: {why}",
            file=dump.file,
            where=s.name,
            cause="custom generate function builds loss_mask / log-probs of the wrong length",
            samples=[x[0].position for x in masks[:_TOP]],
        )
    elif n and all(s.loss_mask is not None and s.loss_mask and not any(s.loss_mask) for s in dump.samples):
        report.add(
            "WC812",
            f"{label}: every sample's loss_mask is all zero: nothing is trained",
            file=dump.file,
            severity=Severity.WARNING,
            cause="loss mask construction",
        )


# ---------------------------------------------------------------- rewards
def check_rewards(dump: RolloutDump, report: Report) -> None:
    label = _rollout_label(dump.rollout_id)
    rewards = [(s, s.reward) for s in dump.samples if s.reward is not None]
    if not rewards:
        if any(isinstance(s.reward_raw, dict) for s in dump.samples):
            report.notes.append(f"{label}: rewards are dicts; pass --reward-key to check them")
        return
    report.count("rewards", len(rewards))
    bad = [s for s, r in rewards if not math.isfinite(r)]
    if bad:
        report.add(
            "WC810",
            f"{label}: {len(bad)} reward(s) NaN or infinite: {_names(bad)}",
            file=dump.file,
            where=bad[0].name,
            cause="reward function",
            samples=[s.position for s in bad[:_TOP]],
        )
    finite = [(s, r) for s, r in rewards if math.isfinite(r)]
    if len(finite) < 2:
        return
    values = {r for _, r in finite}
    if len(values) == 1:
        report.add(
            "WC811",
            f"{label}: all {len(finite)} rewards are {next(iter(values)):g}: every advantage is zero",
            file=dump.file,
            cause="reward signal broken (--label-key / --reward-key)",
            value=next(iter(values)),
        )
        return
    groups: dict[int, list[float]] = {}
    for s, r in finite:
        if s.group_index is not None:
            groups.setdefault(s.group_index, []).append(r)
    real = [g for g, values in groups.items() if len(values) >= 2]  # a group of one is constant by definition
    if real and all(len(set(groups[g])) == 1 for g in real):
        report.add(
            "WC811",
            f"{label}: rewards are constant within every one of {len(real)} prompt groups: "
            "group-normalised advantages are all zero",
            file=dump.file,
            cause="reward signal broken, or tasks all too easy / too hard",
            groups=len(real),
        )


# ---------------------------------------------------------------- entry point
def run_checks(dumps: DumpSet, th: Thresholds, enabled: Callable[[str], bool] | None = None) -> Report:
    report = Report()
    report.notes.extend(dumps.notes)
    for problem in dumps.problems:
        code = "WC813" if problem.kind == "ranks" else "WC800"
        msg = problem.message
        report.add(code, msg, file=problem.file, unsafe_globals=problem.unsafe_globals or None)
    step1 = [d for d in dumps.trains if str(d.rollout_id) == str(th.step1_rollout)]
    for dump in step1:
        check_step1_ref(dump, th, report)
    if dumps.trains and not step1:
        ids = sorted({str(d.rollout_id) for d in dumps.trains})
        report.notes.append(
            f"step-1 check (log_probs vs ref_log_probs) not run: no train dump of rollout {th.step1_rollout} "
            f"(found {', '.join(ids)}); pass --step1-rollout"
        )
    elif step1 and "step1_samples" not in report.checked:
        report.notes.append("step-1 check not run: the train dump has no ref_log_probs (no reference model loaded?)")
    if not dumps.trains and dumps.rollouts:
        report.notes.append(
            "no train dump: log_probs vs ref_log_probs and trainer vs engine log-probs not checked "
            "(the run needs --save-debug-train-data or --dump-details)"
        )
    for dump in dumps.trains:
        check_train_rollout(dump, th, report)
    trains_by_id = {str(d.rollout_id): d for d in dumps.trains}
    for dump in dumps.rollouts:
        label = _rollout_label(dump.rollout_id)
        train = trains_by_id.get(str(dump.rollout_id))
        if train is not None and any(s.log_probs is not None for s in train.samples):
            check_nll(label, train.files[0], train.samples, "log_probs", th, report)
        else:
            check_nll(label, dump.file, dump.samples, "rollout_log_probs", th, report)
        check_templates(dump, report)
        check_responses(dump, th, report)
        check_rewards(dump, report)
    for dump in dumps.trains:
        if str(dump.rollout_id) not in {str(r.rollout_id) for r in dumps.rollouts}:
            check_nll(_rollout_label(dump.rollout_id), dump.files[0], dump.samples, "log_probs", th, report)
    if enabled is not None:
        report.findings = [f for f in report.findings if enabled(f.code)]
    return report
