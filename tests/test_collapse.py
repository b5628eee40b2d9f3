from weightcheck.collapse import collapse_names, format_ranges, summarize


def test_format_ranges() -> None:
    assert format_ranges([7, 0, 1, 2, 3, 9, 10]) == "0..3,7,9..10"
    assert format_ranges([]) == ""


def test_collapse_layers() -> None:
    names = [f"model.layers.{i}.mlp.gate.weight" for i in range(48)]
    assert collapse_names(names) == ["model.layers.{0..47}.mlp.gate.weight"]


def test_collapse_layers_and_experts() -> None:
    names = [f"model.layers.{i}.mlp.experts.{e}.down_proj.weight" for i in range(4) for e in range(128)]
    assert collapse_names(names) == ["model.layers.{0..3}.mlp.experts.{0..127}.down_proj.weight"]
    uneven = [*names, "model.layers.5.mlp.experts.3.down_proj.weight"]
    assert collapse_names(uneven) == [
        "model.layers.5.mlp.experts.3.down_proj.weight",
        "model.layers.{0..3}.mlp.experts.{0..127}.down_proj.weight",
    ]


def test_collapse_keeps_distinct_suffixes_apart() -> None:
    names = ["a.0.x", "a.1.x", "a.0.y"]
    assert collapse_names(names) == ["a.0.y", "a.{0..1}.x"]


def test_summarize_truncates() -> None:
    names = [f"m.{i}.w{i}" for i in range(10)]
    out = summarize(names, limit=3)
    assert out.endswith("(+7 more patterns)")
