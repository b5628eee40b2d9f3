"""Reward models, classifiers and embedding backbones: the task-head and base classes of a generated model_type
(`LlamaForSequenceClassification`, `Qwen3Model`, ...) as transformers' own save_pretrained writes them.

They were false errors: the patterns describe the causal LM, so a clean reward model was "no lm_head.weight"
(WC407) + "lm_head.weight missing" (WC410) + "score.weight unexpected" (WC411), and a `Qwen3Model` save (no
`model.` root) had every weight "missing". `patterns/generated/task_heads.json` (tools/archgen/task_heads.py)
records, per class, the root its decoder moves to, the LM head it drops and the head it adds; here real saves of
those classes lint clean, each with a bad twin that is still named, and (oracle group) every class in the table
is built on the meta device and linted clean."""

from __future__ import annotations

import json
import logging
import shutil
import warnings
from pathlib import Path
from typing import Any

import pytest
from factories import edit_tensors
from helpers import by_code, run

from weightcheck.findings import Severity
from weightcheck.patterns import detect_pattern, task_heads_index

transformers = pytest.importorskip("transformers")
logging.getLogger("transformers").setLevel(logging.ERROR)

TINY = dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, vocab_size=128, intermediate_size=128,
            num_hidden_layers=2)  # fmt: skip
# name -> (class, config class, config arguments): what RL and serving engineers bring beside their policies
CASES: dict[str, tuple[str, str, dict[str, Any]]] = {
    "llama-reward": ("LlamaForSequenceClassification", "LlamaConfig", dict(num_labels=1, pad_token_id=0)),
    "qwen2-reward": ("Qwen2ForSequenceClassification", "Qwen2Config", dict(num_labels=1, pad_token_id=0)),
    "qwen3-classifier-tied": ("Qwen3ForSequenceClassification", "Qwen3Config",
                              dict(head_dim=16, num_labels=5, pad_token_id=0, tie_word_embeddings=True)),
    "qwen3-moe-reward": ("Qwen3MoeForSequenceClassification", "Qwen3MoeConfig",
                         dict(head_dim=16, moe_intermediate_size=32, num_experts=4, num_experts_per_tok=2,
                              num_labels=1, pad_token_id=0)),
    "mistral-token-classifier": ("MistralForTokenClassification", "MistralConfig", dict(num_labels=3)),
    "llama-question-answering": ("LlamaForQuestionAnswering", "LlamaConfig", {}),
    "qwen3-embedding-backbone": ("Qwen3Model", "Qwen3Config", dict(head_dim=16)),
    "llama-backbone": ("LlamaModel", "LlamaConfig", {}),
}  # fmt: skip


def _save(name: str, path: Path) -> Path:
    import torch

    cls, cfg_cls, extra = CASES[name]
    torch.manual_seed(0)
    model = getattr(transformers, cls)(getattr(transformers, cfg_cls)(**TINY, **extra))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("task-heads")
    return {name: _save(name, root / name) for name in CASES}


def _copy(saved: dict[str, Path], name: str, dest: Path) -> Path:
    return Path(shutil.copytree(saved[name], dest))


def _loud(path: Path) -> list[str]:
    return [f"{f.code} {f.message}" for f in run(path).findings if f.severity >= Severity.WARNING]


@pytest.mark.parametrize("name", sorted(CASES))
def test_clean_task_and_base_classes_lint_clean(saved: dict[str, Path], name: str) -> None:
    path = saved[name]
    cfg = json.loads((path / "config.json").read_text())
    assert cfg["architectures"] == [CASES[name][0]]
    pattern = detect_pattern(cfg)
    assert pattern is not None and pattern.task_class == CASES[name][0] and not pattern.unvalidated
    assert _loud(path) == []
    assert run(path).exit_code() == 0


def test_reward_model_without_its_score_head_is_an_error(saved: dict[str, Path], tmp_path: Path) -> None:
    """The bad twin: a converter that kept only the decoder. The score head is what the reward is read from."""
    path = _copy(saved, "llama-reward", tmp_path / "a")
    edit_tensors(path, lambda tensors: tensors.pop("score.weight"))
    found = by_code(run(path), "WC410")
    assert len(found) == 1 and found[0].severity == Severity.ERROR and "score.weight" in found[0].message


def test_score_head_of_another_label_count_is_a_shape_error(saved: dict[str, Path], tmp_path: Path) -> None:
    """config.json says 2 labels while the head holds 1 row (a config copied from another run): transformers
    refuses the tensor at load (a mismatched size, unless told `ignore_mismatched_sizes`)."""
    path = _copy(saved, "llama-reward", tmp_path / "a")
    cfg_path = path / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg_path.write_text(json.dumps({**cfg, "id2label": {"0": "a", "1": "b"}, "label2id": {"a": 0, "b": 1}}))
    found = by_code(run(path), "WC501")
    assert len(found) == 1 and "score.weight" in found[0].message and "[2, 64]" in found[0].message
    with pytest.raises(RuntimeError, match="ignore_mismatched_sizes"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        transformers.AutoModelForSequenceClassification.from_pretrained(path)


def test_backbone_with_a_lost_layer_weight_is_an_error(saved: dict[str, Path], tmp_path: Path) -> None:
    path = _copy(saved, "qwen3-embedding-backbone", tmp_path / "a")
    edit_tensors(path, lambda tensors: tensors.pop("layers.1.mlp.down_proj.weight"))
    found = by_code(run(path), "WC410")
    assert found and found[0].severity == Severity.ERROR and "layers.1.mlp.down_proj.weight" in found[0].message


def test_causal_lm_without_its_head_is_still_an_error(saved: dict[str, Path], tmp_path: Path) -> None:
    """The same reward model's weights under a causal-LM config (the head is what the class needs): WC407 and
    WC410 as before; the task classes did not loosen the causal check."""
    path = _copy(saved, "llama-reward", tmp_path / "a")
    cfg_path = path / "config.json"
    cfg_path.write_text(json.dumps({**json.loads(cfg_path.read_text()), "architectures": ["LlamaForCausalLM"]}))
    result = run(path)
    assert by_code(result, "WC407") and any("lm_head.weight" in f.message for f in by_code(result, "WC410"))


def test_unknown_reward_class_is_not_an_error(saved: dict[str, Path], tmp_path: Path) -> None:
    """Remote code's reward classes (Qwen2.5-Math-RM's `Qwen2ForRewardModel`: `score.0` and `score.2`, a two-layer
    head) are not in transformers: checked without the LM head, and the pattern says it cannot vouch for the
    head (its tensors are warnings, never errors)."""
    path = _copy(saved, "qwen2-reward", tmp_path / "a")
    cfg_path = path / "config.json"
    cfg_path.write_text(json.dumps({**json.loads(cfg_path.read_text()), "architectures": ["Qwen2ForRewardModel"]}))

    def two_layer_head(tensors: dict[str, Any]) -> None:
        import torch

        tensors.pop("score.weight")
        tensors["score.0.weight"] = torch.zeros(64, 64)
        tensors["score.0.bias"] = torch.zeros(64)
        tensors["score.2.weight"] = torch.zeros(1, 64)

    edit_tensors(path, two_layer_head)
    result = run(path)
    assert not [f for f in result.findings if f.severity >= Severity.ERROR], result.findings
    assert any("Qwen2ForRewardModel" in note for note in result.notes)


def test_task_heads_data_is_current() -> None:
    """Regenerated from the installed (pinned) transformers; stale data fails CI."""
    from tools.archgen.generate import ARCHITECTURES, GENERATED_DIR
    from tools.archgen.task_heads import generate, render

    assert (GENERATED_DIR / "task_heads.json").read_text() == render(generate(list(ARCHITECTURES))), (
        "stale: run `python scripts/generate_patterns.py --task-heads`"
    )


def _table_classes() -> list[tuple[str, str]]:
    return sorted((t, c) for t, classes in task_heads_index().items() for c in classes)


@pytest.mark.oracle
@pytest.mark.parametrize("variant", ["A", "B"])
@pytest.mark.parametrize(("model_type", "cls"), _table_classes(), ids=lambda v: str(v))
def test_every_task_class_in_the_table_lints_clean(model_type: str, cls: str, variant: str, tmp_path: Path) -> None:
    """Every class the table knows, built by transformers on the meta device from the generator's tiny configs
    (both variants of dimensions, 3 labels) and named as save_pretrained names it: linted clean, headers only."""
    from test_arch_oracle import write_sparse_checkpoint

    from tools.archgen.task_heads import NUM_LABELS, meta_instance
    from tools.archgen.tiny import tiny_config
    from weightcheck.arch.oracle import full_config_dict, saved_shapes

    config = tiny_config(model_type, variant)
    config.num_labels = NUM_LABELS
    model = meta_instance(getattr(transformers, cls), config)
    cfg = {**full_config_dict(config), "architectures": [cls]}
    path = write_sparse_checkpoint(tmp_path / "ckpt", cfg, saved_shapes(model))
    assert _loud(path) == []


def _as_causal(saved: dict[str, Path], name: str, dest: Path) -> Path:
    path = _copy(saved, name, dest)
    cfg_path = path / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg_path.write_text(json.dumps({**cfg, "architectures": [cfg["architectures"][0].replace("Model", "ForCausalLM")]}))
    return path


def test_embedding_model_saved_as_its_backbone_under_a_causal_config(saved: dict[str, Path], tmp_path: Path) -> None:
    """Qwen3-Embedding's published layout: tensors saved from `Qwen3Model` (`embed_tokens.weight`, `layers.N...`,
    no `model.` root) with `"architectures": ["Qwen3ForCausalLM"]` and tied embeddings. transformers loads it into
    the causal class with nothing missing; lint had every weight "missing". Now clean, with a note naming the
    layout; a weight lost from it is still named."""
    path = _as_causal(saved, "qwen3-embedding-backbone", tmp_path / "a")
    cfg_path = path / "config.json"
    cfg_path.write_text(json.dumps({**json.loads(cfg_path.read_text()), "tie_word_embeddings": True}))
    result = run(path)
    assert _loud(path) == [] and any("no `model.` root" in n for n in result.notes), result.notes
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _, info = transformers.AutoModelForCausalLM.from_pretrained(path, output_loading_info=True)
    assert not any(info.values()), info
    edit_tensors(path, lambda tensors: tensors.pop("layers.0.self_attn.q_proj.weight"))
    found = by_code(run(path), "WC410")
    assert found and "layers.0.self_attn.q_proj.weight" in found[0].message


def test_untied_backbone_layout_without_a_head_is_still_wc407(saved: dict[str, Path], tmp_path: Path) -> None:
    """The same layout with `tie_word_embeddings: false` and no head (QwenLM/Qwen3-VL-Embedding#89: the causal
    class has no head to load): still WC407, not a wall of missing weights."""
    path = _as_causal(saved, "qwen3-embedding-backbone", tmp_path / "a")
    result = run(path)
    assert by_code(result, "WC407")
    missing = by_code(result, "WC410")
    assert len(missing) == 1 and "lm_head.weight" in missing[0].message and "layers." not in missing[0].message


@pytest.mark.parametrize("value", [5, "LlamaForSequenceClassification", {"a": 1}, None, [None, 3]])
def test_hostile_architectures_value_is_no_crash(saved: dict[str, Path], tmp_path: Path, value: Any) -> None:
    """config.json is untrusted: an `architectures` that is not a list of strings counts as none (a number
    crashed every rule that picked a pattern)."""
    path = _copy(saved, "llama-reward", tmp_path / "a")
    cfg_path = path / "config.json"
    cfg_path.write_text(json.dumps({**json.loads(cfg_path.read_text()), "architectures": value}))
    result = run(path)
    assert "WC000" not in {f.code for f in result.findings}
    assert by_code(result, "WC410")  # read as the causal LM: its head is missing


@pytest.fixture(scope="module")
def causal_and_backbone(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """One tied Qwen3 causal LM saved whole and as its backbone (`model.model.save_pretrained`, the layout of an
    embedding model cut from it): the same weights under two roots."""
    import torch

    root = tmp_path_factory.mktemp("causal-backbone")
    torch.manual_seed(0)
    model = transformers.Qwen3ForCausalLM(transformers.Qwen3Config(**TINY, head_dim=16, tie_word_embeddings=True))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model.save_pretrained(root / "causal")
        model.model.save_pretrained(root / "backbone")
    return root / "causal", root / "backbone"


@pytest.mark.parametrize("backbone_first", [False, True])
def test_diff_pairs_a_causal_lm_with_its_backbone(causal_and_backbone: tuple[Path, Path], tmp_path: Path,
                                                  backbone_first: bool) -> None:  # fmt: skip
    """`diff` of the two layouts compared nothing (24 tensors only in A, 24 only in B: two errors). The decoder's
    names are now paired across the root, said in a note; a tensor changed in one is still a failure."""
    from weightcheck.diffing import diff

    causal, backbone = causal_and_backbone
    a, b = (backbone, causal) if backbone_first else (causal, backbone)
    result = diff(a, b)
    assert result.exit_code() == 0 and result.checked["compared"] == 24 and result.checked["equal"] == 24
    assert any("base-model layout" in n for n in result.notes), result.notes
    changed = Path(shutil.copytree(backbone, tmp_path / "changed"))

    def bump(tensors: dict[str, Any]) -> None:
        tensors["layers.1.mlp.up_proj.weight"] = tensors["layers.1.mlp.up_proj.weight"] + 1

    edit_tensors(changed, bump)
    failed = diff(causal, changed)
    assert failed.exit_code() == 1 and failed.checked["failed"] == 1
    assert any("up_proj" in (f.location.tensor or "") or "up_proj" in f.message for f in failed.findings)


@pytest.mark.parametrize("oracle", ["1", "0"])
def test_layouts_outside_the_patterns_coverage_stay_clean(
    saved: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, oracle: str
) -> None:
    """A config the pattern was not validated on (sliding-window layer types: the same tensors): lint builds the
    causal class's names (transformers installed) or marks the pattern unvalidated (without). The backbone layout
    and the task classes must stay clean either way (the class's names move to the backbone's root too)."""
    from weightcheck.patterns import ORACLE_ENV

    monkeypatch.setenv(ORACLE_ENV, oracle)
    sliding = {"layer_types": ["sliding_attention", "full_attention"], "use_sliding_window": True, "sliding_window": 64}
    backbone = _as_causal(saved, "qwen3-embedding-backbone", tmp_path / "backbone")
    cfg_path = backbone / "config.json"
    cfg_path.write_text(json.dumps({**json.loads(cfg_path.read_text()), "tie_word_embeddings": True, **sliding}))
    reward = _copy(saved, "qwen3-classifier-tied", tmp_path / "reward")
    cfg_path = reward / "config.json"
    cfg_path.write_text(json.dumps({**json.loads(cfg_path.read_text()), **sliding}))
    for path in (backbone, reward):
        result = run(path)
        assert any("outside what pattern" in n for n in result.notes), result.notes
        assert _loud(path) == [], path.name


def _backbone_types() -> list[str]:
    return sorted(t for t, classes in task_heads_index().items()
                  if any(e.get("kind") == "base-model" and e.get("root") == "" for e in classes.values()))  # fmt: skip


@pytest.mark.oracle
@pytest.mark.parametrize("variant", ["A", "B"])
@pytest.mark.parametrize("model_type", _backbone_types())
def test_every_backbone_layout_under_its_causal_config_lints_clean(model_type: str, variant: str,
                                                                   tmp_path: Path) -> None:  # fmt: skip
    """Every model_type whose base class saves without the root: the causal class's own names (as save_pretrained
    writes them, variant A and B dimensions) with that root taken off, under the causal config: clean (the LM
    head, outside the root, stays where it is)."""
    from test_arch_oracle import write_sparse_checkpoint

    from tools.archgen.tiny import model_class, tiny_config
    from weightcheck.arch.oracle import full_config_dict, saved_shapes

    config = tiny_config(model_type, variant)
    model = _meta_model(model_class(config), config)
    shapes = saved_shapes(model)
    root = next(e["from_root"] for e in task_heads_index()[model_type].values() if e.get("kind") == "base-model")
    moved = {(n[len(root) + 1 :] if n.startswith(root + ".") else n): s for n, s in shapes.items()}
    path = write_sparse_checkpoint(tmp_path / "ckpt", full_config_dict(config), moved)
    result = run(path)
    assert any("no `" in n and "root" in n for n in result.notes), result.notes
    assert _loud(path) == []


def _meta_model(cls: Any, config: Any) -> Any:
    from tools.archgen.task_heads import meta_instance

    return meta_instance(cls, config)


def _published_task_cases() -> list[tuple[int, str]]:
    from oracle_configs import PUBLISHED

    table = task_heads_index()
    return [(i, cls) for i, entry in enumerate(PUBLISHED) for cls in sorted(table.get(entry["model_type"]) or {})]


@pytest.mark.oracle
@pytest.mark.parametrize(("index", "cls"), _published_task_cases(), ids=lambda v: str(v))
def test_published_configs_as_task_and_base_classes_lint_clean(index: int, cls: str, tmp_path: Path) -> None:
    """Every published config of the oracle (reduced only in counts) as each task-head and base class of its
    model_type, built by transformers on the meta device: clean (WC404, MTP layers transformers never saves,
    is the one warning kept, as for the causal class). A config outside a pattern's coverage is built from the
    task class itself."""
    from oracle_configs import PUBLISHED, reduce_counts
    from test_arch_oracle import _problems, write_sparse_checkpoint

    from tools.archgen.task_heads import meta_instance
    from weightcheck.arch.oracle import build_config, full_config_dict, saved_shapes

    try:
        config = build_config(reduce_counts(PUBLISHED[index]["config"]))
        config.num_labels = 1  # a reward model's head
        shapes = saved_shapes(meta_instance(getattr(transformers, cls), config))
    except Exception as exc:  # the causal oracle skips these configs too (a rope table the class rejects)
        pytest.skip(f"transformers cannot build {cls} for this config: {type(exc).__name__}")
    path = write_sparse_checkpoint(tmp_path / "ckpt", {**full_config_dict(config), "architectures": [cls]}, shapes)
    assert _problems(run(path)) == []


@pytest.mark.parametrize(("ignore", "named"), [(["lm_head"], True), (["lm_head", "score"], False)])
def test_reward_model_quantized_with_its_score_head(saved: dict[str, Path], tmp_path: Path, ignore: list[str],
                                                   named: bool) -> None:  # fmt: skip
    """llm-compressor's usual `ignore: ["lm_head"]` on a reward model quantizes its `score` head (FP8_DYNAMIC,
    the real oneshot and compressed save): WC310 warns that SGLang builds that head as a plain nn.Linear. With
    `score` ignored as the fix says, the same run is clean."""
    import torch

    pytest.importorskip("llmcompressor")
    from llmcompressor import oneshot
    from llmcompressor.modifiers.quantization import QuantizationModifier

    model = transformers.AutoModelForSequenceClassification.from_pretrained(saved["llama-reward"], dtype=torch.bfloat16)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        oneshot(model=model, recipe=QuantizationModifier(targets="Linear", scheme="FP8_DYNAMIC", ignore=ignore))
        model.save_pretrained(tmp_path / "fp8", save_compressed=True)
    result = run(tmp_path / "fp8")
    found = by_code(result, "WC310")
    if named:
        assert len(found) == 1 and found[0].severity == Severity.WARNING and "score" in found[0].message
        assert "add score to the quantization ignore list" in found[0].fix
    else:
        assert _loud(tmp_path / "fp8") == []
