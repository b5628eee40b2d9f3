"""Regression tests for hostile inputs a mutation fuzzer found (weightcheck issue #10): reads outside the
target, hangs, memory blow-ups, internal errors and silent passes. Each case mutates real artefacts
(transformers checkpoints, tap records, trainer manifests: tests/fuzzing.py) and runs the CLI in a
subprocess under an address-space limit, a time limit and an `open` audit (tests/fuzz_child.py)."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from pathlib import Path

import pytest
from fuzzing import HUGE_DIGITS, Case, build_corpus, dumps, new_case, read_shard, run_case, write_shard

# Header-only lint needs no torch; a low cap makes a blow-up show quickly. torch's import alone maps ~1.5 GB.
LINT_MEM = 1536 * 1024**2
TORCH_MEM = 3 * 1024**3


@pytest.fixture(scope="session")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_corpus(tmp_path_factory.mktemp("fuzz-corpus") / "corpus")


def codes(out: str) -> set[str]:
    return {f["code"] for f in json.loads(out)["findings"]}


def messages(out: str) -> str:
    return "\n".join(f"{f['code']} {f['message']}" for f in json.loads(out)["findings"])


def hostile(
    corpus: Path,
    tmp_path: Path,
    parts: tuple[str, ...],
    setup: Callable[[Case], None],
    argv: list[str],
    *,
    mem: int = LINT_MEM,
    rc: set[int] = frozenset({1}),
) -> str:
    case = new_case(corpus, tmp_path / "case", "regression", parts)
    setup(case)
    case.argv = [*argv, "--format", "json"]
    outcome = run_case(case, mem=mem)
    assert outcome.violations == [], (outcome.violations, outcome.stderr[-2000:])
    assert outcome.rc in rc, (outcome.rc, outcome.stdout[-2000:], outcome.stderr[-2000:])
    return outcome.stdout


def edit_json(path: Path, edit: Callable[[dict], None]) -> None:
    doc = json.loads(path.read_text())
    edit(doc)
    path.write_text(dumps(doc))


def plain(config: dict) -> dict:
    """The MoE config without its quantization section (lint then needs no compressed-tensors/torch)."""
    config.pop("quantization_config", None)
    return config


def record_file(case: Case) -> Path:
    return next((case.root / "records").rglob("*.jsonl"))


def edit_record(case: Case, edit: Callable[[list[dict]], None]) -> None:
    path = record_file(case)
    lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    edit(lines)
    path.write_text("\n".join(dumps(line) for line in lines) + "\n")


# ---- reads outside the target ------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["config.json", "model.safetensors.index.json", "generation_config.json",
                                  "hf_quant_config.json"])  # fmt: skip
@pytest.mark.parametrize("where", ["honeypot", "/proc/self/environ"])
def test_json_side_file_symlinked_out_of_the_checkpoint_is_refused(
    corpus: Path, tmp_path: Path, name: str, where: str
) -> None:
    def setup(case: Case) -> None:
        victim = case.root / "ckpt" / name
        victim.unlink(missing_ok=True)
        victim.symlink_to(case.honeypot / "config.json" if where == "honeypot" else where)

    out = hostile(corpus, tmp_path, ("ckpt",), setup, ["lint", "ckpt"])
    assert "outside the checkpoint" in messages(out)


def test_verify_refuses_symlinked_record_sync_folder_manifest_part_and_kept_tensors(
    corpus: Path, tmp_path: Path
) -> None:
    def setup(case: Case) -> None:
        records = case.root / "records"
        (records / "sync-00001").symlink_to(case.honeypot / "sync-00000", target_is_directory=True)
        sync0 = records / "sync-00000"
        (sync0 / "z.jsonl").symlink_to(case.honeypot / "secret.jsonl")
        kept = next(sync0.glob("*.safetensors"))
        kept.unlink()
        kept.symlink_to("/etc/passwd")
        (case.root / "manifest" / "part-2.json").symlink_to(case.honeypot / "secret.json")

    out = hostile(corpus, tmp_path, ("records", "manifest"), setup, ["verify", "records", "--against", "manifest"])
    text = messages(out)
    assert "sync folder sync-00001" in text and "outside the records folder" in text
    assert "z.jsonl" in text and "part-2.json" in text


# ---- hangs ------------------------------------------------------------------------------------------------------


def test_catastrophic_or_overflowing_ignore_regexes_finish(corpus: Path, tmp_path: Path) -> None:
    entries = ["re:(.+)+!", "re:(a|aa)+$", "re:" + "(x+x+)+y", "re:(?=m)(.*)*x", "re:a{99999999999}"]

    def setup(case: Case) -> None:
        edit_json(case.root / "moe" / "config.json", lambda d: d["quantization_config"]["ignore"].extend(entries))

    out = hostile(corpus, tmp_path, ("moe",), setup, ["lint", "moe"], mem=TORCH_MEM)
    refused = {f["location"]["tensor"]: f["message"] for f in json.loads(out)["findings"] if f["code"] == "WC303"}
    # RE2 runs the first three in linear time; the lookahead one cannot be run safely; the last overflows.
    assert set(refused) == {"re:(?=m)(.*)*x", "re:a{99999999999}"}, refused
    assert "cannot be evaluated safely" in refused["re:(?=m)(.*)*x"]


def test_modelopt_exclude_modules_cannot_hang(corpus: Path, tmp_path: Path) -> None:
    def setup(case: Case) -> None:
        edit_json(case.root / "moe" / "config.json", lambda d: d.pop("quantization_config"))
        quant = {"quant_algo": "FP8", "exclude_modules": ["re:(.+)+!", "*" * 5000, "*a" * 300 + "x", "(a|aa)+$"]}
        (case.root / "moe" / "hf_quant_config.json").write_text(
            json.dumps({"producer": {"name": "modelopt"}, "quantization": quant})
        )

    hostile(corpus, tmp_path, ("moe",), setup, ["lint", "moe"], rc={0, 1})


def test_verify_against_a_fifo_is_a_finding_not_a_hang(corpus: Path, tmp_path: Path) -> None:
    out = hostile(corpus, tmp_path, ("records",), lambda c: os.mkfifo(c.root / "pipe.json"),
                  ["verify", "records", "--against", "pipe.json"])  # fmt: skip
    assert "WC721" in codes(out) and "not a regular file" in messages(out)


def test_index_with_many_distinct_shard_names(corpus: Path, tmp_path: Path) -> None:
    def setup(case: Case) -> None:
        many = {f"g.{i}.weight": f"s-{i}.safetensors" for i in range(20_000)}  # quadratic would be 4e8 steps
        edit_json(case.root / "ckpt" / "model.safetensors.index.json", lambda d: d["weight_map"].update(many))

    hostile(corpus, tmp_path, ("ckpt",), setup, ["lint", "ckpt"])


# ---- memory ------------------------------------------------------------------------------------------------------


def test_plausible_layer_and_expert_counts_whose_product_is_not(corpus: Path, tmp_path: Path) -> None:
    def setup(case: Case) -> None:
        counts = dict(num_hidden_layers=1000, num_experts=1000, mlp_only_layers=[], decoder_sparse_step=1)
        edit_json(case.root / "moe" / "config.json", lambda d: plain(d).update(counts))

    hostile(corpus, tmp_path, ("moe",), setup, ["lint", "moe"])


def test_string_times_huge_number_in_a_shape_expression(corpus: Path, tmp_path: Path) -> None:
    def setup(case: Case) -> None:
        edit_json(case.root / "ckpt" / "config.json", lambda d: d.update(num_attention_heads="aaaa", head_dim=10**12))

    hostile(corpus, tmp_path, ("ckpt",), setup, ["lint", "ckpt"])


@pytest.mark.parametrize(("key", "value"), [("tp_size", 10**9), ("experts_local", 10**12), ("tp_rank", "a"),
                                            ("pp_rank", 1.5), ("ep_size", -3)])  # fmt: skip
def test_record_counts_and_rank_fields(corpus: Path, tmp_path: Path, key: str, value: object) -> None:
    def setup(case: Case) -> None:
        def edit(lines: list[dict]) -> None:
            lines[0].setdefault("rank", {})
            if isinstance(lines[0]["rank"], dict):
                lines[0]["rank"][key] = value
            for line in lines:
                if line.get("t") == "param":
                    line[key] = value

        edit_record(case, edit)

    hostile(corpus, tmp_path, ("records", "manifest"), setup, ["verify", "records", "--against", "manifest"],
            rc={0, 1})  # fmt: skip


def test_manifest_part_claiming_10_to_the_12_layers(corpus: Path, tmp_path: Path) -> None:
    def setup(case: Case) -> None:
        edit_json(
            case.root / "manifest" / "part-1.json", lambda d: d.setdefault("trainer", {}).update(num_layers=10**12)
        )

    hostile(corpus, tmp_path, ("records", "manifest"), setup, ["verify", "records", "--against", "manifest"],
            rc={0, 1})  # fmt: skip


def test_index_with_a_million_ghost_entries(corpus: Path, tmp_path: Path) -> None:
    def setup(case: Case) -> None:
        def edit(d: dict) -> None:
            shard = next(iter(d["weight_map"].values()))
            d["weight_map"].update({f"model.layers.{i}.mlp.experts.{i}.w.weight": shard for i in range(1_000_000)})

        edit_json(case.root / "ckpt" / "model.safetensors.index.json", edit)

    hostile(corpus, tmp_path, ("ckpt",), setup, ["lint", "ckpt"], mem=2 * 1024**3)


# ---- internal errors ------------------------------------------------------------------------------------------------


def test_5000_digit_layer_and_expert_ids_in_tensor_names_lint(corpus: Path, tmp_path: Path) -> None:
    def setup(case: Case) -> None:
        shard = sorted((case.root / "moe").glob("*.safetensors"))[1]
        header, data = read_shard(shard)
        for name in [k for k in header if "layers." in k][:3]:
            header[re.sub(r"layers\.\d+", f"layers.{HUGE_DIGITS}", name)] = header.pop(name)
        name = next(k for k in header if ".experts." in k)
        header[re.sub(r"experts\.\d+", f"experts.{HUGE_DIGITS}", name)] = header.pop(name)
        write_shard(shard, dumps(header), data)
        edit_json(case.root / "moe" / "config.json", plain)

    hostile(corpus, tmp_path, ("moe",), setup, ["lint", "moe"])


def test_5000_digit_layer_id_in_a_record(corpus: Path, tmp_path: Path) -> None:
    def setup(case: Case) -> None:
        def edit(lines: list[dict]) -> None:
            for line in lines:
                if isinstance(line.get("name"), str) and "layers." in line["name"]:
                    line["name"] = re.sub(r"layers\.\d+", f"layers.{HUGE_DIGITS}", line["name"])
                    break

        edit_record(case, edit)
        (case.root / "records" / f"sync-{'7' * 200}").mkdir()  # a file name cannot hold 5,000 digits

    hostile(corpus, tmp_path, ("records", "manifest"), setup, ["verify", "records", "--against", "manifest"])


@pytest.mark.parametrize(
    "edit",
    [
        {"mlp_only_layers": 5},
        {"decoder_sparse_step": 0},
        {"decoder_sparse_step": "a"},
        {"num_hidden_layers": "1e400"},
        {"num_experts": -1},
        {"first_k_dense_replace": [1]},
        {"moe_layer_freq": 0},
    ],
    ids=repr,
)
def test_config_values_of_the_wrong_type_or_range(corpus: Path, tmp_path: Path, edit: dict) -> None:
    hostile(corpus, tmp_path, ("moe",), lambda c: edit_json(c.root / "moe" / "config.json",
                                                            lambda d: plain(d).update(edit)),
            ["lint", "moe"], rc={0, 1})  # fmt: skip


@pytest.mark.parametrize("raw", ["1e400", "NaN", "-5", '"big"', "1" + "0" * 5000], ids=lambda r: r[:8])
def test_total_size_1e400_negative_and_huge(corpus: Path, tmp_path: Path, raw: str) -> None:
    path = "ckpt/model.safetensors.index.json"

    def setup(case: Case) -> None:
        text = (case.root / path).read_text()
        (case.root / path).write_text(re.sub(r'"total_size": \d+', f'"total_size": {raw}', text))

    # A wrong total_size is a warning (real-world variance), so a negative one may exit 0; never 2.
    out = hostile(corpus, tmp_path, ("ckpt",), setup, ["lint", "ckpt"], rc={0, 1})
    assert {"WC205"} <= codes(out) or "WC201" in codes(out) or "invalid JSON" in messages(out), messages(out)


@pytest.mark.parametrize(
    "quant",
    [
        {"targets": 5, "ignore": 5},
        {"config_groups": {"group_0": {"targets": 5, "weights": {"num_bits": 4, "block_structure": "\u0663x1"}},
                           "group_1": {"targets": ["Linear"], "weights": {"num_bits": 8, "block_structure": "\u00b2x1",
                                                                          "type": "float", "strategy": "block"}}}},
        {"quant_method": "fp8", "weight_block_size": ["\u0663", 1]},
    ],
    ids=["targets-ignore-5", "block-structure-digits", "fp8-block-size"],
)  # fmt: skip
def test_quantization_config_values_of_the_wrong_type(corpus: Path, tmp_path: Path, quant: dict) -> None:
    hostile(corpus, tmp_path, ("moe",),
            lambda c: edit_json(c.root / "moe" / "config.json", lambda d: d["quantization_config"].update(quant)),
            ["lint", "moe"], mem=TORCH_MEM, rc={0, 1})  # fmt: skip


def test_shard_that_is_a_symlink_loop(corpus: Path, tmp_path: Path) -> None:
    def setup(case: Case) -> None:
        shard = sorted((case.root / "ckpt").glob("*.safetensors"))[0]
        shard.unlink()
        shard.symlink_to(shard.name + ".b")
        (shard.parent / (shard.name + ".b")).symlink_to(shard.name)

    out = hostile(corpus, tmp_path, ("ckpt",), setup, ["lint", "ckpt"])
    assert "symlink loop" in messages(out)


# ---- silent passes --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["fifo", "loop"])
def test_fifo_or_loop_among_records_is_a_finding(corpus: Path, tmp_path: Path, kind: str) -> None:
    def setup(case: Case) -> None:
        sync = case.root / "records" / "sync-00000"
        if kind == "fifo":
            os.mkfifo(sync / "pipe.jsonl")
        else:
            (sync / "loop.jsonl").symlink_to("loop.jsonl")

    out = hostile(corpus, tmp_path, ("records", "manifest"), setup, ["verify", "records", "--against", "manifest"])
    assert "WC720" in codes(out)


def test_diff_candidate_routing_through_an_escaping_directory_symlink(corpus: Path, tmp_path: Path) -> None:
    def setup(case: Case) -> None:
        import shutil

        shutil.copytree(case.root / "ckpt", case.root / "cand")
        (case.root / "cand" / "sub").symlink_to(case.honeypot, target_is_directory=True)

        def edit(d: dict) -> None:
            name = next(iter(d["weight_map"]))
            d["weight_map"][name] = "sub/secret.safetensors"
            d["metadata"]["total_size"] = -1

        edit_json(case.root / "cand" / "model.safetensors.index.json", edit)

    hostile(corpus, tmp_path, ("ckpt",), setup, ["diff", "ckpt", "cand"], mem=TORCH_MEM)


def test_5000_digit_layer_id_in_a_manifest_part(corpus: Path, tmp_path: Path) -> None:
    """Found by the long fuzzing run: a shift search compared a bounded id (None) with an int."""

    def setup(case: Case) -> None:
        def edit(d: dict) -> None:
            name = sorted(n for n in d["tensors"] if "layers." in n)[0]
            d["tensors"][re.sub(r"layers\.\d+", f"layers.{HUGE_DIGITS}", name)] = d["tensors"].pop(name)

        edit_json(case.root / "manifest" / "part-0.json", edit)

    hostile(corpus, tmp_path, ("records", "manifest"), setup, ["verify", "records", "--against", "manifest"])
