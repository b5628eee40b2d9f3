"""WC307 and the output head under its architecture's own name (GPT-NeoX's `embed_out`).

llm-compressor's FP8 of GPT-NeoX with the usual `ignore: ["lm_head"]` leaves the head, `embed_out`, in BF16 and
out of the ignore list. The engines build it as their LM head, not as a quantized Linear, so it is not a
"targeted Linear stored unquantized"; a real Linear left in BF16 the same way still is.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest
from factories import edit_tensors, llmcompressor_fp8_dynamic
from helpers import by_code, run

from weightcheck.findings import Severity

pytest.importorskip("llmcompressor")
logging.getLogger("transformers").setLevel(logging.ERROR)


def test_the_head_under_the_pattern_own_name_is_not_a_targeted_linear(tmp_path: Path) -> None:
    import torch

    path = llmcompressor_fp8_dynamic("gpt_neox", tmp_path, ["lm_head"])
    assert json.loads((path / "config.json").read_text()).get("tie_word_embeddings") is False
    assert by_code(run(path), "WC307") == []
    assert [f for f in run(path).findings if f.severity >= Severity.ERROR] == []

    victim = "gpt_neox.layers.1.attention.dense"

    def unquantize(tensors: dict[str, Any]) -> None:  # a Linear the converter left in BF16
        tensors[f"{victim}.weight"] = tensors[f"{victim}.weight"].to(torch.bfloat16)
        del tensors[f"{victim}.weight_scale"]

    edit_tensors(path, unquantize)
    found = by_code(run(path), "WC307")
    assert [f.severity for f in found] == [Severity.ERROR] and victim in found[0].message
