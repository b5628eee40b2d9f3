"""PEFT LoRA adapters as PEFT's own `save_pretrained` writes them (adapter_config.json, adapter_model.safetensors
under `base_model.model.` + the base model's names, no config.json): clean adapters of every common shape lint
without an error or a warning (they were two false errors: "config.json is missing" and WC405's doubled
`model.model.`), and each defect planted in one (a factor dropped, a factor of another rank, a config that gives
another rank) is named: WC433, WC502. PEFT's own loader is run on the defects to show they are real."""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import pytest
from factories import edit_tensors

from weightcheck.linting import lint

peft = pytest.importorskip("peft")

TINY = dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, vocab_size=128)
LLAMA = dict(TINY, intermediate_size=128, num_hidden_layers=3, tie_word_embeddings=False)
QWEN3_MOE = dict(TINY, intermediate_size=128, moe_intermediate_size=32, num_hidden_layers=2, head_dim=16,
                 num_experts=4, num_experts_per_tok=2, tie_word_embeddings=False)  # fmt: skip

# name -> (base model, LoraConfig arguments): the shapes of adapter people train and serve
VARIANTS: dict[str, tuple[str, dict[str, Any]]] = {
    "q-v": ("llama", dict(r=4, target_modules=["q_proj", "v_proj"])),
    "rank-pattern": ("llama", dict(r=4, target_modules=["q_proj", "v_proj"],
                                   rank_pattern={"layers.0.self_attn.q_proj": 8},
                                   alpha_pattern={"layers.1.self_attn.v_proj": 32})),
    "some-layers": ("llama", dict(r=4, target_modules=["q_proj", "v_proj"], layers_to_transform=[0, 2])),
    "modules-to-save": ("llama", dict(r=4, target_modules=["q_proj", "v_proj"], modules_to_save=["lm_head"])),
    "all-linear": ("llama", dict(r=4, target_modules="all-linear")),
    "dora": ("llama", dict(r=4, target_modules=["q_proj", "v_proj"], use_dora=True)),
    "embedding": ("llama", dict(r=4, target_modules=["embed_tokens", "q_proj"])),
    "moe-all-linear": ("qwen3_moe", dict(r=4, target_modules="all-linear")),
    "moe-expert-params": ("qwen3_moe", dict(r=4, target_modules=["q_proj"],
                                            target_parameters=["mlp.experts.gate_up_proj", "mlp.experts.down_proj"])),
}  # fmt: skip


def _base(kind: str) -> Any:
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig, Qwen3MoeConfig

    torch.manual_seed(0)
    cfg = LlamaConfig(**LLAMA) if kind == "llama" else Qwen3MoeConfig(**QWEN3_MOE)
    return AutoModelForCausalLM.from_config(cfg)


def _peft_model(kind: str, lora: dict[str, Any]) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # PEFT's notes on embedding targets and unused pattern keys
        return peft.get_peft_model(_base(kind), peft.LoraConfig(**lora))


def _save(model: Any, path: Path) -> Path:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model.save_pretrained(path)
    return path


def _codes(path: Path) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for f in lint(path).findings:
        out.setdefault(f.severity.name.lower(), set()).add(f.code)
    return out


@pytest.fixture(scope="module")
def adapters(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("peft")
    return {name: _save(_peft_model(kind, lora), root / name) for name, (kind, lora) in VARIANTS.items()}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_clean_adapters_have_no_error_or_warning(adapters: dict[str, Path], variant: str) -> None:
    path = adapters[variant]
    assert not (path / "config.json").exists()
    result = lint(path)
    assert not [f for f in result.findings if f.severity.name in ("ERROR", "WARNING")], [
        (f.code, f.message) for f in result.findings
    ]
    assert result.exit_code() == 0 and not result.nothing_checked
    wc107 = [f for f in result.findings if f.code == "WC107"]
    assert len(wc107) == 1 and "PEFT LORA adapter" in wc107[0].message and wc107[0].severity.name == "INFO"


def test_a_model_folder_without_config_is_still_an_error(tmp_path: Path) -> None:
    """The adapter exception needs adapter_config.json: the same safetensors file alone is a checkpoint
    without its config (WC107 error), and a doubled prefix is still WC405."""
    from safetensors.torch import save_file

    base = _base("llama")
    save_file({f"model.{k}": v.contiguous() for k, v in base.state_dict().items()}, tmp_path / "model.safetensors")
    codes = _codes(tmp_path)
    assert {"WC107", "WC405"} <= codes.get("error", set()), codes


def test_doubled_prefix_inside_an_adapter_is_still_reported(adapters: dict[str, Path], tmp_path: Path) -> None:
    import shutil

    path = Path(shutil.copytree(adapters["q-v"], tmp_path / "a"))

    def double(tensors: dict[str, Any]) -> None:
        for name in list(tensors):
            tensors[name.replace("base_model.model.model.", "base_model.model.model.model.")] = tensors.pop(name)

    edit_tensors(path, double)
    assert "WC405" in _codes(path).get("error", set())


def _copy(adapters: dict[str, Path], variant: str, dest: Path) -> Path:
    import shutil

    return Path(shutil.copytree(adapters[variant], dest))


Q0 = "base_model.model.model.layers.0.self_attn.q_proj"


def test_wc433_fix_text_applied(adapters: dict[str, Path], tmp_path: Path) -> None:
    """A converter that kept only the tensors matching `lora_A`: q_proj's lora_B is gone. PEFT loads the
    adapter with a warning and a zero update for that module; lint names it. The fix text (re-save from the
    trained PeftModel) clears it."""
    path = _copy(adapters, "q-v", tmp_path / "a")
    edit_tensors(path, lambda tensors: tensors.pop(f"{Q0}.lora_B.weight"))
    result = lint(path)
    found = [f for f in result.findings if f.code == "WC433"]
    assert len(found) == 1 and "lora_B.weight" in found[0].message and "layers.0.self_attn.q_proj" in found[0].message
    assert result.exit_code() == 1
    assert "re-save the adapter" in found[0].fix
    with pytest.warns(UserWarning, match="missing adapter keys"):  # PEFT's loader sees the same defect
        peft.PeftModel.from_pretrained(_base("llama"), path)
    kind, lora = VARIANTS["q-v"]
    _save(_peft_model(kind, lora), path)  # the fix, done literally
    assert "WC433" not in {f.code for f in lint(path).findings}


def test_wc502_fix_text_applied(adapters: dict[str, Path], tmp_path: Path) -> None:
    """adapter_config.json says r = 8 while the factors hold rank 4 (a converter wrote the config of another
    run): PEFT refuses the tensors at load; lint names every module. Setting r to the rank the factors hold (the
    fix text's second way) clears it. A rank_pattern that gives another rank to some modules stays clean."""
    path = _copy(adapters, "q-v", tmp_path / "a")
    cfg_path = path / "adapter_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg_path.write_text(json.dumps({**cfg, "r": 8}))
    found = [f for f in lint(path).findings if f.code == "WC502"]
    assert len(found) == 1 and "rank 4" in found[0].message and "r = 8" in found[0].message, found
    assert "6 LoRA module(s)" in found[0].message
    with pytest.raises(RuntimeError, match="size mismatch"):
        peft.PeftModel.from_pretrained(_base("llama"), path)
    assert "set r / rank_pattern to the rank the factors hold" in found[0].fix
    cfg_path.write_text(json.dumps({**cfg, "r": 4}))
    assert "WC502" not in {f.code for f in lint(path).findings}


def test_wc502_factors_of_different_ranks(adapters: dict[str, Path], tmp_path: Path) -> None:
    """One module's lora_B was cut to rank 3 while its lora_A has rank 4: the factors cannot multiply."""
    import torch

    path = _copy(adapters, "rank-pattern", tmp_path / "a")

    def cut(tensors: dict[str, Any]) -> None:
        name = "base_model.model.model.layers.1.self_attn.v_proj.lora_B.weight"
        tensors[name] = torch.zeros(tensors[name].shape[0], 3, dtype=tensors[name].dtype)

    edit_tensors(path, cut)
    found = [f for f in lint(path).findings if f.code == "WC502"]
    assert any("rows differ from their lora_B columns" in f.message and "layers.1.self_attn.v_proj" in f.message
               for f in found), [f.message for f in found]  # fmt: skip


def _trained(kind: str, lora: dict[str, Any]) -> Any:
    """A PEFT model whose zero-initialised factors hold values, as after a training step."""
    import torch

    model = _peft_model(kind, lora)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith(("lora_B.default.weight", "lora_embedding_A.default")):
                param.normal_(0, 0.02)
    return model


def test_content_an_untrained_adapter_is_a_warning_a_lost_update_an_error(adapters: dict[str, Path],
                                                                           tmp_path: Path) -> None:  # fmt: skip
    """`lint --content`: PEFT starts lora_B (Embedding: lora_embedding_A) at zero, so a fresh adapter's
    factors are all zeros by design: one WC602 warning that the adapter adds nothing, no error. A trained
    adapter has none; one whose lora_B went back to zeros while the others kept their values lost that update:
    a WC602 error naming it."""
    fresh = lint(adapters["embedding"], options={"content": True})
    wc602 = [f for f in fresh.findings if f.code == "WC602"]
    assert [f.severity.name for f in wc602] == ["WARNING"] and "adds nothing" in wc602[0].message
    assert "embed_tokens.lora_embedding_A" in wc602[0].message and fresh.exit_code() == 0

    kind, lora = VARIANTS["embedding"]
    path = _save(_trained(kind, lora), tmp_path / "trained")
    assert "WC602" not in {f.code for f in lint(path, options={"content": True}).findings}

    import torch

    def lose(tensors: dict[str, Any]) -> None:
        tensors[f"{Q0}.lora_B.weight"] = torch.zeros_like(tensors[f"{Q0}.lora_B.weight"])

    edit_tensors(path, lose)
    found = [f for f in lint(path, options={"content": True}).findings if f.code == "WC602"]
    assert [f.severity.name for f in found] == ["ERROR"], [(f.severity, f.message) for f in found]
    assert "lost their update" in found[0].message and "layers.0.self_attn.q_proj.lora_B" in found[0].message


OTHER_TUNERS = {
    "adalora": lambda: peft.AdaLoraConfig(init_r=8, target_r=4, target_modules=["q_proj", "v_proj"], total_step=10),
    "loha": lambda: peft.LoHaConfig(r=4, target_modules=["q_proj", "v_proj"]),
    "lokr": lambda: peft.LoKrConfig(r=4, target_modules=["q_proj", "v_proj"]),
    "ia3": lambda: peft.IA3Config(target_modules=["q_proj", "v_proj", "down_proj"], feedforward_modules=["down_proj"]),
    "vera": lambda: peft.VeraConfig(r=4, target_modules=["q_proj", "o_proj"]),
}


@pytest.mark.parametrize("tuner", sorted(OTHER_TUNERS))
def test_other_peft_tuners_are_clean_with_content(tuner: str, tmp_path: Path) -> None:
    """AdaLoRA's lora_E, LoHa's and LoKr's second factors start at zero too: a fresh adapter of any tuner has no
    error, header-only or with --content."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        path = _save(peft.get_peft_model(_base("llama"), OTHER_TUNERS[tuner]()), tmp_path / tuner)
    for content in (False, True):
        result = lint(path, options={"content": content})
        assert not [f for f in result.findings if f.severity.name == "ERROR"], [
            (f.code, f.message) for f in result.findings
        ]
        # one finding per kind of untrained factor, not one per tensor (IA3's 9 scaling vectors at 1)
        assert all(f.count > 1 or "adapter" in f.message for f in result.findings if f.code in ("WC602", "WC604"))
        assert len([f for f in result.findings if f.code == "WC604"]) <= 1


def test_content_zero_expert_factors_are_a_warning(tmp_path: Path) -> None:
    """Per-expert LoRA factors (an adapter on a model whose experts are Linears) that are still zero while the
    other experts' were trained: an expert never routed a token keeps its initialisation, so a warning, not
    the lost-update error. The adapter is a trained PEFT save whose q/v factors are renamed to two experts."""
    import torch

    kind, lora = VARIANTS["q-v"]
    path = _save(_trained(kind, lora), tmp_path / "a")

    def experts(tensors: dict[str, Any]) -> None:
        for name in list(tensors):
            for proj, expert in (("q_proj", 0), ("v_proj", 1)):
                if f"self_attn.{proj}." in name:
                    tensors[name.replace(f"self_attn.{proj}", f"mlp.experts.{expert}.up_proj")] = tensors.pop(name)
        key = "base_model.model.model.layers.2.mlp.experts.1.up_proj.lora_B.weight"
        tensors[key] = torch.zeros_like(tensors[key])

    edit_tensors(path, experts)
    found = [f for f in lint(path, options={"content": True}).findings if f.code == "WC602"]
    assert [f.severity.name for f in found] == ["WARNING"] and "never routed" in found[0].message, [
        (f.severity, f.message) for f in found
    ]


def test_an_adapter_folder_holding_its_base_models_config_is_an_adapter(adapters: dict[str, Path],
                                                                         tmp_path: Path) -> None:  # fmt: skip
    """Some trainers copy the base model's config.json into the adapter's output folder: the config describes
    the base model (4 errors: every base weight "missing", a doubled `model.model.`, no lm_head). With
    adapter_config.json and adapter weights only, the folder is linted as the adapter. A model's own weights
    beside the same files are still linted against the config."""
    import shutil

    from transformers import LlamaConfig

    path = _copy(adapters, "some-layers", tmp_path / "a")
    LlamaConfig(**LLAMA).save_pretrained(path)  # the base model's config.json, as transformers writes it
    result = lint(path)
    assert not [f for f in result.findings if f.severity.name in ("ERROR", "WARNING")], [
        (f.code, f.message) for f in result.findings
    ]
    assert any(f.code == "WC107" and "config.json here is its base model's" in f.message for f in result.findings)

    from weightcheck.checkpoint import load_checkpoint

    model = tmp_path / "m"
    shutil.copytree(path, model)
    _base("llama").save_pretrained(model)  # model.safetensors beside the adapter: a model folder
    assert load_checkpoint(model).peft_adapter() is None and load_checkpoint(path).peft_adapter() is not None
    # no index: vLLM and SGLang load every *.safetensors of the folder, the adapter's LoRA tensors included
    found = [f for f in lint(model).findings if f.code == "WC105"]
    assert len(found) == 1 and found[0].location.file == "adapter_model.safetensors", found
    assert "vLLM and SGLang load every *.safetensors" in found[0].message
    assert not [f for f in lint(model).findings if f.code == "WC405"]  # the doubled model.model. is PEFT's
    # the fix text, applied: the adapter moves to its own folder; the model is clean, and so is the adapter
    (tmp_path / "adapter").mkdir()
    for name in ("adapter_model.safetensors", "adapter_config.json"):
        shutil.move(model / name, tmp_path / "adapter" / name)
    assert lint(model).exit_code() == 0 and lint(tmp_path / "adapter").exit_code() == 0


# adapter_config.json values PEFT's loader refuses (each confirmed below with PEFT 0.21's from_pretrained), as
# (key, value, severity, words of the message): an error where vLLM and SGLang cannot use it either.
BROKEN_ADAPTER_CONFIGS = [
    ("r", "4", "error", 'r is "4", not a positive integer'),
    ("r", 0, "error", "r is 0, not a positive integer"),
    ("r", True, "error", "r is true, not a positive integer"),
    ("r", None, "error", "r is null, not a positive integer"),
    ("lora_alpha", None, "error", "lora_alpha is null, not a number"),
    ("lora_alpha", "8", "error", 'lora_alpha is "8", not a number'),
    ("rank_pattern", [], "warning", "rank_pattern is [], not an object of positive integer ranks"),
    ("rank_pattern", None, "warning", "rank_pattern is null, not an object of positive integer ranks"),
    ("rank_pattern", {"layers.0.self_attn.q_proj": "8"}, "warning", "rank_pattern is"),
    ("alpha_pattern", "x", "warning", 'alpha_pattern is "x", not an object of numbers'),
    ("target_modules", [5], "warning", "target_modules is [5], not a module name pattern"),
    ("target_modules", [], "warning", "target_modules is an empty list"),
    ("peft_type", "lora", "error", 'peft_type "lora" is not a PEFT type'),
    ("peft_type", None, "error", "peft_type null is not a PEFT type"),
]


@pytest.mark.parametrize(("key", "value", "severity", "words"), BROKEN_ADAPTER_CONFIGS,
                         ids=[f"{k}={v!r}" for k, v, _, _ in BROKEN_ADAPTER_CONFIGS])  # fmt: skip
def test_adapter_config_values_peft_refuses_are_named(adapters: dict[str, Path], tmp_path: Path, key: str,
                                                      value: Any, severity: str, words: str) -> None:  # fmt: skip
    """A value in adapter_config.json that no loader can use was a silent pass (or, for a bad `peft_type`, two
    false errors about a model folder: "config.json is missing" and a doubled prefix). Each is now one WC107
    finding on adapter_config.json, and PEFT's own loader refuses the same file."""
    path = _copy(adapters, "q-v", tmp_path / "a")
    cfg_path = path / "adapter_config.json"
    cfg_path.write_text(json.dumps({**json.loads(cfg_path.read_text()), key: value}))
    found = [f for f in lint(path).findings if f.code == "WC107" and f.location.file == "adapter_config.json"
             and f.severity.name.lower() != "info"]  # fmt: skip
    assert len(found) == 1 and words in found[0].message and found[0].severity.name.lower() == severity, found
    assert "WC405" not in {f.code for f in lint(path).findings}  # still read as an adapter
    with pytest.raises(Exception), warnings.catch_warnings():  # noqa: B017 (PEFT raises KeyError, TypeError, ...)
        warnings.simplefilter("ignore")
        peft.PeftModel.from_pretrained(_base("llama"), path)


def test_adapter_config_values_peft_accepts_stay_clean(adapters: dict[str, Path], tmp_path: Path) -> None:
    """The good twins: values PEFT loads (a float alpha, null target_modules: PEFT's default targets for the
    model type; patterns left out) add no finding."""
    path = _copy(adapters, "q-v", tmp_path / "a")
    cfg_path = path / "adapter_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg_path.write_text(json.dumps({**cfg, "lora_alpha": 8.5, "target_modules": None}))
    assert not [f for f in lint(path).findings if f.severity.name.lower() != "info"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        peft.PeftModel.from_pretrained(_base("llama"), path)
    cfg_path.write_text(json.dumps({k: v for k, v in cfg.items() if k not in ("rank_pattern", "alpha_pattern")}))
    assert not [f for f in lint(path).findings if f.severity.name.lower() != "info"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        peft.PeftModel.from_pretrained(_base("llama"), path)
