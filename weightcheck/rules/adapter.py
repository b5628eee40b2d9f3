"""WC433, WC502: PEFT LoRA adapters (adapter_config.json + adapter_model.safetensors).

A LoRA module stores two factors: `lora_A` (`[r, in]`; Embedding `lora_embedding_A`, `[r, num_embeddings]`)
and `lora_B` (`[out, r]`; `lora_embedding_B`, `[embedding_dim, r]`). PEFT builds each module with the rank
adapter_config.json gives it (`r`, or the `rank_pattern` entry that matches the module) and then loads the
tensors: a factor of another rank fails there with a size mismatch, and a factor that is absent keeps its
initialisation (`lora_B` starts at zero, so the module's update silently vanishes; PEFT only warns "Found
missing adapter keys"). Both rules run only on a PEFT adapter folder and read headers only. The adapter_config.json
values no loader can use (`adapter_config_problems`) are reported by WC107, which checks every folder's config."""

from __future__ import annotations

from weightcheck.collapse import summarize
from weightcheck.findings import Severity
from weightcheck.names import LORA_FACTORS, PEFT_PREFIX, lora_factor
from weightcheck.rules import LintContext, rule

TYPE_CHECKING = False
if TYPE_CHECKING:
    from weightcheck.safetensors_header import TensorInfo


def _factors(ctx: LintContext) -> dict[str, dict[str, TensorInfo]]:
    """module -> {factor leaf: header entry} for every LoRA factor of an adapter ({} for a model checkpoint)."""

    def build() -> dict[str, dict[str, TensorInfo]]:
        out: dict[str, dict[str, TensorInfo]] = {}
        if ctx.ckpt.peft_adapter() is None:
            return out
        for name, info in ctx.ckpt.all_tensors().items():
            got = lora_factor(name)
            if got is not None:
                out.setdefault(got[0], {})[got[1]] = info
        return out

    return ctx.memo("lora-factors", build)


def _shown(module: str) -> str:
    return module.removeprefix(PEFT_PREFIX)


@rule(
    "WC433",
    "lora-factor-missing",
    Severity.ERROR,
    summary="A LoRA module of a PEFT adapter stores one factor (lora_A or lora_B) without the other.",
    bad="base_model.model.model.layers.3.self_attn.q_proj.lora_A.weight stored, its lora_B.weight absent",
    good="Every module with a lora_A.weight also has its lora_B.weight (lora_embedding_A with lora_embedding_B).",
    fix="re-save the adapter from the trained PeftModel (save_pretrained writes both factors of every module)",
)
def lora_factor_missing(ctx: LintContext) -> None:
    """PEFT loads an adapter with `strict=False`: a factor that is not in the file keeps its initialisation,
    and `lora_B` is initialised to zeros, so the module's trained update is silently gone (PEFT warns "Found
    missing adapter keys", `peft_model.py`); an orphan `lora_B` multiplies a random `lora_A`. Converters that
    rename or filter tensors by pattern drop one factor when the pattern matches only `lora_A` or `lora_B`."""
    lacking: dict[str, list[str]] = {}
    for module, factors in _factors(ctx).items():
        for leaf in factors:
            partner = LORA_FACTORS[leaf]
            if partner not in factors:
                lacking.setdefault(partner, []).append(f"{module}.{leaf}")
    for partner, names in sorted(lacking.items()):
        ctx.report(
            f"{len(names)} LoRA factor(s) stored without their {partner}: {summarize([_shown(n) for n in names])}",
            tensor=summarize(names, limit=3),
            count=len(names),
        )


@rule(
    "WC502",
    "lora-rank-mismatch",
    Severity.ERROR,
    summary="A LoRA module's factors disagree on the rank, or have a rank adapter_config.json does not give.",
    bad="adapter_config.json r = 16; q_proj.lora_A.weight [8, 4096], q_proj.lora_B.weight [4096, 8]",
    good="lora_A.weight [r, in] and lora_B.weight [out, r] with r from adapter_config.json (or its rank_pattern)",
    fix="re-save the adapter with its adapter_config.json (r and rank_pattern as the adapter was trained), or "
    "set r / rank_pattern to the rank the factors hold",
)
def lora_rank_mismatch(ctx: LintContext) -> None:
    """PEFT creates every LoRA module with the rank adapter_config.json gives it (`r`, or the matching
    `rank_pattern` entry) before it loads the tensors, and a factor of another rank is a size mismatch at load.
    Checked: `lora_A`'s rows equal `lora_B`'s columns (any module kind: Linear, Embedding, Conv); and, for a
    LoRA adapter without `target_parameters` (whose expert factors hold `r` x experts rows), that the rank is
    `r` or one of `rank_pattern`'s values. Which `rank_pattern` key matches which module is PEFT's regex
    business: a rank that is none of those values is wrong for every reading."""
    factors = _factors(ctx)
    if not factors:
        return
    adapter = ctx.ckpt.peft_adapter() or {}
    disagree: list[str] = []
    ranks: dict[int, list[str]] = {}
    for module, held in sorted(factors.items()):
        a = held.get("lora_A.weight") or held.get("lora_embedding_A")
        b = held.get("lora_B.weight") or held.get("lora_embedding_B")
        if a is None or b is None or len(a.shape) < 2 or len(b.shape) < 2:
            continue  # an orphan is WC433's; a 1-D factor is not a LoRA matrix
        if a.shape[0] != b.shape[1]:
            disagree.append(f"{_shown(module)} (A {list(a.shape)}, B {list(b.shape)})")
        else:
            ranks.setdefault(a.shape[0], []).append(module)
    if disagree:
        ctx.report(
            f"{len(disagree)} LoRA module(s) whose lora_A rows differ from their lora_B columns: "
            f"{', '.join(disagree[:5])}{' …' if len(disagree) > 5 else ''}",
            count=len(disagree),
        )
    r, pattern = adapter.get("r"), adapter.get("rank_pattern") or {}
    if (
        adapter.get("peft_type") != "LORA"
        or adapter.get("target_parameters")
        or not _is_rank(r)
        or not isinstance(pattern, dict)
        or not all(_is_rank(v) for v in pattern.values())
    ):
        return
    allowed = {r, *pattern.values()}
    for rank, modules in sorted(ranks.items()):
        if rank in allowed:
            continue
        given = f"r = {r}" + (f" and rank_pattern values {sorted(set(pattern.values()))}" if pattern else "")
        ctx.report(
            f"{len(modules)} LoRA module(s) hold rank {rank}, but adapter_config.json gives {given}: PEFT builds "
            f"them with another rank and refuses the tensors at load: {summarize([_shown(m) for m in modules])}",
            tensor=summarize([f"{m}.lora_A.weight" for m in modules], limit=3),
            file="adapter_config.json",
            count=len(modules),
        )


def _is_rank(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _as_json(value: object, limit: int = 60) -> str:
    """A config value as JSON writes it (`null`, `true`, `"8"`), cut to `limit` characters."""
    import json

    try:
        text = json.dumps(value, default=str)
    except (ValueError, TypeError, RecursionError):
        text = str(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value == value


def adapter_config_problems(adapter: dict[str, object]) -> list[tuple[Severity, str]]:
    """Values of a PEFT adapter_config.json that its loaders cannot use (PEFT 0.21's `PeftModel.from_pretrained`
    refuses each; vLLM's `PEFTHelper` and SGLang read `r` and `lora_alpha` too: scaling is `lora_alpha / r`).

    Errors where every loader fails: a `peft_type` PEFT cannot know (its types are upper-case names: `lora`,
    null and numbers are a KeyError in `PeftConfig.from_pretrained`), and for LoRA an `r` that is not a positive
    integer or an `lora_alpha` that is not a number. Warnings naming PEFT for what only its loader reads:
    `rank_pattern` / `alpha_pattern` given but not an object of ranks / numbers (PEFT calls `.keys()` on them and
    builds those modules with their values), `target_modules` not a string or a list of strings. A key left out
    is PEFT's default (a `null` pattern is not: LoRA's loader calls `.keys()` on it)."""
    problems: list[tuple[Severity, str]] = []
    peft_type = adapter.get("peft_type")
    if not (isinstance(peft_type, str) and peft_type and peft_type.replace("_", "").isalnum() and peft_type.isupper()):
        problems.append((Severity.ERROR, f"peft_type {_as_json(peft_type, 40)} is not a PEFT type (upper-case, as "
                         "`LORA`): PEFT's from_pretrained cannot pick a config class for it"))  # fmt: skip
        return problems
    if peft_type != "LORA":
        return problems
    if "r" in adapter and not _is_rank(adapter["r"]):
        problems.append((Severity.ERROR, f"r is {_as_json(adapter['r'], 40)}, not a positive integer: every LoRA "
                         "loader sizes the factors with it (PEFT: \"`r` should be a positive integer\")"))  # fmt: skip
    if "lora_alpha" in adapter and not _number(adapter["lora_alpha"]):
        problems.append((Severity.ERROR, f"lora_alpha is {_as_json(adapter['lora_alpha'], 40)}, not a number: the "
                         "scaling lora_alpha / r cannot be computed"))  # fmt: skip
    patterns = (("rank_pattern", _is_rank, "positive integer ranks"), ("alpha_pattern", _number, "numbers"))
    for key, valid, what in patterns:
        if key not in adapter:
            continue
        value = adapter[key]
        if not isinstance(value, dict) or not all(valid(v) for v in value.values()):
            problems.append((Severity.WARNING, f"{key} is {_as_json(value)}, not an object of {what}: PEFT's "
                             "loader refuses it"))  # fmt: skip
    targets = adapter.get("target_modules")
    if targets is not None and not (
        isinstance(targets, str) or (isinstance(targets, list) and all(isinstance(t, str) for t in targets))
    ):
        problems.append((Severity.WARNING, f"target_modules is {_as_json(targets)}, not a module name pattern or "
                         "a list of module names: PEFT's loader refuses it"))  # fmt: skip
    elif targets == [] and not adapter.get("target_parameters"):
        problems.append((Severity.WARNING, "target_modules is an empty list and there are no target_parameters: "
                         "PEFT's loader finds nothing to adapt and refuses it"))  # fmt: skip
    return problems
