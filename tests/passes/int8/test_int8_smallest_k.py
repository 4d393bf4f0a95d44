"""``smallest_k``: the fewest most sensitive layers the fallback keeps off a level."""

import pytest

from onnxslim_kit.passes.int8.ladder import smallest_k


def counting(answer: int):
    asked = []

    def ok(k):
        asked.append(k)
        return k >= answer
    return ok, asked


@pytest.mark.parametrize("tight", [False, True])
@pytest.mark.parametrize("m", [1, 2, 5, 9, 17, 60])
def test_it_finds_the_smallest_k_for_every_answer(m, tight):
    for answer in range(1, m + 1):
        ok, _ = counting(answer)
        assert smallest_k(m, ok, tight) == answer


def test_doubling_then_bisection():
    ok, asked = counting(12)
    assert smallest_k(60, ok) == 12 and asked == [1, 2, 4, 8, 16, 12, 10, 11]


def test_a_tight_base_searches_from_the_top():
    ok, asked = counting(30)
    assert smallest_k(30, ok, tight=True) == 30 and asked == [29]  # no layer can move: one trial
    ok, asked = counting(29)
    assert smallest_k(30, ok, tight=True) == 29 and asked == [29, 28]  # one can: two trials
    ok, asked = counting(21)
    assert smallest_k(30, ok, tight=True) == 21 and asked == [29, 28, 26, 22, 14, 18, 20, 21]
    ok, asked = counting(1)
    assert smallest_k(30, ok, tight=True) == 1 and asked == [29, 28, 26, 22, 14, 1]
