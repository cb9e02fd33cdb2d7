"""payload.loads reads JSON text exactly as json.loads does, the fast way where it can."""

from __future__ import annotations

import json
import math

import pytest

from nbqueue import payload

READ_ALIKE = [
    "1", "-0", "1.5e3", '"approve"', "null", "true", "[]", "{}", '{"a":[1,2,{"b":null}]}',
    '{"a": [1, 2]}', ' 1', '1 ', '\n"x"\t', '"\\u00e9\\ud83d\\ude00"', "[1,[2,[3]]]", '{"a":1,"a":2}',
    "1e400", "Infinity",
]  # fmt: skip
REFUSED_ALIKE = ["", " ", "1 2", "[1,]", "{'a': 1}", '"open', "tru", "1x", "[1] ]", "\ufeff1"]


@pytest.mark.parametrize("text", READ_ALIKE)
def test_reads_what_json_loads_reads(text: str) -> None:
    read, expected = payload.loads(text), json.loads(text)
    assert read == expected
    assert type(read) is type(expected)


def test_reads_not_a_number_as_json_loads_does() -> None:
    assert math.isnan(payload.loads("NaN")) and math.isnan(json.loads("NaN"))


@pytest.mark.parametrize("text", REFUSED_ALIKE)
def test_refuses_what_json_loads_refuses_with_its_message(text: str) -> None:
    with pytest.raises(json.JSONDecodeError) as expected:
        json.loads(text)
    with pytest.raises(json.JSONDecodeError) as refused:
        payload.loads(text)
    assert str(refused.value) == str(expected.value)
