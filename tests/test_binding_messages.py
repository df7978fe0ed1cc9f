"""The native binding's message table (``packages/kv-core-cpp/bindings/arguments.h``, ``namespace
msg``) checked against the Python sources it mirrors, instead of kept in step by eye (issue 25,
item 3): each constant must equal an f-string (or str literal) of the module its group's comment
names, with ``{}`` for every field, and must be used by a ``bindings/*.cc``. The few that are
composed differently are listed in ``COMPOSED`` with what each is checked against instead.

Only sources are read (``ast``, regular expressions): nothing is imported or built."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from _repository import ROOT

BINDINGS = ROOT / "packages/kv-core-cpp/bindings"
HEADER = BINDINGS / "arguments.h"

# A module's name on a line of its own starts a group; after a constant, it names that one's module.
_MODULE = r"//[ \t]*(kv_[a-z_]+(?:\.[a-z_]+)+)"
_LITERAL = r'"(?:[^"\\\n]|\\.)*"'
_TABLE = re.compile(
    rf"^[ \t]*{_MODULE}"
    rf"|inline\s+constexpr\s+char\s+(k\w+)\[\]\s*=\s*((?:{_LITERAL}\s*)+);(?:[ \t]*{_MODULE})?",
    re.MULTILINE,
)
_ESCAPES = {"'": "'", '"': '"', "?": "?", "\\": "\\", "a": "\a", "b": "\b", "f": "\f", "n": "\n", "r": "\r"}
_ESCAPES |= {"t": "\t", "v": "\v"}


@dataclass(frozen=True)
class Constant:
    name: str
    module: str  # e.g. "kv_api.keys"
    text: str


@dataclass(frozen=True)
class Named:
    """The C++ takes as the first ``{}``'s argument a name that each Python f-string spells in
    its text: ``(module, name)`` for each place the binding passes one."""

    names: tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class Pinned:
    """The Python f-string interpolates one of kv_api's constants where the C++ spells its value:
    ``fields`` maps the field's source (as ``ast.unparse`` writes it) to that spelled text."""

    fields: dict[str, str]


# The texts the C++ spells for Python constants; test_pinned_texts_are_the_python_values checks them.
DIGEST_SIZE = "32"  # kv_api.scope.DIGEST_SIZE
HASH_ALGOS = "v2_sha256, v2_sha256_64, v1_block_key"  # ", ".join(kv_api.events.HASH_ALGOS)

# The constants that equal no single template as it stands, and what each is held to instead.
COMPOSED: dict[str, Named | Pinned] = {
    # One C++ checker serves several arguments; Python writes each argument's name into its f-string.
    "kExpectedBool": Named(
        (
            ("kv_core_py.manager", "best_efforts"),
            ("kv_core_py.manager_reuse", "enable_request_stats"),
            ("kv_core_py.cache_scratch", "enable_swa_scratch_reuse"),
        )
    ),
    "kExpectedBoolOrNone": Named((("kv_core_py.manager_reuse", "text_only"),)),
    "kOutOfRange": Named(
        (
            ("kv_core_py.manager", "pool_group"),
            ("kv_core_py.manager", "pool"),
            ("kv_core_py.cache_state", "layer_group"),
        )
    ),
    "kLevelOutOfRange": Named((("kv_core_py.manager", "level"), ("kv_core_py.kv_cache", "target_level"))),
    # batch.cc builds "caches[i]" for the `{}`; Python's f-string has "caches[{i}]".
    "kExpectedCache": Named((("kv_core_py.batch", "caches[{}]"),)),
    "kOtherManager": Named((("kv_core_py.batch", "caches[{}]"),)),
    # A digest's size and the hash algorithms are fixed in C++ (the core's types), spelled out.
    "kDigestSize": Pinned({"DIGEST_SIZE": DIGEST_SIZE}),
    "kDigestTokenSize": Pinned({"DIGEST_SIZE": DIGEST_SIZE}),
    "kExpectedToken": Pinned({"DIGEST_SIZE": DIGEST_SIZE}),
    "kUnsupportedHashAlgo": Pinned({"', '.join(HASH_ALGOS)": HASH_ALGOS}),
}


def unescape(literal: str) -> str:
    """A C++ narrow string literal's value (its quotes included in ``literal``)."""
    out: list[str] = []
    body, i = literal[1:-1], 0
    while i < len(body):
        char, i = body[i], i + 1
        if char != "\\":
            out.append(char)
            continue
        # C++ escapes, not Python's: \x takes every hex digit that follows, octal up to three.
        if octal := re.match(r"[0-7]{1,3}", body[i:]):
            out.append(chr(int(octal[0], 8)))
        elif hexa := re.match(r"x([0-9A-Fa-f]+)|u([0-9A-Fa-f]{4})|U([0-9A-Fa-f]{8})", body[i:]):
            out.append(chr(int(next(g for g in hexa.groups() if g), 16)))
        elif body[i] in _ESCAPES:
            out.append(_ESCAPES[body[i]])
        else:
            raise ValueError(f"unknown escape \\{body[i]} in {literal}")
        i += len(octal[0]) if octal else len(hexa[0]) if hexa else 1
    return "".join(out)


def parse_table(header: str) -> list[Constant]:
    """The ``namespace msg`` constants of ``header``, in order, adjacent literals joined; each
    with the module of the group comment above it, or of its own trailing comment."""
    start, end = header.index("namespace msg {"), header.index("}  // namespace msg")
    body = header[start:end]
    constants: list[Constant] = []
    group = ""
    for m in _TABLE.finditer(body):
        heading, name, literals, own_module = m.groups()
        if heading:
            group = heading
            continue
        text = "".join(unescape(lit) for lit in re.findall(_LITERAL, literals))
        constants.append(Constant(name, own_module or group, text))
    # A declaration the pattern does not read must not drop out of the check unnoticed.
    declared = len(re.findall(r"\bconstexpr\b", body))
    assert declared == len(constants), f"read {len(constants)} of the {declared} constants in namespace msg"
    return constants


@dataclass(frozen=True)
class Template:
    """A Python str literal or f-string: its text pieces, and each field's source where one stands."""

    parts: tuple[str | None, ...]  # None: a field
    fields: tuple[str, ...]

    def render(self, pins: dict[str, str] | None = None) -> str:
        """The text with each field as ``{}``, or as its pinned text."""
        sources: Iterator[str] = iter(self.fields)
        pins = pins or {}
        return "".join(p if p is not None else pins.get(next(sources), "{}") for p in self.parts)


class _Collector(ast.NodeVisitor):
    """Every str constant and f-string, except an f-string's own pieces and format specs (they
    are parts of one message, not messages)."""

    def __init__(self) -> None:
        self.found: list[Template] = []

    def visit_Constant(self, node: ast.Constant) -> None:
        if isinstance(node.value, str):
            self.found.append(Template((node.value,), ()))

    def visit_JoinedStr(self, node: ast.JoinedStr) -> None:
        parts: list[str | None] = []
        fields: list[str] = []
        for value in node.values:
            if isinstance(value, ast.FormattedValue):
                parts.append(None)
                fields.append(ast.unparse(value.value))
                self.visit(value.value)  # a field's expression may hold str literals of its own
            else:
                assert isinstance(value, ast.Constant)
                parts.append(str(value.value))
        self.found.append(Template(tuple(parts), tuple(fields)))


def module_path(module: str) -> Path:
    """A module's source under ``packages/*/src`` (``kv_api.keys`` -> .../kv_api/keys.py)."""
    top, *rest = module.split(".")
    (package,) = ROOT.glob(f"packages/*/src/{top}")
    return package.joinpath(*rest).with_suffix(".py")


def collect(source: str) -> tuple[Template, ...]:
    collector = _Collector()
    collector.visit(ast.parse(source))
    return tuple(collector.found)


@cache
def templates(module: str) -> tuple[Template, ...]:
    return collect(module_path(module).read_text())


def literal(module: str, name: str) -> object:
    """The value of a module-level ``name = <literal>`` in ``module``'s source."""
    for node in ast.parse(module_path(module).read_text()).body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            return ast.literal_eval(node.value)
    raise LookupError(f"{module} assigns no {name}")


def composed_problems(constant: Constant, rule: Named | Pinned) -> list[str]:
    """What keeps ``constant`` from following its ``COMPOSED`` rule (empty: it follows it)."""
    if isinstance(rule, Pinned):
        rendered = {t.render(rule.fields) for t in templates(constant.module)}
        if constant.text in rendered:
            return []
        return [f"{constant.name} = {constant.text!r}: no f-string of {constant.module} with {rule.fields} reads so"]
    problems = []
    for module, name in rule.names:
        expected = constant.text.replace("{}", name, 1)
        if expected not in {t.render() for t in templates(module)}:
            problems.append(f"{constant.name} = {constant.text!r}: {module} has no {expected!r}")
    return problems


def problems(header: str, bindings: str) -> list[str]:
    """Every disagreement between the table in ``header``, the Python sources and ``bindings``
    (the ``.cc`` files' text): the test's whole verdict, as readable lines."""
    found: list[str] = []
    constants = parse_table(header)
    used = set(re.findall(r"\bmsg::(k\w+)\b", bindings))
    for c in constants:
        if not c.module:
            found.append(f"{c.name}: no module comment above it")
            continue
        exact = c.text in {t.render() for t in templates(c.module)}
        if c.name in COMPOSED:
            found += composed_problems(c, COMPOSED[c.name])
            if exact:
                found.append(f"{c.name}: now equals a template of {c.module}; drop it from COMPOSED")
        elif not exact:
            found.append(f"{c.name} = {c.text!r}: no str literal or f-string of {c.module} reads so")
        if c.name not in used:
            found.append(f"{c.name}: no bindings/*.cc uses msg::{c.name}")
    names = {c.name for c in constants}
    found += [f"COMPOSED lists {n}, which the table has not" for n in sorted(COMPOSED.keys() - names)]
    return found


def bindings_text() -> str:
    return "\n".join(p.read_text() for p in sorted(BINDINGS.glob("*.cc")))


def test_every_message_constant_mirrors_its_python_message_and_is_used() -> None:
    assert problems(HEADER.read_text(), bindings_text()) == []


def test_pinned_texts_are_the_python_values() -> None:
    assert str(literal("kv_api.scope", "DIGEST_SIZE")) == DIGEST_SIZE
    algos = literal("kv_api.events", "HASH_ALGOS")
    assert isinstance(algos, tuple) and ", ".join(algos) == HASH_ALGOS


def test_the_parser_joins_adjacent_literals_and_reads_escapes() -> None:
    header = (
        "namespace msg {\n// kv_api.keys\n"
        'inline constexpr char kA[] =\n    "a \\"quoted\\" {}"\n    " \\\\ \\x41\\101\\n";  // kv_api._check\n'
        'inline constexpr char kB[] = "b";\n}  // namespace msg\n'
    )
    assert parse_table(header) == [
        Constant("kA", "kv_api._check", 'a "quoted" {} \\ AA\n'),
        Constant("kB", "kv_api.keys", "b"),
    ]


def test_templates_give_every_field_as_braces_and_join_implicit_concatenation() -> None:
    source = 'raise E(f"{where}: got {x!r} " f"at {t:.3f}, {len(s) - 1}" "!")\nNAME = "plain"\n'
    found = {t.render() for t in collect(source)}
    # The f-string's pieces (": got ") and its format spec (".3f") are no templates of their own.
    assert found == {"{}: got {} at {}, {}!", "plain"}
    (joined,) = (t for t in collect(source) if t.fields)
    assert joined.fields == ("where", "x", "t", "len(s) - 1")
    assert joined.render({"len(s) - 1": "7"}) == "{}: got {} at {}, 7!"


def test_a_changed_constant_an_unused_one_and_a_broken_composition_are_reported() -> None:
    header, bindings = HEADER.read_text(), bindings_text()
    exact = '"{}: expected an int, got {}"'
    pinned = '"{}: must be 32 bytes (got {})"'
    assert header.count(exact) == 1 and header.count(pinned) == 1
    changed = header.replace(exact, exact.replace("an int,", "an int;"))
    assert problems(changed, bindings) == [
        "kExpectedInt = '{}: expected an int; got {}': no str literal or f-string of kv_api._check reads so"
    ]
    found = problems(header.replace(pinned, pinned.replace("32", "33")), bindings)
    assert len(found) == 1 and found[0].startswith("kDigestSize = '{}: must be 33 bytes"), found
    # Appended to the last group (kv_core_py.event_manager), whose f-string it equals: only unused.
    extra = 'inline constexpr char kUnused[] = "hash_algo: expected a str, got {}";\n'
    unused = header.replace("}  // namespace msg", extra + "}  // namespace msg")
    assert problems(unused, bindings) == ["kUnused: no bindings/*.cc uses msg::kUnused"]


def test_each_constant_changed_by_one_character_is_reported() -> None:
    header, bindings = HEADER.read_text(), bindings_text()
    for c in parse_table(header):
        # A character more at the start of the constant's (first) literal, in a copy of the header.
        at = header.index('"', header.index(f" {c.name}[] ="))
        found = problems(header[: at + 1] + "#" + header[at + 1 :], bindings)
        assert found and all(p.startswith(f"{c.name} = {'#' + c.text!r}") for p in found), (c.name, found)
