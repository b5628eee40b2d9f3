"""WC432: routed experts stored in a layout the declared engine does not read, judged against the generated
SGLang facts (`routed_experts` in patterns/generated/sglang/<model_type>.json, from SGLang 0.5.23's own load_weights).

Fixtures come from the real writers: transformers 5.17 `save_pretrained` (Mixtral converted back to
per-expert names, gpt-oss and Qwen3-VL-MoE fused), and the same Mixtral's in-memory state dict written by
safetensors (transformers 5's fused `mlp.experts.gate_up_proj`, what an exporter that skips the conversion
writes)."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import by_code

from weightcheck import lint
from weightcheck.findings import Severity


def _toml(folder: Path, consumers: list[str] | None) -> Path:
    path = folder / "weightcheck-test.toml"
    path.write_text("" if consumers is None else f"consumers = {consumers!r}\n".replace("'", '"'))
    return path


def _lint(ckpt: Path, tmp: Path, consumers: list[str] | None = ("sglang",)):  # type: ignore[assignment]
    return lint(ckpt, config=_toml(tmp, None if consumers is None else list(consumers)))


@pytest.fixture(scope="module")
def mixtral(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from safetensors.torch import save_file

    from tools.archgen.tiny import build

    root = tmp_path_factory.mktemp("mixtral")
    model = build("mixtral", "A")
    saved = root / "saved"
    model.save_pretrained(saved, max_shard_size="200KB")
    fused = root / "in_memory"
    fused.mkdir()
    model.config.save_pretrained(fused)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(fused / "model.safetensors"),
              metadata={"format": "pt"})  # fmt: skip
    return {"saved": saved, "in_memory": fused}


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory):
    from tools.archgen.tiny import save

    cache: dict[str, Path] = {}

    def get(model_type: str) -> Path:
        if model_type not in cache:
            cache[model_type] = save(model_type, tmp_path_factory.mktemp(model_type) / "ckpt")
        return cache[model_type]

    return get


def test_save_pretrained_per_expert_mixtral_is_read_by_sglang(mixtral: dict[str, Path], tmp_path: Path) -> None:
    assert by_code(_lint(mixtral["saved"], tmp_path), "WC432") == []


def test_transformers5_fused_names_are_not_read_by_sglang_mixtral(mixtral: dict[str, Path], tmp_path: Path) -> None:
    """fused → per-expert engine: SGLang's MixtralForCausalLM maps only block_sparse_moe.experts.N.w1/w2/w3."""
    [finding] = by_code(_lint(mixtral["in_memory"], tmp_path), "WC432")
    assert finding.severity == Severity.ERROR
    assert "MixtralForCausalLM" in finding.message and "`mlp.experts.gate_up_proj`" in finding.message
    assert "block_sparse_moe.experts.*.w1.weight" in finding.message
    assert finding.details["refused_layout"] == "transformers_in_memory"


def test_no_consumers_declared_is_info_and_other_engines_only_is_silent(mixtral: dict[str, Path],
                                                                      tmp_path: Path) -> None:  # fmt: skip
    [finding] = by_code(_lint(mixtral["in_memory"], tmp_path, consumers=None), "WC432")
    assert finding.severity == Severity.INFO and 'consumers = ["sglang"]' in finding.message
    assert by_code(_lint(mixtral["in_memory"], tmp_path, consumers=["vllm"]), "WC432") == []


def test_native_fused_gpt_oss_is_read(saved, tmp_path: Path) -> None:
    assert by_code(_lint(saved("gpt_oss"), tmp_path), "WC432") == []


def test_per_expert_names_for_a_fused_only_engine(saved, tmp_path: Path) -> None:
    """per-expert → fused-only engine: gpt-oss's stacks split into per-expert tensors (the real save's
    tensors, renamed by safetensors' writer); SGLang's GptOssForCausalLM maps only the fused names."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    src = saved("gpt_oss")
    out = tmp_path / "split"
    out.mkdir()
    (out / "config.json").write_text((src / "config.json").read_text())
    tensors = {}
    for shard in sorted(src.glob("*.safetensors")):
        with safe_open(str(shard), framework="pt") as fh:
            for key in fh.keys():
                value = fh.get_tensor(key)
                head, _, leaf = key.rpartition(".")
                if head.endswith(".experts"):
                    for e in range(value.shape[0]):
                        tensors[f"{head}.{e}.{leaf}.weight"] = value[e].contiguous()
                else:
                    tensors[key] = value
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    [finding] = by_code(_lint(out, tmp_path), "WC432")
    assert "GptOssForCausalLM" in finding.message and "per-expert" in finding.message
    assert "`mlp.experts.gate_up_proj`" in finding.message  # what it reads instead


def test_qwen3_vl_moe_save_pretrained_orientation_is_refused_by_sglang(saved, tmp_path: Path) -> None:
    """transformers 5.17 saves Qwen3-VL-MoE's stacks as it holds them ([E, 2I, H]: its Transpose
    conversion is skipped on save when the shapes already match the model), while SGLang 0.5.23 transposes
    what it loads, expecting the released [E, H, 2I]: its load_weights raises on the saved file."""
    [finding] = by_code(_lint(saved("qwen3_vl_moe"), tmp_path), "WC432")
    assert "orientation" in finding.message and "RuntimeError" in finding.message
    assert finding.severity == Severity.ERROR
    # undeclared: reported, below the warning bar (the clean-checkpoint tests stay green)
    [info] = by_code(_lint(saved("qwen3_vl_moe"), tmp_path, consumers=None), "WC432")
    assert info.severity == Severity.INFO


def test_transformers_reads_both_of_its_layouts(mixtral: dict[str, Path]) -> None:
    """Why WC432 is only info with no consumer declared: transformers 5.17 loads the in-memory fused layout
    as well as the saved per-expert one (no missing or unexpected keys, the same experts)."""
    import torch
    from transformers import AutoModelForCausalLM

    models = {}
    for layout, path in mixtral.items():
        model, info = AutoModelForCausalLM.from_pretrained(path, output_loading_info=True)
        assert not any(info.get(k) for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), (layout, info)
        models[layout] = model.state_dict()
    experts = [k for k in models["saved"] if ".experts." in k]
    assert experts and all(torch.equal(models["saved"][k], models["in_memory"][k]) for k in experts)
