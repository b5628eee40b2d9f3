"""Comparison policy: which tier (and threshold) applies to which tensor, chosen by a pattern on its name.

A policy is an ordered list of rules; the first rule whose pattern matches the tensor's logical name in
checkpoint A wins. Patterns follow the one user-pattern syntax (`weightcheck.userpattern`): a glob or
`re:REGEX`, matching the whole name; a bare pattern without a glob wildcard keeps the format's older reading,
a regex searched anywhere in the name (`\\.experts\\.`, `bias$`, `lm_head`). User rules (`--policy FILE`) come
before the built-in ones, so they can override them. The built-in rules end with one that takes any name
(`auto`): every tensor is compared. With `--no-default-policy` only the user's rules apply, and a tensor that
matches none of them is an error (WC716), never a silent pass.

File format, one rule per line (`#` starts a comment):

    <pattern>  <tier>  [key=value ...]

    *.mlp.experts.*            ulp   ulps=2
    re:lm_head\\.weight        stat  rel_l2=0.25 sqnr_db=12
    *.bias                     exact
    \\.mlp\\.experts\\.        ulp   ulps=2      (older form: a regex searched in the name)

Tiers:

- `exact`: bit-for-bit (same dtype) or value equality after a lossless upcast (bf16 vs f32); for two
  quantized tensors of one format, every stored part bit-for-bit. NaN never equals anything.
- `ulp` (`ulps=N`, default 1): per element `|a − b| <= N·(ulp_a + ulp_b)` in dequantized space, where a
  side's ULP is one step of its stored format (one INT step × scale, one FP8/FP4 ULP × scale, one
  bf16 ULP...). For "both sides quantized from one source" or "one side is a rounding of the other".
- `stat` (`rel_l2=`, `sqnr_db=`, `cosine=`, `max_abs=`): aggregate statistics for declared-lossy pairs
  (a GPTQ checkpoint vs its bf16 source, where error compensation moves elements by more than a step).
  Without thresholds, bands by format apply (FP8 rel-L2 ≤ 0.05, INT4 ≤ 0.25, ...; see `STAT_BANDS`).
- `auto`: exact for same or losslessly widened dtypes, stored-parts-exact-then-ulp for quantized tensors,
  ulp for lossy float casts.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from weightcheck import safe_io
from weightcheck.userpattern import PatternSyntaxError, policy_pattern

TIERS = ("auto", "exact", "ulp", "stat")
_STAT_KEYS = ("rel_l2", "sqnr_db", "cosine", "max_abs")

# Statistical bands used by `stat` rules without explicit thresholds, keyed by the quantized side's
# format family (round-to-nearest error on N(0, 0.02) weights, with margin). Calibrate on
# real checkpoints before relying on them.
STAT_BANDS: dict[str, float] = {"fp8": 0.05, "int8": 0.02, "int4": 0.25, "fp4": 0.3, "int": 0.5, "cast": 0.01}

DEFAULT_POLICY_TEXT = r"""
# Built-in policy, after any --policy rules. Names are logical: a quantized module's weight is `P.weight`.
(^|\.)(weight|bias)$                                      auto
\.(e_score_correction_bias|expert_bias|A_log|D|dt_bias)$  auto
# Activation and KV-cache quantization parameters (input_scale, k_scale, ...).
(^|\.)(input|output|q|k|v)_(scale|zero_point|global_scale)$  auto
# Quantization companions not folded into a weight (their weight is missing or malformed).
_(scale|scale_inv|scale_2|zero_point|global_scale|g_idx|shape|packed)$  auto
# Fused 3-D experts (transformers v5 save_original_format=False): no `.weight` suffix.
\.experts\.(gate_up_proj|down_proj|gate_proj|up_proj)(_bias)?$  auto
# Any other stored tensor (gpt-oss's attention sinks, SigLIP's probe and in_proj_weight, RWKV's time_* and
# MiniMax's decay parameters, a rotary inv_freq buffer saved with the weights): compared as stored, never skipped.
.+                                                        auto
"""


class PolicyError(ValueError):
    """A policy file that cannot be parsed; the message names the line."""


@dataclass(frozen=True)
class PolicyRule:
    pattern: str
    tier: str
    ulps: float = 1.0
    rel_l2: float | None = None
    sqnr_db: float | None = None
    cosine: float | None = None
    max_abs: float | None = None
    source: str = "built-in"

    def matches(self, name: str) -> bool:
        return policy_pattern(self.pattern).matches(name)

    def describe(self) -> str:
        extra = ""
        if self.tier == "ulp":
            extra = f" ulps={self.ulps:g}"
        elif self.tier == "stat":
            extra = "".join(f" {k}={getattr(self, k):g}" for k in _STAT_KEYS if getattr(self, k) is not None)
        return f"{self.pattern} {self.tier}{extra} ({self.source})"

    @property
    def has_thresholds(self) -> bool:
        return any(getattr(self, k) is not None for k in _STAT_KEYS)


def parse_policy(text: str, source: str = "policy") -> list[PolicyRule]:
    """Parse policy rules (see the module doc). Raises PolicyError with `source:line` on bad input."""
    rules: list[PolicyRule] = []
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if " #" in line:
            line = line[: line.index(" #")].rstrip()
        if not line or line.startswith("#"):
            continue
        where = f"{source}:{number}"
        fields = line.split()
        if len(fields) < 2:
            raise PolicyError(f"{where}: expected `<regex> <tier> [key=value ...]`, got {raw.strip()!r}")
        pattern, tier, options = fields[0], fields[1].lower(), fields[2:]
        try:
            policy_pattern(pattern)
        except PatternSyntaxError as exc:
            raise PolicyError(f"{where}: {exc}") from None
        if tier not in TIERS:
            raise PolicyError(f"{where}: unknown tier {tier!r} (choose from {', '.join(TIERS)})")
        values: dict[str, float] = {}
        for option in options:
            key, sep, value = option.partition("=")
            allowed = {"ulp": ("ulps",), "stat": _STAT_KEYS}.get(tier, ())
            if not sep or key not in allowed:
                hint = ", ".join(allowed) if allowed else "none"
                raise PolicyError(f"{where}: option {option!r} not valid for tier {tier} (valid: {hint})")
            try:
                number_value = float(value)
            except ValueError:
                raise PolicyError(f"{where}: {key} must be a number, got {value!r}") from None
            if key == "ulps" and not number_value > 0:
                raise PolicyError(f"{where}: ulps must be positive")
            values[key] = number_value
        rules.append(PolicyRule(pattern=pattern, tier=tier, source=where, **values))  # type: ignore[arg-type]
    return rules


def load_policy(path: str | Path) -> list[PolicyRule]:
    try:
        text = safe_io.read_text(path)  # an option file: a regular file, bounded (a FIFO would hang)
    except safe_io.UnsafePath as exc:
        raise PolicyError(f"cannot read policy {path}: {exc}") from None
    return parse_policy(text, source=str(path))


DEFAULT_RULES: tuple[PolicyRule, ...] = tuple(parse_policy(DEFAULT_POLICY_TEXT, source="built-in"))


@dataclass(frozen=True)
class Policy:
    rules: tuple[PolicyRule, ...] = DEFAULT_RULES

    @classmethod
    def with_user_rules(cls, user: list[PolicyRule], *, include_default: bool = True) -> Policy:
        return cls(tuple(user) + (DEFAULT_RULES if include_default else ()))

    def rule_for(self, name: str) -> PolicyRule | None:
        for rule in self.rules:
            if rule.matches(name):
                return rule
        return None
