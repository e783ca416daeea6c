from parallel.foundation.intervals import union_seconds


def test_union_merges_overlaps_and_clamps():
    assert union_seconds([]) == 0.0
    assert union_seconds([(0, 1), (0.5, 2), (3, 4)]) == 3.0
    assert union_seconds([(3, 4), (0, 1)]) == 2.0  # order does not matter
    assert abs(union_seconds([(0, 1), (0.5, 2), (3, 4)], within=(0.5, 3.5)) - 2.0) < 1e-12
    assert union_seconds([(0, 1)], within=(2, 3)) == 0.0
