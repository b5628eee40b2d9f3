"""`names.group_by_template` inlines `name_template` for `<head>.layers.<id>.<tail>` names; on any name it
must give the template and ids `name_template` gives, in the names' first-seen order of templates."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from weightcheck.names import expand_template, group_by_template, name_template

# Pieces that make the fast path's edge cases likely: `.layers.` at the start, twice, without an id or tail,
# ids with non-ASCII digits, expert containers after the layer id.
PIECES = st.sampled_from(
    [".layers.", "layers.", "model", "mtp", ".", "3", "12", "0", "٣", "²", "experts.", "mlp.", "weight", "h.", "x"]
)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.lists(PIECES, min_size=1, max_size=8).map("".join), min_size=1, max_size=30))
def test_group_by_template_matches_name_template(names: list[str]) -> None:
    groups = group_by_template(names)
    expected: dict[tuple[str, ...], list[tuple[str, tuple[str, ...]]]] = {}
    for name in names:
        parts, values = name_template(name)
        expected.setdefault(parts, []).append((name, values))
    assert list(groups.items()) == list(expected.items())
    for parts, members in groups.items():
        for name, values in members:
            assert expand_template(parts, values) == name


def test_fast_path_examples() -> None:
    names = ["model.layers.3.mlp.experts.7.down_proj.weight", "model.layers.x.y", ".layers.3.a", "a.layers.3",
             "a.layers.3.b.layers.4.c", "model.layers.٣.a", "model.layers.03.a"]  # fmt: skip
    test_group_by_template_matches_name_template.hypothesis.inner_test(names)  # type: ignore[attr-defined]
    groups = group_by_template(names)
    assert groups[("model.layers.", ".mlp.experts.", ".down_proj.weight")] == [
        ("model.layers.3.mlp.experts.7.down_proj.weight", ("3", "7"))
    ]
    assert groups[("a.layers.", ".b.layers.4.c")] == [("a.layers.3.b.layers.4.c", ("3",))]
