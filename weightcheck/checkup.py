"""`weightcheck doctor RUN`: the step-1 checklist of the slime / miles / Relax debugging guides, walked in
their order for one run, from whatever the run left on disk.

Checklist (the guides' "first training step" section, then their log-reading section):

1. checkpoint-loaded   Megatron loaded the checkpoint: `latest_checkpointed_iteration.txt` in the load dir
                       (or a Hugging Face checkpoint there, which slime and miles load themselves),
                       "successfully loaded checkpoint from" in the trainer log (WC850); logs without a
                       Megatron trainer's lines (an engine's, Ray's) are not evidence either way
2. checkpoint-lint     the HF checkpoint the engine serves is complete and consistent (`lint`)
3. weight-sync         the first sync put every tensor under the right name (`verify`; PP/EP offsets)
4. buffers             engine buffers survive release_memory_occupation (`verify`'s engine-state checks)
5. rollout-coherent    responses are not empty / looping / cut off, prompts not templated twice (`rollout`)
6. logprobs-equal      step 1: log_probs == ref_log_probs, else jitter / reference differs / config error
7. logprob-level       mean −log p per token not at the chat-template-mismatch signature
8. train-vs-rollout    trainer and engine log-probs agree (a sync or precision problem otherwise)
9. rewards             rewards finite and not constant
10. log-signals        weight_sync events, WorkerCrashed/RaySystemError, NCCL timeouts, illegal memory access
                       (OOM in disguise), JSONDecodeError from inductor (corrupt compile cache)

Inputs are found under RUN by convention (docs in the README) or named with options. A line whose input is
absent says "not checked", never "ok". Logs are read line by line, size-capped, never executed. lint,
verify and rollout run through their Python APIs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from weightcheck import safe_io
from weightcheck.findings import Finding, Location, Result, Severity
from weightcheck.runlogs import MAX_LOG_BYTES, scan_logs
from weightcheck.runlogs import relative_label as _rel

OK, PROBLEM, WARN, NOT_CHECKED, INFO = "ok", "problem", "warning", "not checked", "info"
_MAX_WALK = 20_000
_LOG_SUFFIXES = (".log", ".out", ".err", ".txt")


@dataclass
class Line:
    key: str
    title: str
    verdict: str = NOT_CHECKED
    evidence: list[str] = field(default_factory=list)
    next_step: str = ""
    why_not: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "title": self.title,
            "verdict": self.verdict,
            "evidence": self.evidence,
            "next_step": self.next_step,
            **({"not_checked_because": self.why_not} if self.verdict == NOT_CHECKED else {}),
        }


CHECKLIST = (
    ("checkpoint-loaded", "Megatron loaded the checkpoint (--load / --ref-load)"),
    ("checkpoint-lint", "The HF checkpoint is complete and consistent (weightcheck lint)"),
    ("weight-sync", "The first weight sync mapped every parameter (weightcheck verify)"),
    ("buffers", "Engine buffers survive the release/resume cycle (verify's engine-state checks)"),
    ("rollout-coherent", "Step-1 rollout is coherent (weightcheck rollout)"),
    ("logprobs-equal", "Step 1: log_probs == ref_log_probs (KL 0)"),
    ("logprob-level", "Step 1: log-probs per token are small (no chat-template signature)"),
    ("train-vs-rollout", "Trainer and engine log-probs agree"),
    ("rewards", "Rewards are finite and carry signal"),
    ("log-signals", "Logs: the guides' signal phrases"),
)

NEXT_STEPS = {
    "checkpoint-loaded": "Fix --load / --ref-load: Megatron needs a directory holding "
    "latest_checkpointed_iteration.txt "
    "(or --ckpt-step N), or, in slime and miles, a Hugging Face checkpoint folder; look for 'successfully loaded "
    "checkpoint from' in the trainer log.",
    "checkpoint-lint": "Fix the conversion (missing shards, ignore list not covering mlp.gate / embeddings) "
    "and re-convert.",
    "weight-sync": "Fix the parameter name mapping for the stage or expert group named (pp_size > 1: the second "
    "stage's layer ids); save what load_weights receives and compare with the checkpoint.",
    "buffers": "Re-load the buffers named after release_memory_occupation / resume (rotary caches, norms "
    "kept as buffers).",
    "rollout-coherent": "If parameters load and sync correctly: check the chat template and stop tokens; "
    "try the instruct "
    "model of the same architecture.",
    "logprobs-equal": "Jitter: deterministic kernels (--attention-backend flash under CP). "
    "Elevated: --ref-load and --load "
    "must hold the same step-0 weights. KL > 1: re-check parallelism and precision.",
    "logprob-level": "Check the data against the model's chat template (no already-templated prompts).",
    "train-vs-rollout": "Verify the sync of that step: the engine serves other weights than the trainer holds.",
    "rewards": "Check the reward function and --label-key / --reward-key.",
    "log-signals": "Illegal memory access: lower --sglang-mem-fraction-static. JSONDecodeError from inductor: "
    "TORCHINDUCTOR_FORCE_DISABLE_CACHES=1. NCCL timeout: NCCL_TIMEOUT=900, NCCL_DEBUG=INFO. Dead workers: read "
    "their worker-*.err.",
}

# Rollout codes -> checklist line.
_ROLLOUT_LINE = {
    "WC800": "rollout-coherent",
    "WC806": "rollout-coherent",
    "WC807": "rollout-coherent",
    "WC808": "rollout-coherent",
    "WC809": "rollout-coherent",
    "WC812": "rollout-coherent",
    "WC801": "logprobs-equal",
    "WC802": "logprobs-equal",
    "WC803": "logprobs-equal",
    "WC813": "logprobs-equal",
    "WC805": "logprob-level",
    "WC804": "train-vs-rollout",
    "WC810": "rewards",
    "WC811": "rewards",
}
_STATE_CODES = {"WC740", "WC741", "WC742", "WC743", "WC744"}


@dataclass
class RunInputs:
    """What doctor found (or was told) for one run."""

    run: Path
    checkpoint: Path | None = None
    loads: list[Path] = field(default_factory=list)
    records: Path | None = None
    manifests: Path | None = None
    dumps: Path | None = None
    logs: list[Path] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def _walk(root: Path, max_depth: int = 5) -> Iterator[Path]:
    """Files and folders under `root`, symlinks that leave it refused, bounded in count and depth."""
    seen = 0
    stack = [(root, 0)]
    while stack:
        folder, depth = stack.pop()
        try:
            entries = sorted(folder.iterdir())
        except OSError:
            continue
        for entry in entries:
            seen += 1
            if seen > _MAX_WALK:
                return
            try:
                real = safe_io.confine(root, str(entry.relative_to(root)))
            except safe_io.UnsafePath:
                continue
            yield entry
            if real.is_dir() and depth < max_depth and entry.name not in ("__pycache__", ".git"):
                stack.append((entry, depth + 1))


def discover(run: Path, **given: Any) -> RunInputs:
    """Conventions (each overridable by an option):
    - HF checkpoint: a folder with config.json and *.safetensors (`--checkpoint`);
    - Megatron load dirs: folders holding latest_checkpointed_iteration.txt, or named load/ ref_load/ (`--load`);
    - tap records: the folder holding sync-NNNNN/ folders (`--records`, WEIGHTCHECK_DIR of the run);
    - trainer manifests: a folder named manifests/ (`--manifests`), used as verify's reference when present;
    - dumps: a folder holding rollout_data/ or train_data/ (`--dumps`, the run's --dump-details);
    - logs: *.log, *.out, *.err files, e.g. a Ray session's logs/ folder (`--log`, repeatable).
    """
    inputs = RunInputs(run=run)
    found_ckpt: Path | None = None
    found_records: Path | None = None
    found_dumps: Path | None = None
    found_manifests: Path | None = None
    loads: list[Path] = []
    logs: list[Path] = []
    if run.is_dir():
        for entry in _walk(run):
            name = entry.name
            if entry.is_dir():
                if name in ("load", "ref_load", "ref-load") and entry not in loads:
                    loads.append(entry)
                elif name.startswith("sync-") and name[5:].isdigit() and found_records is None:
                    found_records = entry.parent
                elif name in ("rollout_data", "train_data") and found_dumps is None:
                    found_dumps = entry.parent
                elif name == "manifests" and found_manifests is None:
                    found_manifests = entry
                continue
            if name == "latest_checkpointed_iteration.txt" and entry.parent not in loads:
                loads.append(entry.parent)
            elif name == "config.json" and found_ckpt is None and any(entry.parent.glob("*.safetensors")):
                found_ckpt = entry.parent
            elif entry.suffix in _LOG_SUFFIXES and name != "latest_checkpointed_iteration.txt":
                if found_records is not None and found_records in entry.parents:
                    continue
                logs.append(entry)
    elif run.is_file():
        logs.append(run)
    inputs.checkpoint = given.get("checkpoint") or found_ckpt
    inputs.loads = list(given.get("load") or ()) or loads
    inputs.records = given.get("records") or found_records
    inputs.manifests = given.get("manifests") or found_manifests
    inputs.dumps = given.get("dumps") or found_dumps
    # Text files inside the checkpoint or the dumps (merges.txt, vocab.txt) are not logs.
    inside = [p for p in (inputs.checkpoint, inputs.dumps) if p is not None]
    logs = [p for p in logs if not any(folder in p.parents for folder in inside)]
    inputs.logs = list(given.get("log") or ()) or sorted(logs)
    return inputs


def _names(labels: list[str]) -> str:
    return ", ".join(labels[:4]) + (", …" if len(labels) > 4 else "")


def _is_file(path: Path) -> bool:
    try:
        return path.is_file()
    except OSError:
        return False


# ---------------------------------------------------------------- the checklist
def _finding(code: str, message: str, file: str | None = None, **details: Any) -> Finding:
    from weightcheck.rules import get_rule

    rule = get_rule(code)
    assert rule is not None, code
    return Finding(
        code=code,
        name=rule.name,
        severity=rule.severity,
        message=message,
        location=Location(file=file),
        details=details,
    )


def _first_sync(records: Path) -> int | None:
    seqs = sorted(int(p.name[5:]) for p in records.glob("sync-*") if p.name[5:].isdigit())
    return seqs[0] if seqs else None


def _verdict_of(findings: list[Finding]) -> str:
    if any(f.severity >= Severity.ERROR for f in findings):
        return PROBLEM
    if findings:
        return WARN
    return OK


def _evidence(findings: list[Finding], limit: int = 6) -> list[str]:
    out = []
    for f in sorted(findings, key=lambda f: -f.severity)[:limit]:
        where = f.location.file or ""
        out.append(f"{f.code} {f.name}: {where + ': ' if where and where not in f.message else ''}{f.message}")
    if len(findings) > limit:
        out.append(f"… {len(findings) - limit} more finding(s)")
    return out


def doctor(
    inputs: RunInputs,
    *,
    lint: Callable[..., Result],
    verify: Callable[..., Result],
    thresholds: Any = None,
    select: list[str] | None = None,
    ignore: list[str] | None = None,
) -> tuple[Result, list[Line]]:
    """Walk the checklist. Returns the combined Result (every finding of every step) and the checklist.
    `lint` and `verify` are the Python API's (weightcheck.api): the caller passes them in, so this engine does
    not import the API layer above it."""
    result = Result(target=str(inputs.run), command="doctor", root=str(inputs.run) if inputs.run.is_dir() else None)
    lines = {key: Line(key, title, next_step=NEXT_STEPS[key]) for key, title in CHECKLIST}
    run = inputs.run
    scan = scan_logs(inputs.logs, run) if inputs.logs else None

    # 1. checkpoint loaded
    line = lines["checkpoint-loaded"]
    problems: list[Finding] = []
    looked = False
    for load in inputs.loads:
        looked = True
        tracker = load / "latest_checkpointed_iteration.txt"
        if not _is_file(tracker) and _is_file(load / "config.json"):
            # slime and miles load a Hugging Face checkpoint given as --load / --ref-load into Megatron
            # themselves (their `_load_checkpoint_hf`); it needs no tracker, and lint checks it (line 2).
            line.evidence.append(
                f"{_rel(load, run)}: a Hugging Face checkpoint (config.json, no latest_checkpointed_iteration.txt); "
                "slime and miles load it into Megatron directly"
            )
            continue
        try:
            text = safe_io.read_text(tracker, 4096, name=str(tracker)).strip()
        except safe_io.UnsafePath as exc:
            problems.append(
                _finding(
                    "WC850",
                    f"{_rel(load, run)} has no readable latest_checkpointed_iteration.txt ({exc.reason}): "
                    "Megatron starts from random",
                    file=_rel(tracker, run),
                )
            )
            continue
        if text.isdigit() or text == "release":
            line.evidence.append(f"{_rel(tracker, run)}:1: {text}")
        else:
            problems.append(
                _finding(
                    "WC850",
                    f"{_rel(tracker, run)} holds {text[:40]!r}, not an iteration or 'release' (Megatron exits)",
                    file=_rel(tracker, run),
                )
            )
    if scan is not None and scan.trainer_logs:
        looked = True
        if scan.not_loaded:
            problems.append(
                _finding(
                    "WC850",
                    f"Megatron did not load a checkpoint: {scan.not_loaded[0]}",
                    file=scan.not_loaded[0].split(":")[0],
                )
            )
        if scan.loaded:
            line.evidence.extend(scan.loaded[:3])
        elif not scan.not_loaded:
            problems.append(
                _finding(
                    "WC850",
                    f"no 'loaded checkpoint from' line in the trainer log(s) ({_names(scan.trainer_logs)})",
                    file=None,
                )
            )
    if looked:
        line.verdict = _verdict_of(problems)
        line.evidence = _evidence(problems) + line.evidence
        result.findings.extend(problems)
    elif scan is not None and scan.files:
        line.why_not = (
            f"none of the {scan.files} log file(s) is a Megatron trainer's (no 'using world size', 'number of "
            "parameters on (tensor, ...)' or checkpoint-load line), and no load directory was found; pass the "
            "trainer's stdout with --log"
        )
    else:
        line.why_not = "no Megatron load directory (latest_checkpointed_iteration.txt) and no log file found"

    # 2. lint
    line = lines["checkpoint-lint"]
    if inputs.checkpoint is not None:
        sub = lint(inputs.checkpoint, select=select, ignore=ignore, config=False)
        _take(result, sub, line, f"lint {_rel(inputs.checkpoint, run)}")
    else:
        line.why_not = "no HF checkpoint (a folder with config.json and *.safetensors) found; pass --checkpoint"

    # 3/4. verify the first sync; engine-state checks
    line, state = lines["weight-sync"], lines["buffers"]
    if inputs.records is not None:
        against = inputs.manifests or inputs.checkpoint
        first = _first_sync(inputs.records)
        sub = verify(inputs.records, against, sync=first, select=select, ignore=ignore, config=False)
        state_findings = [f for f in sub.findings if f.code in _STATE_CODES]
        sync_findings = [f for f in sub.findings if f.code not in _STATE_CODES]
        result.findings.extend(sub.findings)
        result.notes.extend(n for n in sub.notes if not n.startswith("verified in"))
        if sub.nothing_checked:
            line.why_not = "the records hold no sync"
        else:
            line.verdict = _verdict_of(sync_findings)
            where = f"verify {_rel(inputs.records, run)} sync {first}" + (
                f" against {_rel(against, run)}" if against else " (no reference: engine-side checks only)"
            )
            line.evidence = [where, *_evidence(sync_findings)]
        if _has_state(inputs.records):
            state.verdict = _verdict_of(state_findings)
            state.evidence = _evidence(state_findings) or [
                f"engine state recorded in {_rel(inputs.records, run)}: buffers unchanged"
            ]
        else:
            state.why_not = "the records hold no engine state (run the tap with WEIGHTCHECK_STATE=1)"
    else:
        line.why_not = "no tap records (sync-NNNNN/ folders) found; pass --records"
        state.why_not = line.why_not

    # 5-9. rollout dumps
    keys = ("rollout-coherent", "logprobs-equal", "logprob-level", "train-vs-rollout", "rewards")
    if inputs.dumps is not None:
        from weightcheck.rollouts import check_rollout_verdicts

        sub, verdicts = check_rollout_verdicts(inputs.dumps, thresholds, select=select, ignore=ignore)
        result.findings.extend(sub.findings)
        result.notes.extend(sub.notes)
        checked = sub.checked
        by_line: dict[str, list[Finding]] = {k: [] for k in keys}
        for f in sub.findings:
            by_line[_ROLLOUT_LINE.get(f.code, "rollout-coherent")].append(f)
        had = {
            "rollout-coherent": checked.get("responses", 0) > 0 or any(f.code == "WC800" for f in sub.findings),
            "logprobs-equal": checked.get("step1_samples", 0) > 0,
            "logprob-level": checked.get("nll_tokens", 0) > 0,
            "train-vs-rollout": checked.get("train_rollout_samples", 0) > 0,
            "rewards": checked.get("rewards", 0) > 0,
        }
        why = {
            "rollout-coherent": "no rollout samples in the dumps",
            "logprobs-equal": "no train dump of the first rollout with log_probs and ref_log_probs",
            "logprob-level": "no per-token log-probs in the dumps",
            "train-vs-rollout": "no train dump with both log_probs and rollout_log_probs",
            "rewards": "no scalar rewards in the rollout dumps",
        }
        verdict_text = {"logprobs-equal": "step1-ref", "logprob-level": "nll", "train-vs-rollout": "train-rollout"}
        for key in keys:
            line = lines[key]
            if not had[key] and not by_line[key]:
                line.why_not = why[key]
                continue
            line.verdict = _verdict_of(by_line[key])
            line.evidence = _evidence(by_line[key])
            summary = verdicts.get(verdict_text.get(key, ""), "")
            if summary:
                line.evidence.insert(0, summary)
            if not line.evidence:
                line.evidence = [
                    f"{_rel(inputs.dumps, run)}: {checked.get('responses', 0)} responses, "
                    f"{checked.get('rewards', 0)} rewards checked"
                ]
    else:
        for key in keys:
            lines[key].why_not = "no rollout/train dumps (rollout_data/, train_data/) found; pass --dumps"

    # 10. log signals
    line = lines["log-signals"]
    if scan is not None and scan.files:
        codes = {
            "illegal-memory-access": "WC851",
            "worker-crashed": "WC852",
            "nccl-timeout": "WC853",
            "inductor-cache": "WC854",
        }
        found: list[Finding] = []
        for key, code in codes.items():
            hits = scan.hits.get(key, [])
            if hits:
                found.append(
                    _finding(
                        code,
                        f"{hits[0]}" + (f" (+{len(hits) - 1} more)" if len(hits) > 1 else ""),
                        file=hits[0].split(":")[0],
                        lines=hits[:10],
                    )
                )
        result.findings.extend(found)
        line.verdict = _verdict_of(found)
        line.evidence = _evidence(found)
        events = scan.hits.get("weight-sync", [])
        line.evidence.append(f"{len(events)} weight_sync event line(s)" + (f", first {events[0]}" if events else ""))
        line.evidence.append(f"{scan.files} log file(s), {scan.lines} lines read")
        if scan.capped:
            line.evidence.append(f"read only the first {MAX_LOG_BYTES} bytes of {', '.join(scan.capped)}")
    else:
        line.why_not = "no log file found; pass --log (trainer stdout, /tmp/sglang/*.log, ~/.ray/session_latest/logs)"
    if scan is not None and scan.unreadable:
        result.notes.append("logs not read: " + "; ".join(scan.unreadable[:5]))

    ordered = [lines[key] for key, _ in CHECKLIST]
    checked_lines = [x for x in ordered if x.verdict != NOT_CHECKED]
    result.checked = {"checklist lines": len(checked_lines), "not checked": len(ordered) - len(checked_lines)}
    result.notes.extend(inputs.notes)
    if not checked_lines:
        result.nothing_checked = True
    return result, ordered


def _take(result: Result, sub: Result, line: Line, what: str) -> None:
    result.findings.extend(sub.findings)
    if sub.nothing_checked:
        line.why_not = f"{what}: nothing was checked"
        return
    line.verdict = _verdict_of(sub.findings)
    line.evidence = [what, *_evidence(sub.findings)]


def _has_state(records: Path) -> bool:
    """Whether any record of the first sync carries engine-state lines (bounded read of each file's start)."""
    first = _first_sync(records)
    if first is None:
        return False
    from weightcheck.tap.records import sync_dir_name

    for path in sorted((records / sync_dir_name(first)).glob("*.jsonl"))[:64]:
        try:
            fd, _ = safe_io.open_regular(path, str(path))
        except safe_io.UnsafePath:
            continue
        with open(fd, "rb", closefd=True) as handle:
            if b'"t":"state"' in handle.read(64 * 1024 * 1024).replace(b" ", b""):
                return True
    return False


def render_checklist(lines: list[Line], result: Result) -> str:
    mark = {OK: "ok", PROBLEM: "PROBLEM", WARN: "warning", NOT_CHECKED: "not checked", INFO: "info"}
    out = [
        f"weightcheck doctor {result.target}: the step-1 checklist of the slime / miles / Relax debugging guides",
        "",
    ]
    for number, line in enumerate(lines, start=1):
        out.append(f"{number:>2}. [{mark[line.verdict]}] {line.title}")
        for ev in line.evidence:
            out.append(f"      {ev}")
        if line.verdict == NOT_CHECKED:
            out.append(f"      not checked: {line.why_not}")
        elif line.verdict in (PROBLEM, WARN):
            out.append(f"      next: {line.next_step}")
    return "\n".join(out) + "\n"
