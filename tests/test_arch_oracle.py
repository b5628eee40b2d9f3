"""Conformance oracle (issue #18): for every generated model type, what lint expects for a config equals what
transformers' own model class writes for it, on published configs (reduced only in counts) and on
property-based configs that vary every config key the model reads.

"What the class writes" is built on the meta device and named as `save_pretrained` names it
(weightcheck.arch.oracle, checked against a real save below); the checkpoint is a sparse safetensors file
with exactly those names and shapes (headers only, no data written), linted through the public API. The
verdict must be clean: no finding of warning or above. Configs outside what a pattern was validated on are
linted twice: with transformers (expectations from the class) and torch-free (`WEIGHTCHECK_ARCH_ORACLE=0`:
the pattern's findings at most warnings, never errors).
"""

from __future__ import annotations

import json
import logging
import os
import struct
from pathlib import Path
from typing import Any

import pytest
from helpers import run
from hypothesis import HealthCheck, given, reject, settings
from hypothesis import strategies as st
from oracle_configs import PUBLISHED, published_configs, reduce_counts

from weightcheck.findings import Severity
from weightcheck.patterns import ORACLE_ENV, generated_model_types

pytest.importorskip("transformers")
ORACLE = pytest.mark.oracle  # the heavy half: scripts/ci-groups/26-arch-oracle.sh
logging.getLogger("transformers").setLevel(logging.ERROR)

TYPES = generated_model_types()
OUTSIDE = "outside what pattern"


# ---- checkpoints with the names and shapes the class writes ---------------------------------------------


def write_sparse_checkpoint(path: Path, config: dict[str, Any], shapes: dict[str, tuple[int, ...]]) -> Path:
    """config.json + one safetensors file holding `shapes` (F32). The data section is a hole (truncate):
    a valid file for every header-level check, at no disk cost."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config))
    header: dict[str, Any] = {}
    offset = 0
    for name in sorted(shapes):
        n = 4
        for d in shapes[name]:
            n *= d
        header[name] = {"dtype": "F32", "shape": list(shapes[name]), "data_offsets": [offset, offset + n]}
        offset += n
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    with open(path / "model.safetensors", "wb") as fh:
        fh.write(struct.pack("<Q", len(raw)) + raw)
        fh.truncate(8 + len(raw) + offset)
    return path


def _problems(result: Any, floor: Severity = Severity.WARNING) -> list[str]:
    # WC404: MTP/NextN layers the config declares and save_pretrained never writes; the one warning
    # issue #18 keeps (a NextN draft would need them).
    return [f"{f.code} {f.message[:300]}" for f in result.findings if f.severity >= floor and f.code != "WC404"]


def verdict(tmp: Path, config_obj: Any, as_written: dict[str, Any] | None = None) -> tuple[list[str], bool]:
    """Lint the class's own output for this config: (problems, outside coverage). Outside coverage also
    lints torch-free, where only errors count as problems. `as_written`: the config.json to store instead of
    what save_pretrained writes (a Hub file as published, keys left out, aliases and all)."""
    from weightcheck.arch.oracle import expected_tensors

    config = as_written if as_written is not None else json.loads(config_obj.to_json_string())  # the diff form
    shapes, _ = expected_tensors(json.loads(config_obj.to_json_string(use_diff=False)))
    path = write_sparse_checkpoint(tmp, config, shapes)
    result = run(path)
    problems = _problems(result)
    outside = any(OUTSIDE in n for n in result.notes)
    if outside:
        os.environ[ORACLE_ENV] = "0"
        try:
            light = run(path)
        finally:
            del os.environ[ORACLE_ENV]
        problems += [f"torch-free: {p}" for p in _problems(light, Severity.ERROR)]
    return problems, outside


# ---- the oracle itself against a real save ---------------------------------------------------------------


@pytest.mark.parametrize("model_type", ["qwen3_moe", "gpt_oss", "deepseek_v2", "gemma3", "gpt_neox", "llama4",
                                        "qwen3_vl_moe", "granitemoe", "nemotron_h"])  # fmt: skip
def test_meta_names_equal_a_real_save_pretrained(tmp_path: Path, model_type: str) -> None:
    from safetensors import safe_open

    from tools.archgen.tiny import build, tiny_config
    from weightcheck.arch.oracle import meta_model, saved_shapes

    predicted = saved_shapes(meta_model(tiny_config(model_type, "D")))
    build(model_type, "D").save_pretrained(tmp_path, max_shard_size="10MB")
    written: dict[str, tuple[int, ...]] = {}
    for file in tmp_path.glob("*.safetensors"):
        with safe_open(str(file), framework="pt") as fh:
            written.update({k: tuple(fh.get_slice(k).get_shape()) for k in fh.keys()})
    assert predicted == written


def test_sparse_checkpoint_is_what_lint_reads(tmp_path: Path) -> None:
    """The verdict can fail: a weight left out of the oracle's own output is reported."""
    from tools.archgen.tiny import tiny_config
    from weightcheck.arch.oracle import build_config, expected_tensors

    cfg = json.loads(tiny_config("qwen3", "D").to_json_string(use_diff=False))
    shapes, _ = expected_tensors(cfg)
    assert _problems(run(write_sparse_checkpoint(tmp_path / "good", cfg, shapes))) == []
    victim = next(n for n in shapes if n.endswith("self_attn.k_proj.weight"))
    bad = {n: s for n, s in shapes.items() if n != victim}
    missing = _problems(run(write_sparse_checkpoint(tmp_path / "bad", cfg, bad)))
    assert any("WC410" in p and "k_proj" in p for p in missing), missing
    wrong = {**shapes, victim: (shapes[victim][0] + 1, shapes[victim][1])}
    assert any("WC501" in p for p in _problems(run(write_sparse_checkpoint(tmp_path / "shape", cfg, wrong))))
    assert build_config(cfg).model_type == "qwen3"


# ---- published configs, reduced in counts ------------------------------------------------------------------

# Published configs expected to fail (Kimi Linear's `q_lora_rank: null` default is outside coverage since
# weightcheck.patterns.outside_coverage stopped counting `null` as an int; its MLA q_proj comes from the class).
# MiniCPM3-4B: the oracle cannot build the class's output, so there is nothing to compare against (not a lint
# finding): transformers' MiniCPM3Attention scales by yarn_apply_mscale(), which reads rope_parameters["factor"]
# for any non-default rope type, and the published longrope block has no `factor` (KeyError at model build).
_KNOWN: dict[tuple[str, int], str] = {
    ("minicpm3", 0): "transformers MiniCPM3 cannot build the published longrope config (no rope factor: KeyError)",
}
PUBLISHED_CASES = [
    pytest.param(t, i, marks=pytest.mark.xfail(strict=True, reason=_KNOWN[(t, i)])) if (t, i) in _KNOWN else (t, i)
    for t in TYPES for i in range(len(published_configs(t)))
] if TYPES else []  # fmt: skip


def test_every_generated_type_has_a_published_config() -> None:
    """Every generated type has a real published config.json vendored (tests/data/oracle_configs.json), except
    the types listed in oracle_configs.NO_PUBLISHED_CONFIG, each with where it was looked for; a type that
    gains one must leave the list (the list may only shrink)."""
    from oracle_configs import NO_PUBLISHED_CONFIG

    assert TYPES and all(published_configs(t) for t in TYPES)
    vendored = {e["model_type"] for e in PUBLISHED}
    assert vendored <= set(TYPES), vendored - set(TYPES)
    missing = set(TYPES) - vendored
    assert missing == set(NO_PUBLISHED_CONFIG), (missing - set(NO_PUBLISHED_CONFIG), set(NO_PUBLISHED_CONFIG) - missing)
    for e in PUBLISHED:
        assert e["source"].startswith("https://huggingface.co/") and e["found_in"], e
        assert e["found_in"].startswith(("github.com/", "huggingface.co/")), e["found_in"]
        assert e["config"].get("model_type") == e["model_type"], e["source"]


@ORACLE
@pytest.mark.parametrize("as_published", [False, True], ids=["re-saved", "as-published"])
@pytest.mark.parametrize(("model_type", "which"), PUBLISHED_CASES)
def test_published_config_lints_clean(tmp_path: Path, model_type: str, which: int, as_published: bool) -> None:
    """Reduced in counts, with config.json as transformers re-saves it and (`as_published`) as the Hub
    publishes it: keys left out mean the class's defaults (Gemma's tie_word_embeddings: true, no lm_head
    stored), aliases from the class's attribute_map (Qwen3-VL's `num_experts`), values the class derives
    (head_dim) left to the class. Each was a false error on a clean published checkpoint before."""
    from weightcheck.arch.oracle import build_config

    source, cfg = published_configs(model_type)[which]
    if as_published and not source.startswith("https://"):
        pytest.skip("transformers' own defaults (a full to_dict with derived values), not a published file")
    reduced = reduce_counts(cfg)
    reduced.setdefault("model_type", model_type)
    problems, _ = verdict(tmp_path, build_config(reduced), as_written=reduced if as_published else None)
    assert problems == [], source


@ORACLE
@pytest.mark.parametrize("entry", PUBLISHED, ids=lambda e: f"{e['model_type']}:{e['source'].split('/')[-1][:40]}")
def test_published_config_at_full_size_lints_clean(tmp_path: Path, entry: dict[str, Any]) -> None:
    """The published config.json unreduced, as the Hub ships it, over the names and shapes the class builds
    for it on the meta device (header-only: the data is a file hole). Reducing counts can hide a size the
    pattern gets wrong: microsoft/Phi-tiny-MoE-instruct's head_dim 128 is not hidden_size / heads."""
    from weightcheck.arch.oracle import OracleError, build_config

    raw = json.loads(json.dumps(entry["config"]))
    raw.pop("quantization_config", None)  # the weights here are unquantized
    try:
        problems, _ = verdict(tmp_path, build_config(raw), as_written=raw)
    except OracleError as exc:  # transformers itself cannot build it (MiniCPM3-4B's rope settings)
        pytest.skip(f"transformers cannot build {entry['source']}: {exc}")
    assert problems == [], entry["source"]


# ---- property-based configs: every key the model reads, varied -------------------------------------------


def _read_keys(model_type: str, variant: str) -> tuple[dict[str, Any], list[str], int]:
    from tools.archgen.generate import _sub_config, _text_config, traced_reads, value_only
    from tools.archgen.tiny import tiny_config
    from weightcheck.arch.oracle import full_config_dict

    base = tiny_config(model_type, variant)
    full = full_config_dict(base)
    text = _text_config(full)
    keys = sorted(k for k in traced_reads(base) & set(text)
                  if not value_only(k) and not _sub_config(text[k]) and k != "num_hidden_layers")  # fmt: skip
    return full, keys, int(text["num_hidden_layers"])


def _value_strategy(value: Any, n_layers: int) -> st.SearchStrategy[Any]:
    """Values a config key is drawn from: its own, and the kinds of change issue #18 lists."""
    if isinstance(value, bool):
        return st.booleans()
    if isinstance(value, int):
        return st.sampled_from(sorted({value, max(value - 1, 0), value + 1, 2 * value + 1, 1, 2}))
    if isinstance(value, float):
        return st.sampled_from([value, value * 2 + 0.5])
    if value is None:
        return st.sampled_from([None, 8, 16])
    if isinstance(value, list) and all(isinstance(x, int) and not isinstance(x, bool) for x in value):
        return st.one_of(st.just(value), st.lists(st.integers(0, n_layers - 1), unique=True).map(sorted))
    if isinstance(value, list) and value and all(isinstance(x, str) for x in value):
        kinds = sorted(set(value))
        return st.one_of(st.just(value), st.lists(st.sampled_from(kinds), min_size=len(value), max_size=len(value)))
    return st.just(value)


MIN_GENERATED = 20


def _with_layers(full: dict[str, Any], old_n: int, n: int) -> dict[str, Any]:
    """The config at another depth: per-layer lists cycled to it, layer-index lists cut to it."""
    out = json.loads(json.dumps(full))
    text = out.get("text_config") if isinstance(out.get("text_config"), dict) else out
    for key, value in list(text.items()):
        if isinstance(value, list) and len(value) == old_n and value and not isinstance(value[0], (list, dict)):
            text[key] = [value[i % old_n] for i in range(n)]
        elif isinstance(value, list) and value and all(isinstance(x, int) and not isinstance(x, bool) for x in value):
            text[key] = [x for x in value if x < n]
    if "num_hidden_layers" in text:
        text["num_hidden_layers"] = n
    return out


@ORACLE
@pytest.mark.parametrize("model_type", TYPES)
def test_generated_configs_lint_clean(tmp_path_factory: pytest.TempPathFactory, model_type: str) -> None:
    from tools.archgen.generate import _with
    from weightcheck.arch.oracle import build_config, expected_tensors

    bases = {v: _read_keys(model_type, v) for v in ("A", "B", "C", "D")}  # dimensions vary too
    # Sizes the variants already vary (hidden size, heads, head dims, expert counts...) come from the four
    # variants, whose sizes divide as real ones do; every other key the model reads is drawn.
    texts = {v: (b[0].get("text_config") if isinstance(b[0].get("text_config"), dict) else b[0])
             for v, b in bases.items()}  # fmt: skip
    sizes = {k for k in bases["D"][1] if len({json.dumps(t.get(k)) for t in texts.values()}) > 1
             and all(isinstance(t.get(k), int) and not isinstance(t.get(k), bool) for t in texts.values())}  # fmt: skip
    checked: list[dict[str, Any]] = []
    failures: list[str] = []

    small = len(bases["D"][1]) - len(sizes) <= 1  # few keys to draw: more draws to reach 20 distinct configs
    @settings(max_examples=MIN_GENERATED + (25 if small else 10), derandomize=True, deadline=None, database=None,
              suppress_health_check=list(HealthCheck), phases=[__import__("hypothesis").Phase.generate])  # fmt: skip
    @given(st.data())
    def check(data: st.DataObject) -> None:
        variant = data.draw(st.sampled_from(sorted(bases)), label="dimensions")
        full, keys, old_n = bases[variant]
        n_layers = data.draw(st.integers(1, 7), label="layers")
        full = _with_layers(full, old_n, n_layers)
        text = full.get("text_config") if isinstance(full.get("text_config"), dict) else full
        cfg = full
        changes: dict[str, Any] = {"dimensions": variant, "layers": n_layers}
        for key in keys:
            if key in sizes:
                continue
            value = data.draw(_value_strategy(text.get(key, full.get(key)), n_layers), label=key)
            if value != text.get(key, full.get(key)):
                changes[key] = value
                cfg = _with(cfg, key, value)
        try:
            obj = build_config(cfg)
            expected_tensors(json.loads(obj.to_json_string(use_diff=False)))
        except Exception:
            reject()  # the config class (or the model) refuses the combination: not a config anyone can save
        path = tmp_path_factory.mktemp(model_type)
        problems, outside = verdict(path, obj)
        checked.append({"changes": changes, "outside": outside})
        if problems:
            failures.append(f"{changes}: {problems[:3]}")

    check()
    assert not failures, "\n".join(failures[:5])
    distinct = {json.dumps(c["changes"], sort_keys=True) for c in checked}
    assert len(distinct) >= MIN_GENERATED, (len(distinct), bases["D"][1])
