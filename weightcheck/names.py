"""The one model of a tensor name: where its layer id and expert id are, and its template.

Every part of weightcheck that reads a layer or expert id out of a name goes through this module (a test,
tests/test_names.py, fails on a layer/expert-id regex anywhere else in the package). No architecture
knowledge beyond the container words below, which come from the writers' own names:

* layer containers: `layers` (`model.layers.N`, `language_model.model.layers.N`, `backbone.layers.N`,
  MTP `model.mtp.layers.N`, Megatron `decoder.layers.N`, vision `encoder.layers.N`), `h` (GPT-2
  `transformer.h.N`), `blocks` (`transformer.blocks.N`, Qwen-VL `visual.blocks.N`), `layer` (BERT-style
  `encoder.layer.N`);
* expert containers: `experts` (`mlp.experts.N.`, Mixtral `block_sparse_moe.experts.N.`) and Megatron's
  SequentialMLP `local_experts` (`mlp.experts.local_experts.N.`); stacked experts (`mlp.experts.gate_up_proj`,
  3-D) carry no id; Megatron's TE grouped GEMM glues the id to the leaf (`mlp.experts.linear_fc1.weight7`).

DeepSeek's MTP layer is an extra decoder index (`model.layers.61` for 61 decoder layers): the name model
gives its id; whether it is MTP is the config's business (structure.LayerStructure.is_mtp).

Templates. In code a template is a tuple of the literal parts around the id slots
(`("model.layers.", ".mlp.experts.", ".down_proj.weight")`) with the ids as written (`("3", "7")`); names of
one template differ only in those digit runs. Shown to a user, a template is written with `{L}` for the layer
slot and `{E}` for the expert slot: `model.layers.{L}.mlp.experts.{E}.down_proj.weight` (`render`).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable

from weightcheck.lazyregex import LazyRegex
from weightcheck.lightclass import dataclass
from weightcheck.native import lintfast

# A layer or expert id in a tensor name: ASCII digits, at most this many. A longer run (a 5,000-digit
# "layer" would hit Python's int-conversion limit) or a non-ASCII digit (`str.isdigit` accepts `²`, which
# `int` refuses) is not an id: the name is then treated like any other unsplit name.
MAX_ID_DIGITS = 12

LAYER_CONTAINERS = ("layers", "h", "blocks", "layer")
EXPERT_CONTAINERS = ("experts", "local_experts")

# Container names under which decoder blocks live; the first container followed by an id wins.
_LAYER_RE = LazyRegex(r"^(?P<prefix>(?:[^.]+\.)*?(?:layers|h|blocks|layer))\.(?P<idx>\d+)\.(?P<rest>.+)$")
# The last `experts.N.` / `local_experts.N.` with something after it.
_EXPERT_RE = LazyRegex(r"^(?P<head>(?:.+\.)?(?:local_)?experts)\.(?P<idx>\d+)\.(?P<rest>.+)$")
# `experts.<param>` with no id: a stacked (3-D) expert parameter such as `mlp.experts.gate_up_proj`.
_STACKED_RE = LazyRegex(r"(^|\.)experts\.[^.\d][^.]*$")
# Megatron TE grouped GEMM: `mlp.experts.linear_fc1.weight7` (the local expert id glued to the leaf).
_GROUPED_RE = LazyRegex(r"(mlp\.experts\.(?:.+)\.(?:weight|bias))(\d+)$")
# Megatron decoder layers anywhere in a rank's name (`module.module.decoder.layers.3.` / trailing `.layers.3`).
_DECODER_RE = LazyRegex(r"(?:^|(?<=\.))decoder\.layers\.(\d+)(?=\.|$)")

LAYER_SLOT = "{L}"
EXPERT_SLOT = "{E}"


def is_index(text: str) -> bool:
    """True for a name component that is a layer/expert id (`0`, `17`), bounded and ASCII."""
    return 0 < len(text) <= MAX_ID_DIGITS and text.isascii() and text.isdigit()


def parse_index(text: str) -> int | None:
    return int(text) if is_index(text) else None


# ---- layers ------------------------------------------------------------------------------------------


def split_layer(name: str) -> tuple[str, int, str] | None:
    """`model.layers.3.mlp.gate.weight` → (`model.layers`, 3, `mlp.gate.weight`); None outside any layer."""
    i = name.find(".layers.")
    if i > 0:
        idx, _, tail = name[i + 8 :].partition(".")
        if is_index(idx) and tail:
            return name[: i + 7], int(idx), tail
    m = _LAYER_RE.match(name)
    if m and is_index(m["idx"]):
        return m["prefix"], int(m["idx"]), m["rest"]
    return None


def under_prefix(name: str, prefix: str) -> tuple[str, str] | None:
    """(id as written, tail) of a name directly under a known layer container `prefix`; None otherwise.
    `model.layers.3.mlp.gate.weight` under `model.layers` → (`3`, `mlp.gate.weight`)."""
    if not name.startswith(prefix) or name[len(prefix) : len(prefix) + 1] != ".":
        return None
    idx, _, rest = name[len(prefix) + 1 :].partition(".")
    if not rest or not (idx.isascii() and idx.isdigit()):
        return None
    return idx, rest


def layer_tail(name: str, prefix: str, expert_slot: str = "*") -> str | None:
    """The tail of a name under layer container `prefix`, its expert id replaced by `expert_slot`:
    `model.layers.3.mlp.experts.7.w1.weight` under `model.layers` → `mlp.experts.*.w1.weight`."""
    got = under_prefix(name, prefix)
    return None if got is None else expert_wildcard(got[1], expert_slot)


def decoder_layer_span(name: str) -> tuple[int, int] | None:
    """Span of the id in a Megatron rank's `decoder.layers.N` (prefixes such as `module.module.` allowed)."""
    m = _DECODER_RE.search(name)
    return m.span(1) if m else None


# ---- experts -----------------------------------------------------------------------------------------


def split_expert(text: str) -> tuple[str, str, str] | None:
    """`mlp.experts.7.down_proj.weight` → (`mlp.experts`, `7`, `down_proj.weight`): the expert container,
    the id as written and what follows; None when the text holds no `experts.N.` with something after it.
    Works on whole names and on layer tails alike."""
    if "experts." not in text:
        return None
    m = _EXPERT_RE.match(text)
    if m is None or not is_index(m["idx"]):
        return None
    return m["head"], m["idx"], m["rest"]


def split_expert_module(module: str) -> tuple[str, str, str] | None:
    """`split_expert` for a module path, whose expert id may end it: `mlp.experts.7` → (`mlp.experts`, `7`, ``)."""
    got = split_expert(module + ".#")  # a sentinel segment so an id at the end still has something after it
    return None if got is None else (got[0], got[1], got[2][:-2])


def expert_id(text: str) -> int | None:
    got = split_expert(text)
    return int(got[1]) if got else None


def expert_wildcard(text: str, slot: str = "*") -> str:
    """The text with its expert id replaced by `slot` (`mlp.experts.*.down_proj`); unchanged without one."""
    got = split_expert(text)
    if got is None:
        return text
    return f"{got[0]}.{slot}.{got[2]}"


def is_stacked_expert(text: str) -> bool:
    """`mlp.experts.gate_up_proj` (experts stacked in one tensor, no id in the name)."""
    return "experts." in text and _STACKED_RE.search(text) is not None


def stacked_expert_tail(name: str) -> str | None:
    """`experts.<param...>` of a name whose last `.experts.` is not followed by an id (a stacked expert
    tensor: `model.layers.0.mlp.experts.gate_up_proj` → `experts.gate_up_proj`); None otherwise."""
    if ".experts." not in name:
        return None
    rest = name.rsplit(".experts.", 1)[1]
    return None if rest.split(".", 1)[0].isdigit() else "experts." + rest


def in_experts(name: str) -> bool:
    """The name lies under an `experts` container (per-expert, stacked or an engine's fused parameter)."""
    return name.startswith("experts.") or ".experts." in name


def engine_fused_expert(name: str) -> str | None:
    """`13` / `2` for an SGLang/vLLM fused-MoE parameter (`mlp.experts.w13_weight`, `experts.w2_weight_scale`)."""
    head, sep, leaf = name.rpartition("experts.")
    if not sep or (head and not head.endswith(".")):
        return None
    for which in ("13", "2"):
        if leaf.startswith(f"w{which}_"):
            return which
    return None


def grouped_expert_span(name: str) -> tuple[int, int] | None:
    """Span of the local expert id of a Megatron TE grouped-GEMM name (`mlp.experts.linear_fc1.weight7`)."""
    m = _GROUPED_RE.search(name)
    return m.span(2) if m else None


def sequential_expert_span(name: str) -> tuple[int, int] | None:
    """Span of the local expert id of a Megatron SequentialMLP name (`mlp.experts.local_experts.7.`)."""
    i = name.find("mlp.experts.local_experts.")
    if i < 0:
        return None
    start = i + len("mlp.experts.local_experts.")
    end = start
    while end < len(name) and name[end].isascii() and name[end].isdigit():
        end += 1
    if end == start or (end < len(name) and name[end] != "."):
        return None
    return start, end


# ---- segment-wise reading (diff and compare, which meet names of any writer) -----------------------
# diff and its mismatch classifier read a name segment by segment: a number is a layer id when the word
# before it is a layer word. They read a few more words than the container split above: `block` (T5's
# `encoder.block.N`, which the container split must not take, since its layers are `block.N.layer.M`), and
# for classifying an index, Megatron's `decoder_layers` and MTP's `mtp.N`.
SEGMENT_LAYER_WORDS = frozenset({*LAYER_CONTAINERS, "block"})
SEGMENT_LAYER_LIKE_WORDS = SEGMENT_LAYER_WORDS | {"decoder_layers", "mtp"}
SEGMENT_EXPERT_WORDS = frozenset({"experts", "expert", "local_experts"})


def _segment_layer_pos(parts: list[str]) -> int | None:
    for i, part in enumerate(parts[:-1]):
        if part in SEGMENT_LAYER_WORDS and is_index(parts[i + 1]):
            return i + 1
    return None


def segment_layer(name: str) -> int | None:
    """The first `<layer word>.<id>` of a name, read segment by segment (`encoder.block.3.x` → 3)."""
    parts = name.split(".")
    pos = _segment_layer_pos(parts)
    return None if pos is None else int(parts[pos])


def segment_layer_wildcard(name: str) -> str:
    """The name with that layer id replaced by `*`."""
    parts = name.split(".")
    pos = _segment_layer_pos(parts)
    if pos is not None:
        parts[pos] = "*"
    return ".".join(parts)


def index_kind(word: str) -> str:
    """What the number after `word` indexes: `layer`, `expert` or a plain `index`."""
    return "layer" if word in SEGMENT_LAYER_LIKE_WORDS else "expert" if word in SEGMENT_EXPERT_WORDS else "index"


# ---- the typed parse ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Name:
    """One tensor name taken apart. `module` is the path from the name's start to the leaf's owner."""

    name: str
    prefix: str | None  # layer container: `model.layers`, `transformer.h`; None outside any layer
    layer: int | None
    expert_head: str | None  # expert container, relative to the layer (`mlp.experts`) or the name
    expert: int | None
    module: str  # `model.layers.3.mlp.experts.7.down_proj`
    leaf: str  # `weight`

    @property
    def tail(self) -> str:
        """The part after the layer id (`mlp.experts.7.down_proj.weight`); the whole name outside layers."""
        if self.prefix is None:
            return self.name
        return self.name[len(self.prefix) + 1 :].partition(".")[2]


def parse(name: str) -> Name:
    module, _, leaf = name.rpartition(".")
    split = split_layer(name)
    if split is None:
        prefix, layer, tail = None, None, name
    else:
        prefix, layer, tail = split
    got = split_expert(tail)
    head, expert = (got[0], int(got[1])) if got else (None, None)
    return Name(name, prefix, layer, head, expert, module, leaf)


# ---- templates ---------------------------------------------------------------------------------------
# `model.layers.3.mlp.experts.7.down_proj` is the template `model.layers.{L}.mlp.experts.{E}.down_proj` with
# the ids ("3", "7"). Names of one template differ only in those digit runs, so a question whose answer
# cannot depend on them (or only on their lengths) is answered once per template instead of once per name.

Template = tuple[str, ...]  # literal parts around the id slots: ("model.layers.", ".mlp.experts.", ".down_proj")


def _tail_template(tail: str) -> tuple[str, str, str] | None:
    """`mlp.experts.7.down_proj` → (`mlp.experts.`, `7`, `.down_proj`), as `split_expert` finds the id."""
    em = _EXPERT_RE.match(tail) if "experts." in tail else None
    if em is None:
        return None
    start = len(em["head"]) + 1
    end = start + len(em["idx"])
    value = tail[start:end]
    # Any ASCII digit run is a slot here (not only a bounded id): grouping stays exact either way.
    return (tail[:start], value, tail[end:]) if value.isascii() else None


def name_template(
    name: str, _tails: dict[str, tuple[str, str, str] | None] | None = None
) -> tuple[Template, tuple[str, ...]]:
    """(template parts, slot values as written) of a name; a name outside any layer is its own template.
    Slots are the layer id (as `split_layer` finds it) and the expert id (as `split_expert` does)."""
    split = split_layer(name)
    if split is None:
        return (name,), ()
    start = len(split[0]) + 1
    end = name.find(".", start)
    layer = name[start:end]
    tail = split[2]
    if _tails is None:
        got = _tail_template(tail)
    else:
        got = _tails.get(tail, False)
        if got is False:
            got = _tails[tail] = _tail_template(tail)
    if got is None:
        return (name[:start], name[end:]), (layer,)
    return (name[:start], "." + got[0], got[2]), (layer, got[1])


def group_by_template(names: Iterable[str]) -> dict[Template, list[tuple[str, tuple[str, ...]]]]:
    """Names grouped by template, each with its slot values."""
    groups: dict[Template, list[tuple[str, tuple[str, ...]]]] = defaultdict(list)
    tails: dict[str, tuple[str, str, str] | None] = {}

    def new_group(head: str, tail: str) -> tuple[list[tuple[str, tuple[str, ...]]], str | None]:
        """The group of `<head>.layers.<id>.<tail>` names and their expert id (None: no expert slot), asked
        once per (head, tail) pair by either loop below."""
        got = tails.get(tail, False)
        if got is False:
            got = tails[tail] = _tail_template(tail)
        if got is None:
            return groups[(head + ".layers.", "." + tail)], None
        return groups[(head + ".layers.", "." + got[0], got[2])], got[1]

    def other(name: str) -> None:
        parts, values = name_template(name, tails)
        groups[parts].append((name, values))

    fast = lintfast()
    if fast is not None:
        # The loop below in C (weightcheck/_native/lintfast.c): it asks `new_group` for each new (head, tail)
        # pair and hands every name off the `<head>.layers.<digits>.<tail>` path to `other`.
        fast.group_names(names, new_group, other)
        return groups
    # what precedes the first `.layers.` -> tail -> (append to the template's list, expert id or None): a name
    # whose head and tail were seen costs two lookups, no new key strings (this loop runs once per name).
    seen: dict[str, dict[str, tuple[Callable[[tuple[str, tuple[str, ...]]], None], str | None]]] = {}
    for name in names:
        # Inlined fast path of name_template for `<prefix>.layers.<i>.<tail>` (most names of a checkpoint):
        # two partitions make the pieces (head, id, tail) without slicing the name twice, and the head keys
        # `seen` (the template's prefix, head + ".layers.", is made only when a new tail is met).
        head, sep, rest = name.partition(".layers.")
        if head and sep:
            idx, _, tail = rest.partition(".")
            if tail and idx.isascii() and idx.isdigit():
                per = seen.get(head)
                if per is None:
                    per = seen[head] = {}
                hit = per.get(tail)
                if hit is None:
                    members, expert = new_group(head, tail)
                    hit = per[tail] = (members.append, expert)
                append, expert = hit
                append((name, (idx,) if expert is None else (idx, expert)))
                continue
        other(name)
    return groups


def expand_template(parts: Template, values: tuple[str, ...]) -> str:
    out = [parts[0]]
    for value, part in zip(values, parts[1:], strict=True):
        out += [value, part]
    return "".join(out)


def last_segments_fixed(parts: Template, segments: int) -> bool:
    """True when the last `segments` dotted segments of a name (and the dot before them) are the same for
    every name of the template: they lie in its literal end, so a question about them is answered once."""
    return len(parts) == 1 or parts[-1].count(".") >= segments


def render(parts: Template) -> str:
    """A template as shown to users: `model.layers.{L}.mlp.experts.{E}.down_proj.weight`."""
    slots = (LAYER_SLOT, EXPERT_SLOT)
    return expand_template(parts, slots[: len(parts) - 1])


def template_text(name: str) -> str:
    """A name's template as shown to users (`model.layers.{L}.mlp.experts.{E}.w1.weight`); the name itself
    outside any layer."""
    return render(name_template(name)[0])


def with_ids(name: str, layer: int | None = None, expert: int | None = None) -> str:
    """The name with its layer id and/or expert id replaced (`with_ids(n, layer=5)`); unchanged where the
    name has no such slot."""
    parts, values = name_template(name)
    new = list(values)
    if layer is not None and new:
        new[0] = str(layer)
    if expert is not None and len(new) > 1:
        new[1] = str(expert)
    return expand_template(parts, tuple(new))


# ---- PEFT adapters ---------------------------------------------------------------------------------------
# PEFT's `save_pretrained` writes a LoRA adapter's tensors under the wrapper path `base_model.model.` + the
# base model's module path (PeftModel.base_model is the LoraModel, whose `.model` is the base model), with the
# adapter's name taken out: `base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight`. vLLM strips
# the prefix when it maps them (`parse_fine_tuned_lora_name`); the doubled `model.model.` is PEFT's, not a
# writer's bug.
PEFT_PREFIX = "base_model.model."
# The LoRA factor leaves, as PEFT names them, each with its partner: Linear/Conv `lora_A.weight`/`lora_B.weight`
# (`lora_B.bias` with lora_bias), Embedding `lora_embedding_A`/`lora_embedding_B`; DoRA's `lora_magnitude_vector`
# has no pair.
LORA_FACTORS = {
    "lora_A.weight": "lora_B.weight",
    "lora_B.weight": "lora_A.weight",
    "lora_embedding_A": "lora_embedding_B",
    "lora_embedding_B": "lora_embedding_A",
}


# The parameter-name prefixes of PEFT's tuners (LoRA/AdaLoRA `lora_`, LoHa `hada_`, LoKr `lokr_`, IA3 `ia3_`,
# VeRA `vera_`, OFT/BOFT, ...): a segment starting with one is an adapter parameter, not a base-model weight
# (`modules_to_save` copies keep the base names).
PEFT_TUNER_PREFIXES = ("lora_", "hada_", "lokr_", "ia3_", "vera_", "oft_", "boft_", "fourierft_", "vblora_", "hra_",
                       "bone_", "randlora_", "shira_", "c3a_", "miss_", "road_")  # fmt: skip


def adapter_factor(name: str) -> tuple[str, str] | None:
    """(module, adapter leaf) of a PEFT adapter parameter (`...q_proj`, `lora_B.weight`; `...q_proj`,
    `hada_w2_a`); None for any other name."""
    start = 0
    while True:
        if name.startswith(PEFT_TUNER_PREFIXES, start):
            return name[: start - 1] if start else "", name[start:]
        dot = name.find(".", start)
        if dot < 0:
            return None
        start = dot + 1


def lora_factor(name: str) -> tuple[str, str] | None:
    """(module, factor leaf) of a LoRA factor tensor (`...q_proj`, `lora_A.weight`); None for any other name."""
    for leaf in LORA_FACTORS:
        if name.endswith(leaf) and name[-len(leaf) - 1 : -len(leaf)] == ".":
            return name[: -len(leaf) - 1], leaf
    return None
