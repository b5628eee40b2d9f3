"""An ignore list compiled for one consumer and evaluated over name templates.

`matches(names)` returns, for every name some entry covers, the covering entries (in list order) — exactly
what `Consumer.match` says for each (name, entry) pair, but without evaluating every pair. Names are
grouped by template (`model.layers.{i}.mlp.experts.{e}.down_proj`, `weightcheck.structure`), and each entry
is decided per template:

* **Cannot match** the template at all — for an entry whose consumer matches it as a string (equality,
  prefix, suffix, dotted components, substring), some form of the entry must be a substring of the name
  (or the name of the entry), and then it is also one after every digit run is replaced by `#`, which
  is the same string for every name of a template.
* **Digit-uniform** — an entry with no digit (and no construct that can tell digits apart) answers the
  same for every name of a template whose ids have the same lengths: evaluated once per length class.
* **Specific** — an entry with digits (`model.layers.3.mlp.gate`) is evaluated only on the names whose
  ids can supply its digit runs (`layer == 3`), found through an index of the template's ids.

Every decision that says "match" comes from the consumer's own `match`, or from the same compiled
`re.match` for `re:` entries; the shortcuts only skip pairs that cannot match. `tests/test_compiled.py`
checks the result against evaluating every pair.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Callable, Iterable
from functools import lru_cache, partial

from weightcheck.names import Template, group_by_template, name_template
from weightcheck.quant.matchers import Consumer, _compiled
from weightcheck.quant.safe_regex import SafeRegex

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (lint's start-up, #20)
if TYPE_CHECKING:
    from weightcheck.patterns import ExpectedRun

_RUNS = re.compile(r"\d+")
# Characters that make a transformers entry more than a string with `.` wildcards.
_REGEX_SPECIAL = set("^$*+?{}[]\\|()")


@lru_cache(maxsize=8192)
def abstract(text: str) -> str:
    """Every digit run replaced by `#` (cached: three readers abstract the same entries)."""
    return _RUNS.sub("#", text)


def digit_uniform(text: str) -> bool:
    """True when a pattern built from `text` cannot tell one digit from another: no digit characters (no
    literal digit, digit range, backreference or repeat count), no `\\N{DIGIT ...}` and no named
    backreference. `\\d`, `\\w`, `.` and `[^x]` treat all digits alike, so the result depends only on
    where digits are, not which."""
    # abstract_chars keeps the text exactly when no character is a digit (str.isdigit: `²` too)
    return abstract_chars(text) == text and "\\N" not in text and "(?P=" not in text


class _Group:
    """The names of one template; id indexes are built only for the entries that need them."""

    __slots__ = (
        "_by_value", "_class_names", "_classes", "_members", "_shapes", "abstract", "fixed_runs", "parts", "stripped",
        "targets", "targets_lower",
    )  # fmt: skip

    def __init__(
        self,
        parts: Template,
        members: list[tuple[str, tuple[str, ...]]] | Callable[[], list[tuple[str, tuple[str, ...]]]],
        classes: dict[tuple[int, ...], list[int]] | None = None,
        first: str | None = None,
        class_names: dict[tuple[int, ...], str] | None = None,
    ) -> None:
        """`members`: the (name, ids) list, or a function that makes it (NameSet.from_runs: most groups of a
        config-only lint are never looked into member by member), then with `first` the first member's
        name, `classes` and `class_names` the first member's name of each class."""
        self.parts, self._members = parts, members
        rep = first if first is not None else members[0][0]  # type: ignore[index]
        self._class_names = class_names
        self.abstract = abstract(rep)
        # vLLM ModelOpt also matches with `language_model.` removed once.
        self.stripped = abstract(rep.replace("language_model.", "", 1)) if "language_model." in rep else None
        self.fixed_runs = frozenset(r for p in parts for r in _RUNS.findall(p))
        self.targets = (self.abstract,) if self.stripped is None else (self.abstract, self.stripped)
        self.targets_lower = tuple(t.lower() for t in self.targets)
        self._shapes: list[str] | None = None
        self._classes = classes  # given by NameSet.from_runs; else made on first use
        self._by_value: list[dict[str, list[int]]] | None = None

    @property
    def members(self) -> list[tuple[str, tuple[str, ...]]]:
        if callable(self._members):
            self._members = self._members()
        return self._members

    @property
    def classes(self) -> dict[tuple[int, ...], list[int]]:
        """Member indexes by the lengths of their ids."""
        if self._classes is None:
            classes: dict[tuple[int, ...], list[int]] = defaultdict(list)
            for i, (_, values) in enumerate(self.members):
                classes[tuple(map(len, values))].append(i)
            self._classes = dict(classes)
        return self._classes

    @property
    def class_shapes(self) -> list[str]:
        """One name per id-length class with every digit replaced by `#` (positions kept)."""
        if self._shapes is None:
            if self._class_names is not None:
                self._shapes = [abstract_chars(self._class_names[key]) for key in self.classes]
            else:
                self._shapes = [abstract_chars(self.members[idx[0]][0]) for idx in self.classes.values()]
        return self._shapes

    @property
    def by_value(self) -> list[dict[str, list[int]]]:
        """Per id slot: value -> member indexes."""
        if self._by_value is None:
            self._by_value = [defaultdict(list) for _ in self.parts[1:]]
            for i, (_, values) in enumerate(self.members):
                for k, v in enumerate(values):
                    self._by_value[k][v].append(i)
        return self._by_value


def _members(segments: list[object]) -> list[tuple[str, tuple[str, ...]]]:
    """A group's (name, ids) members from NameSet.from_runs' segments."""
    out: list[tuple[str, tuple[str, ...]]] = []
    for seg in segments:
        if isinstance(seg, list):
            out += seg
            continue
        run_names, head, experts, tail = seg  # type: ignore[misc]
        ids = [str(e) for e in experts]
        if not tail and len(head) == 1:  # the usual (layer, expert)
            layer = head[0]
            out += [(name, (layer, i)) for name, i in zip(run_names, ids, strict=True)]
        else:
            out += [(name, (*head, i, *tail)) for name, i in zip(run_names, ids, strict=True)]
    return out


class NameSet:
    """Names grouped by template once, shared by every consumer's compiled list."""

    def __init__(self, names: Iterable[str]) -> None:
        self.groups = [_Group(parts, members) for parts, members in group_by_template(names).items()]

    @classmethod
    def from_runs(cls, runs: Iterable[ExpectedRun], names: Iterable[list[str]] | None = None) -> NameSet:
        """The NameSet of the runs' module names (`patterns.expand_runs`, each name once; `names`: each run's
        `names()` when the caller has them), grouped as `group_by_template` groups them, in the same order,
        without parsing each expert's name: a run's names differ only in the expert id that fills its `*`,
        so the template of its first and last names says where that id sits for all of them, and the ids'
        lengths (the groups' length classes) follow from the run's range (`tests/test_pattern_runs.py`
        checks the groups equal `NameSet(names)`'s on every shipped pattern)."""
        # Per group: its members as segments (ready lists, or a run's names still to pair with their ids),
        # how many, the first name, the id-length classes and the first name of each class.
        segments: dict[Template, list[object]] = {}
        sizes: dict[Template, int] = {}
        firsts: dict[Template, str] = {}
        classes: dict[Template, dict[tuple[int, ...], list[int]]] = {}
        class_names: dict[Template, dict[tuple[int, ...], str]] = {}

        def group(parts: Template, first: str) -> tuple[dict[tuple[int, ...], list[int]], dict[tuple[int, ...], str]]:
            if parts not in segments:
                segments[parts], sizes[parts], firsts[parts] = [], 0, first
                classes[parts], class_names[parts] = {}, {}
            return classes[parts], class_names[parts]

        def add(parts: Template, items: list[tuple[str, tuple[str, ...]]]) -> None:
            by_len, named = group(parts, items[0][0])
            for i, (name, values) in enumerate(items, sizes[parts]):
                key = tuple(map(len, values))
                if key not in by_len:
                    by_len[key], named[key] = [], name
                by_len[key].append(i)
            segments[parts].append(items)
            sizes[parts] += len(items)

        runs = list(runs)
        tails: dict[str, tuple[str, str, str] | None] = {}  # a layer's tails recur in every layer: parsed once
        for run, run_names in zip(runs, names if names is not None else (r.names() for r in runs), strict=True):
            first_parts, first = name_template(run_names[0], tails)
            if len(run_names) == 1:
                add(first_parts, [(run_names[0], first)])
                continue
            experts = run.experts
            assert experts is not None
            last_parts, last = name_template(run_names[-1], tails)
            slots = [k for k in range(len(first)) if first[k] != last[k]]
            k = slots[0] if len(slots) == 1 else -1
            if last_parts != first_parts or k < 0 or first[k] != str(experts[0]) or last[k] != str(experts[-1]):
                for name in run_names:  # the id is not a template slot of these names: parse each
                    parts, values = name_template(name, tails)
                    add(parts, [(name, values)])
                continue
            head, tail = first[:k], first[k + 1 :]
            if experts.step != 1 or experts.start < 0:
                ids = [str(e) for e in experts]
                add(first_parts, [(name, (*head, i, *tail)) for name, i in zip(run_names, ids, strict=True)])
                continue
            by_len, named = group(first_parts, run_names[0])
            # Ids of one length are a block of the range (0-9, 10-99, ...): their member indexes at once.
            head_lens, tail_lens = tuple(map(len, head)), tuple(map(len, tail))
            offset, low = sizes[first_parts] - experts.start, experts.start
            while low < experts.stop:
                digits = len(str(low))
                high = min(experts.stop, 10**digits)
                key = (*head_lens, digits, *tail_lens)
                if key not in by_len:
                    by_len[key], named[key] = [], run_names[low - experts.start]
                by_len[key].extend(range(offset + low, offset + high))
                low = high
            segments[first_parts].append((run_names, head, experts, tail))
            sizes[first_parts] += len(run_names)
        out = cls.__new__(cls)
        out.groups = [
            _Group(parts, partial(_members, segs), classes[parts], firsts[parts], class_names[parts])
            for parts, segs in segments.items()
        ]
        return out


class _Entry:
    """How one entry is matched by one consumer, and which shortcuts are sound for it."""

    __slots__ = (
        "entry", "forward", "forward_abstract", "is_regex", "literal", "lower", "position", "positional", "regex",
        "reverse", "reverse_abstract", "uniform",
    )  # fmt: skip

    def __init__(self, consumer: Consumer, entry: str, position: int) -> None:
        self.entry, self.position = entry, position
        self.is_regex = False
        self.regex: SafeRegex | None = None  # `re:` entry evaluated with re.match semantics (None: never matches)
        self.forward: tuple[str, ...] = ()  # forms of which one must be a substring of the name
        self.reverse: tuple[str, ...] = ()  # forms the name must be a substring of (FP8 expert prefixes)
        self.lower = False
        self.positional: re.Pattern[str] | None = None  # transformers: start-anchored `.`-wildcard match
        self.literal = True  # False: no string shortcut is known; only uniformity is used
        self.uniform = digit_uniform(entry)
        key = consumer.key
        is_re = entry.startswith("re:")
        if is_re and key in ("ct", "vllm", "sglang", "sglang-substring", "slime-int4", "miles-nvfp4"):
            self.is_regex, self.regex = True, _compiled(entry[3:])
            self.literal = False
            self.uniform = digit_uniform(entry[3:])
        elif key in ("ct", "vllm", "sglang", "slime-int4", "miles-nvfp4", "vllm-awq", "vllm-bnb"):
            self.forward = (entry,)
        elif key == "sglang-substring":
            self.forward, self.lower = (entry.lower(),), True
        elif key == "vllm-fp8":
            self.forward = (entry,)
            self.reverse = (entry,) if "experts" in entry else ()
        elif key == "sglang-fp8":
            base = entry.removeprefix("model.")
            variants = (base, "model." + base)
            self.forward = tuple(v.rstrip(".") for v in variants)
            self.reverse = tuple(v for v in variants if "experts" in v)
        elif key == "transformers" and not (_REGEX_SPECIAL & set(entry)):
            # re.match(entry) with `.` as the only wildcard, or name.endswith(entry).
            self.forward = (entry,)
            self.positional = _positional_regex(abstract_chars(entry))
        elif key == "sglang-modelopt" and not (_REGEX_SPECIAL - {"*"}) & set(entry):
            # A glob matches the whole name or one component, so its longest literal piece is a substring of
            # the name (ModelOpt writes one `model.layers.N.self_attn*` per layer: hundreds of globs).
            tail = entry.rsplit(".", 1)[-1]
            mla = tail in ("q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj")
            self.forward = (_longest_piece(entry), tail) if mla else (_longest_piece(entry),)
        elif key == "vllm-modelopt" and not set("?[") & set(entry):
            self.forward = (_longest_piece(entry),)  # substring, or an fnmatch of the whole name
        else:
            self.literal = False
        self.forward_abstract = tuple(abstract(f) for f in self.forward)
        self.reverse_abstract = tuple(abstract(r) for r in self.reverse)


@lru_cache(maxsize=4096)
def _positional_regex(shape: str) -> re.Pattern[str]:
    """`.` the only wildcard; per shape, not per entry: a per-layer list has a handful of shapes."""
    return re.compile("".join("." if ch == "." else re.escape(ch) for ch in shape))


_ASCII_DIGITS_TO_HASH = str.maketrans("0123456789", "#" * 10)


def _longest_piece(glob: str) -> str:
    """The longest `*`-free piece of a glob (the glob itself when it has none)."""
    return max(glob.split("*"), key=len)


def abstract_chars(text: str) -> str:
    """Every digit replaced by `#`, keeping positions (for start-anchored positional matching)."""
    if text.isascii():  # `str.isdigit` is true for other characters (`²`) only outside ASCII
        return text.translate(_ASCII_DIGITS_TO_HASH)
    return "".join("#" if ch.isdigit() else ch for ch in text)


class CompiledIgnore:
    """One consumer's view of an ignore list, evaluated over many names at once."""

    def __init__(self, consumer: Consumer, entries: Iterable[str]) -> None:
        self.consumer = consumer
        self.entries = [_Entry(consumer, e, i) for i, e in enumerate(dict.fromkeys(entries))]
        # Literal entries whose template test is the same (`model.layers.#.mlp.gate` for every per-layer
        # router entry) are tested once per template.
        self._buckets: dict[tuple[object, ...], list[_Entry]] = defaultdict(list)
        self._others: list[_Entry] = []
        for e in self.entries:
            if e.literal:
                key = (e.forward_abstract, e.reverse_abstract, e.lower, e.positional and e.positional.pattern)
                self._buckets[key].append(e)
            else:
                self._others.append(e)

    def matches(self, names: Iterable[str] | NameSet) -> dict[str, list[str]]:
        """name -> entries covering it (list order), for the names some entry covers."""
        found: dict[str, set[int]] = defaultdict(set)
        if self.entries:
            for group in (names if isinstance(names, NameSet) else NameSet(names)).groups:
                self._group(group, found)
        order = {e.position: e.entry for e in self.entries}
        return {name: [order[p] for p in sorted(hits)] for name, hits in found.items()}

    # ---- per template ----------------------------------------------------------------------------

    def _group(self, group: _Group, found: dict[str, set[int]]) -> None:
        match = self.consumer.match
        todo = [e for bucket in self._buckets.values() if self._may_match(bucket[0], group) for e in bucket]
        todo += self._others
        if not todo:
            return
        members = group.members
        for e in todo:
            if e.uniform:
                for idx in group.classes.values():
                    if self._decide(e, members[idx[0]][0], match):
                        for i in idx:
                            found[members[i][0]].add(e.position)
                continue
            for i in self._candidates(e, group):
                name = members[i][0]
                if self._decide(e, name, match):
                    found[name].add(e.position)

    @staticmethod
    def _decide(e: _Entry, name: str, match: Callable[[str, str], bool]) -> bool:
        if e.is_regex:  # what every consumer does with `re:`: re.match; an invalid pattern matches nothing
            return e.regex is not None and e.regex.match(name)
        return match(name, e.entry)

    def _may_match(self, e: _Entry, group: _Group) -> bool:
        targets = group.targets_lower if e.lower else group.targets
        if any(f in t for f in e.forward_abstract for t in targets):
            return True
        if any(group.abstract in r for r in e.reverse_abstract):
            return True
        if e.positional is not None:
            return any(e.positional.match(rep) for rep in group.class_shapes)
        return False

    def _candidates(self, e: _Entry, group: _Group) -> Iterable[int]:
        """Member indexes the entry could match (a superset of those it does)."""
        every = range(len(group.members))
        if not e.literal or len(group.parts) == 1 or group.stripped is not None:
            return every
        out: set[int] = set()
        for form in e.forward:
            got = self._forward(form.lower() if e.lower else form, group)
            if got is None:
                return every
            out |= got
        for form in e.reverse:
            out |= self._reverse(form, group)
        if e.positional is not None:
            got = self._positional(e, group)
            if got is None:
                return every
            out |= got
        return sorted(out)

    @staticmethod
    def _forward(form: str, group: _Group) -> set[int] | None:
        """Members of which `form` can be a substring: each digit run of the form must be supplied by a
        digit run of the name (whole when inside the form, a suffix/prefix at its edges)."""
        wanted: set[int] | None = None
        for m in _RUNS.finditer(form):
            run = m.group()
            lead, trail = m.start() == 0, m.end() == len(form)
            if not lead and not trail:  # the usual case (`model.layers.3.mlp.gate`): the id must equal the run
                if run in group.fixed_runs:
                    continue
                have = set()
                for slot in group.by_value:
                    have.update(slot.get(run, ()))
                wanted = have if wanted is None else wanted & have
                if not wanted:
                    return set()
                continue
            if lead and trail:
                ok = lambda v, r=run: r in v  # noqa: E731
            elif lead:
                ok = lambda v, r=run: v.endswith(r)  # noqa: E731
            elif trail:
                ok = lambda v, r=run: v.startswith(r)  # noqa: E731
            else:
                ok = lambda v, r=run: v == r  # noqa: E731
            if any(ok(f) for f in group.fixed_runs):
                continue  # a fixed part of the template can supply it: no restriction from this run
            have: set[int] = set()
            for slot in group.by_value:
                for value, idx in slot.items():
                    if ok(value):
                        have.update(idx)
            wanted = have if wanted is None else wanted & have
            if not wanted:
                return set()
        return wanted  # None: no run restricts

    @staticmethod
    def _reverse(form: str, group: _Group) -> set[int]:
        """Members that can be a substring of `form`: every id (a whole dotted component) is a run of it."""
        runs = set(_RUNS.findall(form))
        out: set[int] | None = None
        for slot in group.by_value:
            have = {i for v in runs & slot.keys() for i in slot[v]}
            out = have if out is None else out & have
        return set(range(len(group.members))) if out is None else out

    @staticmethod
    def _positional(e: _Entry, group: _Group) -> set[int] | None:
        """transformers' start-anchored match of an entry whose only wildcard is `.`: a digit of the entry
        over an id slot must equal that digit of the id. A length class whose shape (`class_shapes`) the
        entry's shape does not match has no member it matches: where the entry has a digit the name has the
        same digit, and `#` at that place in both shapes; elsewhere the name's character is the entry's or
        any under its `.`, the same in the shapes (`model.layers.1.mlp.gate` skips the two-digit layers)."""
        entry, shape_match = e.entry, e.positional
        assert shape_match is not None
        out: set[int] = set()
        for (lengths, idx), shape in zip(group.classes.items(), group.class_shapes, strict=True):
            if not shape_match.match(shape):
                continue
            starts, pos = [], len(group.parts[0])
            for k, n in enumerate(lengths):
                starts.append(pos)
                pos += n + len(group.parts[k + 1])
            members: set[int] | None = None
            for k, n in enumerate(lengths):
                piece = entry[starts[k] : starts[k] + n]
                if not piece or all(ch == "." for ch in piece):
                    continue
                slot = group.by_value[k]
                if len(piece) == n and "." not in piece:
                    allowed = [piece] if piece in slot else []
                else:
                    allowed = [
                        v for v in slot if len(v) == n and all(c == "." or c == v[j] for j, c in enumerate(piece))
                    ]
                have = {i for v in allowed for i in slot[v]}
                members = have if members is None else members & have
            if members is None:
                return None  # no digit of the entry falls on an id of this class
            out |= members & set(idx)
        return out
