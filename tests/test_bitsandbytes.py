"""bitsandbytes checkpoints as transformers' own `save_pretrained` writes them after loading a model with a
`BitsAndBytesConfig` (the QLoRA base people fine-tune and serve): 4-bit NF4/FP4, double-quantized, with a bf16
storage dtype (FSDP-QLoRA), 8-bit. They linted as 8 errors (the packed `[n/2, 1]` uint8 weight read as an
unquantized weight of the wrong shape) and a warning (8-bit's `weight_format` tag unknown). Each defect planted
in one is still named."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest
from factories import edit_tensors

from weightcheck.linting import lint

pytest.importorskip("bitsandbytes")

TINY = dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, vocab_size=128)
O_PROJ = "model.layers.1.self_attn.o_proj.weight"


def _bnb(**kw: Any) -> Any:
    import torch
    from transformers import BitsAndBytesConfig

    if kw.get("bnb_4bit_quant_storage") == "bfloat16":
        kw["bnb_4bit_quant_storage"] = torch.bfloat16
    return BitsAndBytesConfig(**kw)


VARIANTS: dict[str, tuple[str, dict[str, Any]]] = {
    "nf4": ("llama", dict(load_in_4bit=True, bnb_4bit_quant_type="nf4")),
    "nf4-double": ("llama", dict(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True)),
    "fp4": ("llama", dict(load_in_4bit=True, bnb_4bit_quant_type="fp4")),
    "nf4-bf16-storage": ("llama", dict(load_in_4bit=True, bnb_4bit_quant_storage="bfloat16")),
    "nf4-skip-o-proj": ("llama", dict(load_in_4bit=True, llm_int8_skip_modules=["lm_head", "o_proj"])),
    "int8": ("llama", dict(load_in_8bit=True)),
    "nf4-qwen3-tied": ("qwen3", dict(load_in_4bit=True)),
}


def _base(kind: str, path: Path) -> Path:
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig, Qwen3Config, Qwen3MoeConfig

    torch.manual_seed(0)
    if kind == "llama":
        cfg = LlamaConfig(**TINY, intermediate_size=128, num_hidden_layers=3, tie_word_embeddings=False)
    elif kind == "qwen3":
        cfg = Qwen3Config(**TINY, intermediate_size=128, num_hidden_layers=2, head_dim=16, tie_word_embeddings=True)
    else:
        cfg = Qwen3MoeConfig(**TINY, intermediate_size=128, moe_intermediate_size=32, num_hidden_layers=2,
                             head_dim=16, num_experts=4, num_experts_per_tok=2, tie_word_embeddings=False)  # fmt: skip
    AutoModelForCausalLM.from_config(cfg).save_pretrained(path)
    return path


def _quantized(base: Path, quant: dict[str, Any], out: Path) -> Path:
    from transformers import AutoModelForCausalLM

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        AutoModelForCausalLM.from_pretrained(base, quantization_config=_bnb(**quant), device_map="cpu").save_pretrained(
            out
        )
    return out


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("bnb")
    bases = {kind: _base(kind, root / f"base-{kind}") for kind in ("llama", "qwen3", "qwen3_moe")}
    out = {name: _quantized(bases[kind], quant, root / name) for name, (kind, quant) in VARIANTS.items()}
    out["moe-nf4"] = _quantized(bases["qwen3_moe"], dict(load_in_4bit=True), root / "moe-nf4")
    return out


@pytest.mark.parametrize("content", [False, True], ids=["headers", "content"])
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_clean_bitsandbytes_checkpoints_lint_clean(saved: dict[str, Path], variant: str, content: bool) -> None:
    """Header-only and --content (the bf16-storage codes read as bf16 held "NaN" byte pairs: 21 WC601 errors)."""
    result = lint(saved[variant], options={"content": content})
    assert not [f for f in result.findings if f.severity.name in ("ERROR", "WARNING")], [
        (f.code, f.message) for f in result.findings
    ]
    assert result.exit_code() == 0


def test_a_4bit_weight_that_lost_codes_is_wc314(saved: dict[str, Path], tmp_path: Path) -> None:
    """o_proj's packed column cut to half its rows (a truncated copy): it no longer holds 64 x 64 codes."""
    import shutil

    path = Path(shutil.copytree(saved["nf4"], tmp_path / "a"))

    def cut(tensors: dict[str, Any]) -> None:
        tensors[O_PROJ] = tensors[O_PROJ][: tensors[O_PROJ].shape[0] // 2].clone()

    edit_tensors(path, cut)
    found = [f for f in lint(path).findings if f.code == "WC314"]
    assert len(found) == 1 and "bitsandbytes 4-bit weight U8[1024, 1]" in found[0].message
    assert "self_attn.o_proj" in found[0].message and "[2048, 1]" in found[0].message


def test_a_4bit_module_without_its_quant_state_is_reported(saved: dict[str, Path], tmp_path: Path) -> None:
    """o_proj's bitsandbytes blobs dropped: its uint8 codes read as an unquantized weight of the wrong shape."""
    import shutil

    path = Path(shutil.copytree(saved["nf4"], tmp_path / "a"))
    edit_tensors(path, lambda t: [t.pop(k) for k in list(t) if k.startswith(O_PROJ + ".")])
    codes = {f.code for f in lint(path).findings if f.severity.name == "ERROR"}
    assert {"WC307", "WC501"} <= codes, codes


def test_moe_experts_transformers_kept_unquantized_are_an_engine_problem_only(saved: dict[str, Path]) -> None:
    """transformers >= 5 keeps Qwen3-MoE's routed experts as fused 3-D parameters, which bitsandbytes (nn.Linear
    only) leaves unquantized: transformers writes them per expert in bf16 and reads them back so. vLLM's
    bitsandbytes loader builds experts quantized and fuses every expert's quant state: WC307 names it, not
    transformers."""
    from transformers import AutoModelForCausalLM

    path = saved["moe-nf4"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = AutoModelForCausalLM.from_pretrained(path, device_map="cpu")  # transformers reads it back
    experts = model.model.layers[0].mlp.experts
    assert any(p.dtype.is_floating_point and p.dim() == 3 for p in experts.parameters())
    found = [f for f in lint(path).findings if f.code == "WC307"]
    assert len(found) == 1 and "vLLM bitsandbytes" in found[0].message, [f.message for f in found]
    assert "transformers" not in found[0].message and "mlp.experts" in found[0].message


# ---- diff: the dequantizer (weightcheck.bnb) against bitsandbytes' own ------------------------------------


@pytest.mark.parametrize("variant", ["nf4", "nf4-double", "fp4", "nf4-bf16-storage", "int8"])
def test_dequantized_bit_for_bit_like_bitsandbytes(saved: dict[str, Path], variant: str) -> None:
    import bitsandbytes.functional as F
    import torch
    from safetensors.torch import load_file

    from weightcheck import bnb
    from weightcheck.safetensors_header import read_header

    path = saved[variant] / "model.safetensors"
    tensors = load_file(path)
    found, malformed = bnb.find(read_header(path).tensors, tensors.__getitem__)
    assert not malformed and len(found) == 21, (malformed, sorted(found)[:3])
    for name, qt in found.items():
        ours, step = bnb.dequantize_rows(qt, tensors.__getitem__, 0, qt.rows, with_step=True)
        if variant == "int8":
            ref = F.int8_vectorwise_dequant(tensors[name], tensors[name.removesuffix("weight") + "SCB"])
        else:
            blobs = {k.removeprefix(name + "."): v for k, v in tensors.items() if k.startswith(name + ".")}
            ref = F.dequantize_4bit(tensors[name], F.QuantState.from_dict(blobs, device=torch.device("cpu")))
        assert ours.dtype == ref.dtype and ours.shape == ref.shape, (name, ours.dtype, ref.dtype, ours.shape)
        assert torch.equal(ours, ref), name
        assert step is not None and bool((step > 0).all())


def test_diff_of_base_and_its_bitsandbytes_export_is_within_quantization_error(saved: dict[str, Path],
                                                                                tmp_path: Path) -> None:  # fmt: skip
    """`diff BASE QUANTIZED` compared the packed uint8 column with the bf16 weight (shape mismatch, 2 errors) and
    listed the blobs as tensors only in B. Now each module is dequantized: within quantization error, exit 0. A
    candidate whose layer-1 o_proj holds layer 0's codes and state (a mapping bug) is a mismatch."""
    import shutil

    from weightcheck.diffing import diff

    base = saved["nf4"].parent / "base-llama"
    clean = diff(base, saved["nf4-double"])
    assert clean.exit_code() == 0, [(f.code, f.message) for f in clean.findings]
    assert clean.checked.get("within_tolerance") == 21 and clean.checked.get("only_in_candidate") == 0, clean.checked

    bad = Path(shutil.copytree(saved["nf4-double"], tmp_path / "bad"))
    src, dst = O_PROJ.replace("layers.1", "layers.0"), O_PROJ

    def shift(tensors: dict[str, Any]) -> None:
        for name in [n for n in tensors if n == src or n.startswith(src + ".")]:
            tensors[dst + name[len(src):]] = tensors[name].clone()  # fmt: skip

    edit_tensors(bad, shift)
    found = diff(base, bad)
    assert found.exit_code() == 1
    assert any(dst in (f.location.tensor or "") + f.message for f in found.findings if f.severity.name == "ERROR"), [
        (f.code, f.message) for f in found.findings
    ]


def test_content_a_nan_in_a_4bit_scale_is_still_found(saved: dict[str, Path], tmp_path: Path) -> None:
    """The packed codes are skipped by the value rules, not the module: a NaN absmax poisons a whole block."""
    import shutil

    import torch

    path = Path(shutil.copytree(saved["nf4-bf16-storage"], tmp_path / "a"))

    def poison(tensors: dict[str, Any]) -> None:
        tensors[O_PROJ + ".absmax"] = tensors[O_PROJ + ".absmax"].clone()
        tensors[O_PROJ + ".absmax"][3] = torch.nan

    edit_tensors(path, poison)
    found = [f for f in lint(path, options={"content": True}).findings if f.code == "WC601"]
    assert len(found) == 1 and found[0].location.tensor == O_PROJ + ".absmax", [(f.location, f.message) for f in found]


def test_gemma3_vision_pooling_head_is_not_a_bnb_target(tmp_path: Path) -> None:
    """Gemma 3's SigLIP pooling head is a torch `nn.MultiheadAttention`, whose `out_proj` is a
    `NonDynamicallyQuantizableLinear`: transformers' bitsandbytes replacement converts `type(m) is nn.Linear`
    only, so a clean save stores it unquantized (it was a WC307 error). A vision MLP stored unquantized after
    the same save (a lost quantization) is still WC307."""
    import shutil

    import transformers as T

    cfg = T.Gemma3Config(
        text_config=dict(TINY, intermediate_size=128, num_hidden_layers=2, head_dim=16),
        vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                           image_size=28, patch_size=14),
        mm_tokens_per_image=4,
    )  # fmt: skip
    T.AutoModelForImageTextToText.from_config(cfg).save_pretrained(tmp_path / "base")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = T.AutoModelForImageTextToText.from_pretrained(
            tmp_path / "base", quantization_config=_bnb(load_in_4bit=True), device_map="cpu"
        )
    model.save_pretrained(tmp_path / "nf4")
    from safetensors import safe_open

    with safe_open(str(tmp_path / "nf4" / "model.safetensors"), "np") as fh:
        names = set(fh.keys())
    head = "vision_tower.head.attention.out_proj"  # as the checkpoint names it
    assert f"{head}.weight" in names and not any(n.startswith(f"{head}.weight.") for n in names), sorted(names)[:5]
    result = lint(tmp_path / "nf4")
    errors = [(f.code, f.message) for f in result.findings if f.severity.name == "ERROR"]
    assert not errors, errors

    bad = Path(shutil.copytree(tmp_path / "nf4", tmp_path / "bad"))
    base = Path(tmp_path / "base")
    from safetensors.torch import load_file

    fc1 = next(k for k in load_file(base / "model.safetensors") if k.endswith("layers.0.mlp.fc1.weight"))
    plain = load_file(base / "model.safetensors")[fc1]

    def lose(tensors: dict[str, Any]) -> None:
        for name in [n for n in tensors if n.startswith(fc1 + ".")]:
            del tensors[name]
        tensors[fc1] = plain

    edit_tensors(bad, lose)
    found = [f for f in lint(bad).findings if f.code == "WC307"]
    assert len(found) == 1 and "mlp.fc1" in found[0].message and "out_proj" not in found[0].message


@pytest.mark.parametrize(
    "state",
    [
        '{"quant_type": "nf4", "blocksize": 64, "dtype": ["float32"], "shape": [64, 64]}',
        '{"quant_type": "nf4", "blocksize": 64, "dtype": "float32", "shape": [64, 64], "nested_blocksize": 256, '
        '"nested_dtype": "load", "nested_offset": 0.1}',
        '{"quant_type": "nf4", "blocksize": 64, "dtype": "float32", "shape": [99999999999, 99999999999]}',
        '{"quant_type": "nf4", "blocksize": true, "dtype": "float32", "shape": [64, 64]}',
        "[1, 2",
    ],
    ids=["dtype-list", "nested-dtype-not-a-dtype", "huge-shape", "bool-blocksize", "not-json"],
)
def test_a_hostile_quant_state_is_a_finding(saved: dict[str, Path], tmp_path: Path, state: str) -> None:
    """The quant_state blob is JSON from the checkpoint: any value in it is a malformed-module finding in diff
    (WC709 family), never a traceback, an allocation from its numbers, or a lookup of a torch attribute it
    names."""
    import shutil

    import torch

    from weightcheck.diffing import diff

    path = Path(shutil.copytree(saved["nf4-double"], tmp_path / "a"))
    blob = next(k for k in _names(path) if k.startswith(O_PROJ + ".quant_state."))

    def plant(tensors: dict[str, Any]) -> None:
        tensors[blob] = torch.frombuffer(bytearray(state.encode()), dtype=torch.uint8).clone()

    edit_tensors(path, plant)
    result = diff(saved["nf4"].parent / "base-llama", path)
    assert result.exit_code() == 1 and not any(f.code == "WC000" for f in result.findings)
    assert any(O_PROJ in (f.location.tensor or "") + f.message for f in result.findings if f.severity.name == "ERROR")


def _names(path: Path) -> list[str]:
    from safetensors import safe_open

    with safe_open(str(path / "model.safetensors"), "np") as fh:
        return list(fh.keys())
