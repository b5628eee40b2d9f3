"""Checkpoints Intel's AutoRound writes (installed with llm-compressor) for a tiny Llama and Qwen3-MoE, in each
export format serving engines read: `auto_round`, `auto_gptq`, `auto_awq` (qweight/qzeros/scales) and
`llm_compressor` (compressed-tensors pack-quantized). Lint finds nothing wrong with any of them. diff of the base
and its `llm_compressor` export: AutoRound's optimized RTN moves a few weights past one quantization step, which
the classifier called a partial tensor-parallel write ("119 of 128 columns match: gather every shard"); a few
scattered columns are now a value mismatch whose fix names lossy quantizers and the stat tier, which passes."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
from conftest import BUILDERS

from weightcheck.linting import lint

pytest.importorskip("auto_round")

FORMATS = ("auto_round", "auto_gptq", "auto_awq", "llm_compressor")


def _tokenizer() -> object:
    """A word-level tokenizer over the tiny models' 128-token vocabulary (AutoRound needs one to calibrate)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {f"t{i}": i for i in range(127)} | {"[UNK]": 127}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", pad_token="[UNK]", eos_token="t0")


@pytest.fixture(scope="module")
def exports(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str], Path]:
    from auto_round import AutoRound
    from transformers import AutoModelForCausalLM

    root = tmp_path_factory.mktemp("autoround")
    tokenizer = _tokenizer()
    texts = [" ".join(f"t{(i * 7 + j) % 127}" for j in range(64)) for i in range(16)]
    out: dict[tuple[str, str], Path] = {}
    for kind in ("llama", "qwen3_moe"):
        base = BUILDERS[kind](root / f"base-{kind}")
        out[(kind, "base")] = base
        for fmt in FORMATS:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                model = AutoModelForCausalLM.from_pretrained(base)
                rounder = AutoRound(model, tokenizer=tokenizer, bits=4, group_size=32, iters=0, dataset=texts,
                                    seqlen=32, nsamples=8)  # fmt: skip
                rounder.quantize_and_save(output_dir=str(root / f"{kind}-{fmt}"), format=fmt)
            written = [p.parent for p in (root / f"{kind}-{fmt}").rglob("config.json")]
            assert len(written) == 1, written
            out[(kind, fmt)] = written[0]
    return out


@pytest.mark.parametrize("kind", ["llama", "qwen3_moe"])
@pytest.mark.parametrize("fmt", FORMATS)
def test_autoround_exports_lint_clean(exports: dict[tuple[str, str], Path], kind: str, fmt: str) -> None:
    result = lint(exports[(kind, fmt)])
    errors = [(f.code, f.message) for f in result.findings if f.severity.name == "ERROR"]
    assert not errors and result.exit_code() == 0, errors


def test_a_lossy_quantizer_is_not_a_partial_write(exports: dict[tuple[str, str], Path], tmp_path: Path) -> None:
    from weightcheck.compare.policy import load_policy
    from weightcheck.diffing import DiffOptions, diff

    base, quantized = exports[("llama", "base")], exports[("llama", "llm_compressor")]
    result = diff(base, quantized)
    codes = {f.code for f in result.findings}
    assert "WC708" not in codes, [(f.code, f.message) for f in result.findings]
    for f in result.findings:
        if f.code == "WC701":
            assert "AutoRound" in f.fix and "stat" in f.fix, f.fix
    policy = tmp_path / "policy.txt"
    policy.write_text("*.weight stat\n")
    lossy = diff(base, quantized, DiffOptions(policy_rules=load_policy(policy)))
    assert lossy.exit_code() == 0, [(f.code, f.message) for f in lossy.findings]


@pytest.mark.parametrize("kind", ["llama", "qwen3_moe"])
@pytest.mark.parametrize("fmt", ["auto_round", "auto_gptq", "auto_awq"])
def test_qweight_packings_hold_the_codes_of_the_compressed_tensors_export(
    exports: dict[tuple[str, str], Path], kind: str, fmt: str
) -> None:
    """The same AutoRound run exported as GPTQ (`auto_gptq`, `auto_round`: v1 zero points stored minus one) and
    as AWQ (`auto_awq`: codes interleaved 0,2,4,6,1,3,5,7) holds the same integer codes as its compressed-tensors
    export, whose dequantizer matches compressed-tensors' own bit for bit: weightcheck.gptq reads every element
    back to the same code; the values differ only by the scale's precision (F16 here, BF16 there)."""
    import json

    import torch
    from safetensors.torch import load_file

    from weightcheck import gptq
    from weightcheck.dequant import dequantize_rows, find_quantized
    from weightcheck.safetensors_header import read_header

    def side(folder: Path) -> tuple[dict, dict, dict]:
        tensors: dict = {}
        headers: dict = {}
        for shard in sorted(folder.glob("*.safetensors")):
            tensors.update(load_file(shard))
            headers.update(read_header(shard).tensors)
        return tensors, headers, json.loads((folder / "config.json").read_text())

    ct_tensors, ct_headers, ct_config = side(exports[(kind, "llm_compressor")])
    reference, _ = find_quantized(ct_headers, ct_config, ct_tensors.__getitem__)
    tensors, headers, config = side(exports[(kind, fmt)])
    found, malformed, unsupported = gptq.find(headers, config)
    assert not malformed and not unsupported and set(found) == set(reference), (malformed, unsupported)
    for name, qt in found.items():
        ours, step = gptq.dequantize_rows(qt, tensors.__getitem__, 0, qt.rows, True)
        ref, _ = dequantize_rows(reference[name], ct_tensors.__getitem__, 0, reference[name].rows)
        assert step is not None and ours.shape == ref.shape
        assert torch.equal(torch.round(ours.float() / step), torch.round(ref.float() / step)), name
        assert float(((ours.float() - ref.float()).abs() / step).max()) < 0.05, name


@pytest.mark.parametrize("fmt", ["auto_round", "auto_gptq", "auto_awq"])
def test_diff_of_the_base_and_a_qweight_export_compares_every_weight(
    exports: dict[tuple[str, str], Path], fmt: str, tmp_path: Path
) -> None:
    """diff BASE EXPORT listed every Linear weight as only in A (WC713) and every qweight/qzeros/scales/g_idx
    as only in B (WC714). Each module is dequantized now: the result is the compressed-tensors export's (the
    lossy-quantizer fix on a few weights), and the stat tier passes. A packing weightcheck does not read (a
    3-bit GPTQ config over these words) is one 'not compared' with the reason (WC715)."""
    import json
    import shutil

    from weightcheck.compare.policy import load_policy
    from weightcheck.diffing import DiffOptions, diff

    base, packed = exports[("llama", "base")], exports[("llama", fmt)]
    result = diff(base, packed)
    codes = {f.code for f in result.findings}
    assert not codes & {"WC713", "WC714", "WC715", "WC708"}, [(f.code, f.message) for f in result.findings]
    assert result.checked["compared"] == result.checked["reference_tensors"]
    policy = tmp_path / "policy.txt"
    policy.write_text("*.weight stat\n")
    assert diff(base, packed, DiffOptions(policy_rules=load_policy(policy))).exit_code() == 0

    odd = Path(shutil.copytree(packed, tmp_path / "odd"))
    config = json.loads((odd / "config.json").read_text())
    config["quantization_config"]["bits"] = 3
    (odd / "config.json").write_text(json.dumps(config))
    skipped = [f for f in diff(base, odd).findings if f.code == "WC715"]
    assert skipped and all("no dequantizer for this packing" in f.message for f in skipped), skipped
    assert sum(f.count for f in skipped) == 4 * 7  # every projection of the 4 layers
