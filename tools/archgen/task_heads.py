"""What transformers' task-head and base classes store instead of the causal LM's head: the reward models,
classifiers and embedding models RL and serving engineers lint next to their policies.

A reward model saved as `LlamaForSequenceClassification` holds `score.weight` [num_labels, hidden] and no
`lm_head`; `Qwen3Model` (an embedding model's backbone, as sentence-transformers saves it) holds the decoder
without the `model.` root and without a head; most `*ForQuestionAnswering` classes keep the decoder under
`transformer.`. The generated patterns describe the causal-LM class only, so for each generated model_type
this builds every such class transformers registers (sequence and token classification, question answering,
the base model) on the meta device next to the causal class, puts both through save_pretrained's key steps
(`weightcheck.arch.oracle.saved_shapes`), and records how the task class's names differ: the root the decoder
moved to, the causal modules it drops (the LM head) and the head modules it adds, with shapes as expressions
over the config (`num_labels`, `hidden_size`) kept only when they reproduce the built shapes.

    python scripts/generate_patterns.py --task-heads          # writes patterns/generated/task_heads.json
    python scripts/generate_patterns.py --task-heads --check  # exit 1 when it is stale

Checked against real `save_pretrained` output in tests/test_task_heads.py.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from tools.archgen.tiny import model_class, tiny_config
from weightcheck.patterns import moved_name

NUM_LABELS = 3  # not 1 or 2: a head of 3 rows cannot be mistaken for a bias or for question answering's 2
# transformers' auto mappings, by the kind recorded for the class
TASK_MAPPINGS = {
    "sequence-classification": "MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES",
    "token-classification": "MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING_NAMES",
    "question-answering": "MODEL_FOR_QUESTION_ANSWERING_MAPPING_NAMES",
    "base-model": "MODEL_MAPPING_NAMES",
}


def meta_instance(cls: Any, config: Any) -> Any:
    """`cls` built from `config` on the meta device (an auto class through `from_config`)."""
    import torch

    with torch.device("meta"):
        return cls(config) if not hasattr(cls, "from_config") else cls.from_config(config)


def _shape_expr(shape: tuple[int, ...], hidden: int) -> list[Any] | None:
    """The shape as config expressions: `num_labels`, `hidden_size`, or question answering's literal 2."""
    out: list[Any] = []
    for dim in shape:
        if dim == NUM_LABELS:
            out.append("num_labels")
        elif dim == hidden:
            out.append("hidden_size")
        elif dim == 2:
            out.append(2)
        else:
            return None
    return out


def decoder_root(names: dict[str, Any]) -> str:
    """The first segment of the decoder's layer container, as saved (`model` for `model.layers` and
    `model.language_model.layers`, `language_model` for Llama 4's `language_model.model.layers`, `backbone`
    for Nemotron-H): the subtree a task class keeps and may move."""
    counts: dict[str, int] = {}
    for name in names:
        head, sep, _ = name.partition(".layers.")
        if sep and head:
            root = head.split(".", 1)[0]
            counts[root] = counts.get(root, 0) + 1
    return max(counts, key=lambda r: counts[r]) if counts else "model"


def derive_class(causal: dict[str, tuple[int, ...]], task: dict[str, tuple[int, ...]], old_root: str,
                 hidden: int) -> dict[str, Any] | None:  # fmt: skip
    """How `task` (names -> shapes) differs from `causal`: {"root", "drops", "heads"}; None when no root
    renaming maps the causal decoder into the task class with the same shapes (then nothing is recorded)."""
    if not any(n.startswith(old_root + ".") for n in causal):
        return None
    for new_root in dict.fromkeys((old_root, "", "transformer", "model")):
        mapped = {moved_name(n, old_root, new_root): s for n, s in causal.items()}
        kept = {n: s for n, s in mapped.items() if n in task}
        if any(task[n] != s for n, s in kept.items()):
            continue
        # Only the head may go: every dropped tensor lies outside the causal class's decoder root.
        lost = [n for n in causal if moved_name(n, old_root, new_root) not in task]
        if any(n.startswith(old_root + ".") for n in lost):
            continue
        dropped = sorted({n.rsplit(".", 1)[0] for n in lost})
        # A head is a new top-level module: its first segment is none of the decoder's (or the kept head's).
        tops = {n.split(".", 1)[0] for n in kept}
        heads: dict[str, dict[str, Any]] = {}
        for name in sorted(set(task) - set(mapped)):
            module, _, param = name.rpartition(".")
            if not module or module.split(".", 1)[0] in tops:
                return None  # a new tensor inside the decoder: not a head swap
            heads.setdefault(module, {"params": [], "shapes": {}})
            heads[module]["params"].append(param)
            heads[module]["shapes"][param] = _shape_expr(task[name], hidden)
        return {"from_root": old_root, "root": new_root, "drops": dropped, "heads": heads}
    return None


def derive(model_type: str) -> dict[str, Any]:
    """{class name: {"kind", "root", "drops", "heads"}} for the task and base classes of `model_type`."""
    import transformers
    from transformers.models.auto import modeling_auto

    from weightcheck.arch.oracle import saved_shapes

    logging.getLogger("transformers").setLevel(logging.ERROR)
    config = tiny_config(model_type, "A")
    config.num_labels = NUM_LABELS
    causal_model = meta_instance(model_class(config), config)
    causal = saved_shapes(causal_model)
    old_root = decoder_root(causal)
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    hidden = int(text.hidden_size)
    out: dict[str, Any] = {}
    for kind, mapping in TASK_MAPPINGS.items():
        name = getattr(modeling_auto, mapping).get(model_type)
        if isinstance(name, (list, tuple)):
            name = name[0]
        cls = getattr(transformers, name, None) if isinstance(name, str) else None
        if cls is None or name == type(causal_model).__name__:
            continue
        try:
            task = saved_shapes(meta_instance(cls, config))
        except Exception:  # a class that cannot be built tiny on meta: not recorded
            continue
        found = derive_class(causal, task, old_root, hidden)
        if found is not None:
            out[name] = {"kind": kind, **found}
    return out


def generate(model_types: list[str]) -> dict[str, Any]:
    import transformers

    doc: dict[str, Any] = {"transformers": transformers.__version__, "num_labels_probe": NUM_LABELS, "model_types": {}}
    for model_type in model_types:
        found = derive(model_type)
        if found:
            doc["model_types"][model_type] = found
    return doc


def render(doc: dict[str, Any]) -> str:
    return json.dumps(doc, indent=1, sort_keys=True) + "\n"
