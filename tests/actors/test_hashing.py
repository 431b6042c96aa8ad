"""Chained block hashes: prefix identity, batched == single == scalar, straddling blocks."""

from __future__ import annotations

import numpy as np
import pytest

from aisim.actors import hashing


def seq(sources, lengths, bs, n):
    return hashing.sequence_hashes(np.array(sources, dtype=np.uint64), np.array(lengths, dtype=np.int64), bs, n).tolist()


def test_equal_prefixes_have_equal_hashes_and_diverge_after():
    a = seq([11, 12, 13], [512, 512, 100], 64, 17)
    b = seq([11, 12, 99], [512, 512, 512], 64, 17)
    assert a[:16] == b[:16] and a[16] != b[16]
    assert len(set(a)) == 17  # same local content at another position still differs (chained)


def test_partial_trace_block_shares_its_full_engine_blocks():
    # a 100-token tail of trace block 13 equals the first 100 tokens of a full block 13
    a = seq([11, 13], [512, 100], 64, 9)
    b = seq([11, 13], [512, 512], 64, 9)
    assert a == b


def test_straddling_blocks_depend_on_content_not_on_representation():
    # block size 48 does not divide 512: blocks straddle pieces
    a = seq([1, 2, 3], [512, 512, 512], 48, 30)
    b = seq([1, 2, 3, 4], [512, 512, 512, 7], 48, 30)
    c = seq([1, 2, 5], [512, 512, 512], 48, 30)
    assert a == b
    first_diff = 1024 // 48  # the block holding token 1024 mixes piece 2 and piece 3
    assert a[:first_diff] == c[:first_diff] and a[first_diff] != c[first_diff]


def test_three_part_straddle_scalar_fold_matches_vector_rules():
    a = seq([1, 2, 3, 4], [10, 5, 5, 100], 32, 3)
    b = seq([1, 2, 3, 4], [10, 5, 5, 100], 32, 3)
    assert a == b and len(set(a)) == 3


def test_batched_chain_equals_single_and_scalar_extension():
    rng = np.random.default_rng(0)
    keys = rng.integers(0, 2**63, size=50, dtype=np.int64).astype(np.uint64)
    batched = hashing.chain_hashes(keys, np.array([0, 7, 30], dtype=np.int64))
    for lo, hi in ((0, 7), (7, 30), (30, 50)):
        single = hashing.chain_hashes(keys[lo:hi])
        assert np.array_equal(batched[lo:hi], single)
        h = 0
        for j, k in enumerate(keys[lo:hi].tolist()):
            h = (h * hashing.CHAIN_P + k) & hashing.MASK64
            assert h == int(single[j])


def test_hash_ids_are_64_bit_and_never_truncated():
    big = np.array([2**64 - 1, 2**32 + 5], dtype=np.uint64)
    small = np.array([(2**64 - 1) & 0xFFFFFFFF, 5], dtype=np.uint64)
    assert not np.array_equal(hashing.trace_sources(big), hashing.trace_sources(small))


def test_part_keys_from_the_offset_table_equal_the_direct_mix():
    rng = np.random.default_rng(3)
    sources = rng.integers(0, 2**63, size=300, dtype=np.int64).astype(np.uint64)
    for top in (64, 5000, 70_000, 3 << 20):  # within the first table, grown, past the table
        offsets = rng.integers(0, top, size=300, dtype=np.int64)
        want = hashing.splitmix64_array(sources ^ hashing.splitmix64_array(offsets.astype(np.uint64)))
        assert np.array_equal(hashing._part_keys(sources, offsets), want)
        assert [int(k) for k in want[:5]] == [hashing._part_key(int(s), int(o)) for s, o in zip(sources[:5], offsets[:5])]


def test_a_hash_view_reads_the_same_ints_from_every_form_and_is_read_only():
    values = [0, 1, (1 << 64) - 1, 0x9E3779B97F4A7C15]
    arr = np.array(values, dtype=np.uint64)
    view = hashing.hash_view(values)
    assert view.format == "Q" and view.readonly
    for form in (arr, view, view.tobytes(), iter(values)):
        got = hashing.hash_view(form)
        assert list(got) == values and got.readonly
    assert hashing.hash_view(view) is view  # (no copy of a view)
    assert view[1:3].obj is view.obj  # slices are views of the same buffer
    with pytest.raises(TypeError):
        view[0] = 5
