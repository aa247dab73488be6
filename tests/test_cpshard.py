"""CP sharding: coverage, balance, tile-padding estimate, adaptive choice."""

from __future__ import annotations

import numpy as np
import pytest

from hydraplan.solve.cpshard import adaptive_shard, attention_work, shard_per_document, shard_per_sequence

SHARDERS = [shard_per_sequence, shard_per_document]


def token_owner(lengths, shards, cp) -> np.ndarray:
    """Owner rank per packed token; -1 unowned; raises if a token is owned twice."""
    owner = np.full(int(np.sum(lengths)), -1)
    for r, ranges in enumerate(shards.ranges(cp)):
        for s, e in ranges:
            assert np.all(owner[s:e] == -1), "token owned twice"
            owner[s:e] = r
    return owner


def brute_work(lengths, owner, cp) -> np.ndarray:
    pos = np.concatenate([np.arange(l) for l in lengths])
    return np.bincount(owner, weights=2 * pos + 1, minlength=cp)  # query p sees p+1 keys: e^2 - s^2 summed


@pytest.mark.parametrize("fn", SHARDERS)
@pytest.mark.parametrize("cp", [2, 3, 4, 8])
def test_every_token_exactly_once(fn, cp: int) -> None:
    rng = np.random.default_rng(cp)
    for _ in range(10):
        lengths = rng.integers(1, 300, size=rng.integers(1, 10))
        sh = fn(lengths, cp)
        owner = token_owner(lengths, sh, cp)
        assert np.all(owner >= 0)
        counts = np.bincount(owner, minlength=cp)
        # equal tokens (GEMM and collectives balanced): per-document +-1; per-sequence two chunks of
        # n/(2cp) rounded, so +-2 when n is not a multiple of 2*cp
        assert counts.max() - counts.min() <= (1 if fn is shard_per_document else 2)
        assert np.allclose(attention_work(lengths, sh, cp, tile=1), brute_work(lengths, owner, cp))


def test_per_document_equalizes_where_per_sequence_does_not() -> None:
    cp = 4
    lengths = np.array([16_384, 1024, 1024, 2048, 512, 4096, 8192])  # all divisible by 2*cp
    seq = attention_work(lengths, shard_per_sequence(lengths, cp), cp, tile=1)
    doc = attention_work(lengths, shard_per_document(lengths, cp), cp, tile=1)
    assert doc.max() == pytest.approx(doc.min())
    assert seq.max() > 1.3 * seq.min()
    assert doc.sum() == pytest.approx(seq.sum()) == pytest.approx(np.sum(lengths.astype(float) ** 2))


def test_per_sequence_balances_one_document() -> None:
    w = attention_work(np.array([8192]), shard_per_sequence(np.array([8192]), 4), 4, tile=1)
    assert w.max() == pytest.approx(w.min())
    assert shard_per_sequence(np.array([8]), 2).ranges(2) == [[(0, 2), (6, 8)], [(2, 6)]]


def test_tile_padding_and_adaptive_choice() -> None:
    cp, a = 4, 1e-9
    short = np.full(64, 100)  # per-document: 64 segments of 25 tokens each padded to 128 per rank
    pick = adaptive_shard(short, cp, a)
    assert pick.strategy == "per-sequence" and pick.max_s < pick.other_s
    padded = attention_work(short, shard_per_document(short, cp), cp)
    exact = attention_work(short, shard_per_document(short, cp), cp, tile=1)
    assert np.all(padded > 3 * exact)
    mixed = np.array([24_576, 2048, 2048, 2048, 2048])
    pick = adaptive_shard(mixed, cp, a)
    assert pick.strategy == "per-document" and pick.max_s < pick.other_s
    # balanced per-document work takes a * l^2 in total, the profile's attention time
    assert pick.max_s == pytest.approx(a * np.sum(mixed.astype(float) ** 2), rel=0.01)
    assert sorted(s for r in pick.ranges for s, _ in r)[0] == 0


def test_padding_follows_the_runtimes_query_segments():
    """attention_work pads exactly the runs the runtime hands the varlen kernel (its own cut of a rank's
    ranges at document boundaries), not one segment per (rank, document)."""
    from hydraplan.runtime.context_parallel import _runs
    from hydraplan.solve.cpshard import TILE, attention_work, shard_per_document, shard_per_sequence

    rng = np.random.default_rng(7)
    for _ in range(40):
        lengths = rng.integers(1, 3000, int(rng.integers(1, 6)))
        cp = int(rng.choice([2, 4]))
        cu = np.concatenate([[0], np.cumsum(lengths)])
        for fn in (shard_per_sequence, shard_per_document):
            sh = fn(lengths, cp)
            want = np.zeros(cp)
            for r, ranges in enumerate(sh.ranges(cp)):
                for s, e in zip(*_runs(ranges, cu, 0, int(cu[-1]))):
                    d = cu[np.searchsorted(cu, s, side="right") - 1]
                    n = e - s
                    want[r] += ((e - d) ** 2 - (s - d) ** 2) * np.ceil(n / TILE) * TILE / n
            assert np.allclose(attention_work(lengths, sh, cp), want, rtol=1e-12)
