"""What to change, per rule: the fix text a finding carries when its rule's check gives nothing more
specific. Kept in one table so that rule modules stay about detection; a rule that knows better (the
exact ignore entry, the total_size to write) passes `fix=` with its finding or its `@rule(...)`. diff's WC7xx
rules carry theirs on the Rule object (weightcheck.rules.diff), as new rules should."""

from __future__ import annotations

FIX_TEXTS: dict[str, str] = {
    "WC000": "a weightcheck bug, not a checkpoint defect: rerun with --debug and report the traceback",
    # WC1xx files and shards
    "WC101": "re-download or re-copy the shard (compare its size with the source's); a partial upload or "
    "download is the usual cause",
    "WC102": "re-export the shard with the safetensors library; never hand-edit a header",
    "WC103": "re-export the shard with the safetensors library (its writer lays out offsets from dtype × shape)",
    "WC105": "add the shard's tensors to the index by hand when they belong to the model, or delete the stray "
    "file (which one is right is not mechanical: `lint --fix` leaves it)",
    "WC106": "restore the missing shard files, or remove the files of the other export",
    "WC107": "write a complete config.json (save_pretrained writes one) with model_type, architectures and "
    "num_hidden_layers",
    "WC108": 'rewrite the shard with `__metadata__ = {"format": "pt"}` (safetensors.torch.save_file(..., '
    'metadata={"format": "pt"}))',
    "WC109": "point weightcheck at the folder that holds the .safetensors files; convert pickled .bin weights "
    "to safetensors first",
    # WC2xx index
    "WC204": "keep each tensor in exactly one shard: re-export, or delete the stale copy and its index entry",
    "WC206": "rewrite the entry to a shard file inside the checkpoint folder",
    # WC3xx quantization
    "WC301": "fix the field the validator names; compressed-tensors' QuantizationConfig must accept the config",
    "WC302": "spell the entry as the module name every consumer reads (`re:` regex on module names, no "
    "`.weight`), or remove it",
    "WC303": "fix the regex (it must compile with Python's re) or remove the entry",
    "WC304": "name modules, not parameters: drop the `.weight` / `\\..*` tail, or use the `($|\\..*)` form that "
    "covers both",
    "WC305": "anchor the regex (`layers\\.1\\.` instead of `layers.1`) so it matches only the intended modules",
    "WC306": "either remove the module from the ignore list, or store it unquantized (re-run the quantizer "
    "with it ignored)",
    "WC307": "quantize the module, or add it to the ignore list (it is stored unquantized)",
    "WC308": "store the module unquantized (re-quantize with it in `ignore`): engines build it unquantized and "
    "drop or mis-load the packed tensors",
    "WC309": "add the module (a regex such as `re:.*mlp\\.gate($|\\..*)`) to the ignore list",
    "WC310": "keep lm_head and embeddings unquantized and out of targets, unless every consumer you deploy "
    "to supports it",
    "WC311": "ignore all shards of the fused group (q, k and v; gate and up) or none, and store the group to "
    "match (re-run the quantizer with that ignore list): an ignore edit alone leaves WC306/WC307",
    "WC312": "ignore the fused name (`qkv_proj`, `gate_up_proj`) in addition to its shards",
    "WC313": "re-export the module with every companion its format writes (scale, shape, zero point)",
    "WC314": "re-export the module: the packed weight and its scales come from different quantization runs",
    "WC315": "quantize every expert of the layer with one scheme",
    "WC316": "make config.json's ignore and hf_quant_config.json's exclude_modules list the same modules",
    "WC317": "unfuse the 3-D expert tensor into per-expert `weight_packed` before quantizing",
    "WC318": "replace the class name by a module-name regex (e.g. `re:.*mlp$`)",
    "WC320": "add the module to the ignore list and re-quantize: the engines build it unquantized, so it must be "
    "stored unquantized (`weightcheck lint --fix` adds the entry)",
    "WC339": "check this method's ignore list and companions by hand (weightcheck cannot model its format yet)",
    # WC4xx expected keys
    "WC401": "re-export the missing layers (a pipeline stage that was never gathered, a shard not written)",
    "WC402": "re-export the layers with the keys their peers have",
    "WC403": "re-export the missing experts (an expert-parallel rank not gathered)",
    "WC404": "export the MTP layers, or set the config's MTP count to 0 if the model has none",
    "WC405": "strip the repeated prefix from the tensor names (a wrapper's prefix added twice)",
    "WC406": "drop the extra layers, or raise num_hidden_layers if they are real",
    "WC407": "set tie_word_embeddings to match the checkpoint, or store/drop lm_head.weight accordingly",
    "WC410": "re-export the missing weights, or pass --pattern if the architecture was detected wrongly",
    "WC411": "rename the tensors to the names the architecture uses, or drop them",
    "WC427": "add an architecture pattern for this model_type (`weightcheck lint --pattern FILE`) to check it fully",
    "WC428": "re-export the stacked expert tensors with every expert the config declares (gather all EP ranks)",
    "WC429": "lint the weights (not only the config), or add an architecture pattern for this model_type",
    "WC501": "re-export with the config's dimensions (or fix the config's hidden/intermediate sizes)",
    # WC6xx content
    "WC601": "find the step that produced NaN/Inf (training divergence, a bad conversion) and re-export",
    "WC602": "re-export the weight: all zeros is an initialisation or a failed copy",
    "WC603": "re-quantize: a zero or negative scale dequantizes to zeros or flipped signs",
    "WC604": "re-export the weight: a constant matrix is an initialisation, not trained weights",
    "WC605": "store lm_head equal to the embedding, or set tie_word_embeddings to false",
    "WC606": "re-copy the tensors from the source the manifest describes, or regenerate the manifest if the "
    "change is intended",
    "WC607": "pass a manifest written by `weightcheck lint --content --hash FILE`",
    "WC608": "make the listed shards readable (see the WC1xx findings), then run --content again",
    # WC720–WC749 (live verify): with their rules, in weightcheck/rules/verify.py
}
