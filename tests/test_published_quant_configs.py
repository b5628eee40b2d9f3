"""Real published quantization configs of architectures outside the hand-written families, each on the
config of its architecture (transformers' own config class, tiny dimensions, with the release's own layer
count and layer types so that per-layer entries name real modules): config-only lint finds no error and
no warning beyond the true ones each entry names, and catches a missing router entry, a partially ignored
fused group and an over-reaching layer regex planted into them.

The configs are in tests/data/published_quant_configs.json: per entry the release (`source`), where its
block was read verbatim (`found_in`) and what was compared (`verified`). No block there is hand-written.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import by_code, run

from weightcheck.findings import Severity

DATA = json.loads((Path(__file__).parent / "data" / "published_quant_configs.json").read_text())
OLD_FAMILIES = {"llama", "qwen2", "qwen3", "qwen2_moe", "qwen3_moe", "glm4_moe", "deepseek_v3", "mixtral", "qwen2_5_vl"}
IDS = [f"{e['model_type']}-{e['source'].split()[0].rsplit('/', 1)[-1]}" for e in DATA]


def _field(entry: dict) -> str:
    from weightcheck.quant.config import parse_quant_spec

    spec = parse_quant_spec({"quantization_config": entry["quantization_config"]})
    assert spec is not None
    return spec.ignore_field


def _ignore(entry: dict) -> list[str]:
    return list(entry["quantization_config"].get(_field(entry)) or [])


def _write(tmp_path: Path, entry: dict, ignore: list[str] | None = None, **text: object) -> Path:
    """config.json (+ hf_quant_config.json for ModelOpt) of the entry, its ignore list optionally replaced."""
    from tools.archgen.tiny import tiny_config
    from weightcheck.patterns import detect_pattern

    cfg = json.loads(tiny_config(entry["model_type"], "D").to_json_string())
    cfg["architectures"] = cfg.get("architectures") or detect_pattern({"model_type": entry["model_type"]}).architectures
    (cfg.get("text_config") or cfg).update({**entry.get("structure", {}), **text})
    quant, hf = entry["quantization_config"], entry.get("hf_quant_config")
    if ignore is not None:
        quant = {**quant, _field(entry): ignore}
        if hf is not None:
            hf = {**hf, "quantization": {**hf["quantization"], "exclude_modules": ignore}}
    cfg["quantization_config"] = quant
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    if hf is not None:
        (tmp_path / "hf_quant_config.json").write_text(json.dumps(hf))
    return tmp_path


def _entries(model_type: str) -> dict:
    return next(e for e in DATA if e["model_type"] == model_type and _ignore(e))


def test_at_least_fifteen_verbatim_sources_outside_the_old_families() -> None:
    assert len(DATA) >= 15
    assert len({e["source"] for e in DATA}) == len(DATA)
    for e in DATA:
        assert e["model_type"] not in OLD_FAMILIES
        assert e["source"] and e["found_in"] and e["verified"].startswith("verbatim"), e["source"]
    assert len({e["model_type"] for e in DATA}) >= 8


@pytest.mark.parametrize("entry", DATA, ids=IDS)
def test_published_config_lints_config_only_clean(tmp_path: Path, entry: dict) -> None:
    result = run(_write(tmp_path, entry))
    expected = entry.get("expected_warnings", {})
    allowed = {c for c in expected}
    unexpected = [
        f"{f.code} {f.message}"
        for f in result.findings
        if f.severity >= Severity.ERROR or (f.severity >= Severity.WARNING and f.code not in allowed)
    ]
    assert unexpected == [], entry["source"]
    # the true warnings each entry names are really raised (so the list cannot go stale)
    assert {c for c in expected if by_code(result, c)} == set(expected)
    assert not by_code(result, "WC429"), "the architecture has a pattern: ignore entries were checked"


def test_published_configs_through_the_cli(tmp_path: Path) -> None:
    for i, entry in enumerate(DATA):
        (tmp_path / str(i)).mkdir()
        path = _write(tmp_path / str(i), entry)
        proc = subprocess.run([sys.executable, "-m", "weightcheck", "lint", str(path), "--format", "json"],
                              capture_output=True, text=True, timeout=120)  # fmt: skip
        assert proc.returncode == 0, (entry["source"], proc.stdout[-2000:], proc.stderr[-2000:])
        found = {f["code"] for f in json.loads(proc.stdout)["findings"]}
        assert found <= set(entry.get("expected_warnings", {})), entry["source"]


# Planted defects, each on a verified base. A router left out of the list is a finding only where some consumer
# quantizes routers: the compressed-tensors configs (slime/miles' online INT4 packs every 2-D weight). The
# fp8, mxfp4 and ModelOpt releases' engines build their routers unquantized, so their lists do not need one.
@pytest.mark.parametrize("model_type", ["qwen3_vl_moe"])
def test_missing_router_entry_is_caught(tmp_path: Path, model_type: str) -> None:
    entry = _entries(model_type)
    kept = [e for e in _ignore(entry) if not e.endswith((".gate", ".router"))]
    assert len(kept) < len(_ignore(entry))
    result = run(_write(tmp_path, entry, kept))
    routers = [f for f in by_code(result, "WC309") if f.details["kind"] == "router"]
    assert routers and routers[0].details["modules"], [f.message for f in result.findings]
    assert not [f for f in by_code(run(_write(tmp_path, entry)), "WC309") if f.details["kind"] == "router"]


@pytest.mark.parametrize("model_type", ["gpt_oss", "minimax_m2", "qwen3_next", "qwen3_5_moe", "qwen3_5", "qwen3_vl"])
def test_partially_ignored_fused_group_is_caught(tmp_path: Path, model_type: str) -> None:
    from weightcheck.patterns import detect_pattern

    pattern = detect_pattern({"model_type": model_type})
    entry = _entries(model_type)
    layer = 3 if model_type in ("qwen3_next", "qwen3_5_moe", "qwen3_5") else 0  # hybrids: layer 3 has attention
    module = f"{pattern.layer_prefix}.{layer}.self_attn.q_proj"
    kept = [e for e in _ignore(entry) if "self_attn" not in e]
    result = run(_write(tmp_path, entry, [*kept, module]))
    hits = by_code(result, "WC311")
    assert hits and module.rsplit(".", 1)[0] in hits[0].message, [f.message for f in result.findings]
    assert not by_code(run(_write(tmp_path, entry, kept)), "WC311")


@pytest.mark.parametrize(
    "model_type", ["gpt_oss", "minimax_m2", "qwen3_next", "qwen3_5_moe", "qwen3_5", "qwen3_vl_moe", "qwen3_vl"]
)
def test_overreaching_layer_regex_is_caught(tmp_path: Path, model_type: str) -> None:
    """In each method's own syntax: `re:` for compressed-tensors; a plain entry where the readers take it as a
    prefix (transformers' `modules_to_not_convert` is a start-anchored regex, vLLM ModelOpt a substring)."""
    from weightcheck.patterns import detect_pattern

    pattern = detect_pattern({"model_type": model_type})
    entry = _entries(model_type)
    ct = entry["quantization_config"].get("quant_method") == "compressed-tensors"
    planted = f"re:{pattern.layer_prefix}.1.*" if ct else f"{pattern.layer_prefix}.1"
    result = run(_write(tmp_path, entry, [*_ignore(entry), planted]))
    [hit] = [f for f in by_code(result, "WC305") if f.location.tensor == planted]
    assert "layers {10..19}" in hit.message  # the release's own layer count: layers 10-19 exist
    if ct:
        bounded = f"re:{pattern.layer_prefix.replace('.', chr(92) + '.')}\\.1\\..*"
        assert not by_code(run(_write(tmp_path, entry, [*_ignore(entry), bounded])), "WC305")


def test_wc302_own_module_shortcut_changes_no_finding(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """WC302 passes an entry that is itself a module's name without matching the whole list
    (`rules.quant._names_own_module`); on every published config, with planted entries beside them and on the
    shipped samples, the findings are what matching every entry for every reader gives."""
    import weightcheck.rules.quant as quant_rules

    root = Path(__file__).resolve().parents[1]
    targets = [root / "sample_configs" / name for name in sorted(p.name for p in (root / "sample_configs").iterdir())
               if (root / "sample_configs" / name).is_dir()]  # fmt: skip
    for i, entry in enumerate(DATA):
        planted = [*_ignore(entry), "model.layers.0.mlp.gaet", "re:layers.*", "lm_head", "model.embed_tokens"]
        for name, ignore in ((f"{i}", None), (f"{i}p", planted)):
            (tmp_path / name).mkdir()
            targets.append(_write(tmp_path / name, entry, ignore))

    def findings() -> list[list[tuple[str, str]]]:
        return [sorted((f.code, f.message) for f in run(t).findings if f.code.startswith("WC3")) for t in targets]

    passed: list[str] = []
    original = quant_rules._names_own_module

    def counted(qa: object, entry: str) -> bool:
        if original(qa, entry):
            passed.append(entry)
            return True
        return False

    monkeypatch.setattr(quant_rules, "_names_own_module", counted)
    with_shortcut = findings()
    assert len(passed) > 50  # the shortcut does pass entries on these configs
    monkeypatch.setattr(quant_rules, "_names_own_module", lambda qa, e: False)
    assert findings() == with_shortcut
