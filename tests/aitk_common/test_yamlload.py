"""The bounded YAML/JSON loader: size, values with aliases expanded, depth, aliases."""

from __future__ import annotations

import pytest

from aitk_common.yamlload import DocumentError, Limits, check_data, load_json, load_yaml

BOMB = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [*{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, "
    f"*{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, "
    f"*{chr(97 + i)}, *{chr(97 + i)}]\n" for i in range(8))


def test_plain_yaml_and_json_load() -> None:
    assert load_yaml("a: [1, 2]\nb: {c: x}\n") == {"a": [1, 2], "b": {"c": "x"}}
    assert load_yaml("") is None
    assert load_json('{"a": [1]}') == {"a": [1]}


def test_an_alias_bomb_stops_before_it_is_built() -> None:
    with pytest.raises(DocumentError, match="too large once its aliases are expanded") as info:
        load_yaml(BOMB)
    assert info.value.limit


def test_aliases_can_be_refused_outright() -> None:
    assert load_yaml("a: &x 1\nb: *x\n") == {"a": 1, "b": 1}
    with pytest.raises(DocumentError, match=r"YAML aliases \(\*name\) are not accepted"):
        load_yaml("a: &x 1\nb: *x\n", Limits(aliases=False))


def test_size_and_depth_are_bounded() -> None:
    with pytest.raises(DocumentError, match="larger than 1 KiB"):
        load_yaml("k: " + "x" * 2000, Limits(max_bytes=1024))
    with pytest.raises(DocumentError, match="nested more than 64 levels deep"):
        load_yaml("[" * 70 + "]" * 70)
    with pytest.raises(DocumentError, match="nested more than 3 levels deep"):
        check_data({"a": {"b": {"c": {}}}}, Limits(max_depth=3))
    with pytest.raises(DocumentError):
        load_json("[" * 100_000 + "]" * 100_000)


def test_a_syntax_error_says_where() -> None:
    with pytest.raises(DocumentError, match="not valid YAML at line 2, column 2") as info:
        load_yaml("a: [1\nb: 2\n")
    assert (info.value.line, info.value.column, info.value.limit) == (2, 2, False)
    with pytest.raises(DocumentError, match="not valid JSON at line 1, column 7"):
        load_json('{"a": }')
