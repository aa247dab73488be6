"""Readers (every input form, on small files written here), builtins, truncation, stats math, sampling."""

from __future__ import annotations

import gzip
import json
import statistics
from collections import Counter

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from hydraplan.core.errors import UserError
from hydraplan.core.lengthstats import expand_bins, log2_histogram, share_above, summarize
from hydraplan.store.datasets import Dataset, load_dataset, sample_iterations

LENGTHS = [7, 3, 12, 3, 40, 1, 9]


def write_megatron(prefix, docs, dtype=np.uint16, code=8, version=1):
    """An MMIDIDX index + .bin as Megatron-LM's _IndexWriter lays them out; docs = [[sequence tokens]]."""
    seqs = [np.asarray(s, dtype=dtype) for d in docs for s in d]
    lens = np.array([s.size for s in seqs], dtype="<i4")
    pointers = (np.concatenate(([0], np.cumsum(lens)[:-1])) * np.dtype(dtype).itemsize).astype("<i8")
    doc_idx = np.concatenate(([0], np.cumsum([len(d) for d in docs]))).astype("<i8")
    with open(f"{prefix}.idx", "wb") as f:
        f.write(b"MMIDIDX\x00\x00")
        f.write(np.array([version], "<u8").tobytes() + np.array([code], "u1").tobytes())
        f.write(np.array([len(seqs), doc_idx.size], "<u8").tobytes())
        f.write(lens.tobytes() + pointers.tobytes() + doc_idx.tobytes())
    np.concatenate(seqs).tofile(f"{prefix}.bin")


# -------------------------------------------------------------------------------------- raw lengths
@pytest.mark.parametrize("name", ["l.npy", "l.txt", "l.txt.gz", "l.json", "l.json.gz", "l.csv", "l.csv.gz", "l.parquet",
                                  "l.jsonl", "l.JSONL.gz"])
def test_raw_length_readers_keep_order_and_docs(tmp_path, name):
    path = tmp_path / name
    if name.endswith(".npy"):
        np.save(path, np.array(LENGTHS, dtype=np.int32))
    elif name.startswith("l.txt"):
        text = "\n".join(map(str, LENGTHS)) + "\n"
        path.write_bytes(gzip.compress(text.encode()) if name.endswith(".gz") else text.encode())
    elif name in ("l.json", "l.json.gz"):
        text = json.dumps(LENGTHS)
        path.write_bytes(gzip.compress(text.encode()) if name.endswith(".gz") else text.encode())
    elif name.startswith("l.csv"):
        text = "length,name\n" + "".join(f"{v},doc{i}\n" for i, v in enumerate(LENGTHS))
        path.write_bytes(gzip.compress(text.encode()) if name.endswith(".gz") else text.encode())
    elif name.endswith(".parquet"):
        pq.write_table(pa.table({"length": LENGTHS}), path)
    else:
        text = "".join(json.dumps({"length": v, "text": "x"}) + "\n" for v in LENGTHS)
        path.write_bytes(gzip.compress(text.encode()) if name.endswith(".gz") else text.encode())
    ds = load_dataset(str(path))
    assert ds.lengths.dtype == np.int64 and ds.lengths.tolist() == LENGTHS
    assert ds.has_docs and not ds.has_tokens and ds.name == str(path)


# ------------------------------------------------------------------------------------------ histograms
@pytest.mark.parametrize("fmt", ["csv", "parquet"])
def test_exact_histogram(tmp_path, fmt):
    values, counts = [5, 100, 7, 100], [2, 1, 0, 3]  # a zero row and a repeated length are fine
    path = tmp_path / f"h.{fmt}"
    if fmt == "csv":
        path.write_text("length,count\n" + "".join(f"{v},{c}\n" for v, c in zip(values, counts)))
    else:
        pq.write_table(pa.table({"length": values, "count": counts}), path)
    ds = load_dataset(path)
    assert not ds.has_docs
    assert Counter(ds.lengths.tolist()) == Counter({5: 2, 100: 4})
    v, c = ds.histogram()
    assert v.tolist() == [5, 100] and c.tolist() == [2, 4]


def test_binned_histogram_spreads_lengths_evenly_inside_each_bin(tmp_path):
    rows = [(0, 4, 4), (4, 8, 10), (100, 1000, 3), (1000, 1001, 2), (8, 16, 0)]
    (tmp_path / "b.csv").write_text("lo,hi,count\n" + "".join(f"{a},{b},{c}\n" for a, b, c in rows))
    ds = load_dataset(tmp_path / "b.csv")
    assert ds.lengths.size == 19 and not ds.has_docs
    got = Counter(ds.lengths.tolist())
    assert {k: got[k] for k in (1, 2, 3, 4)} == {1: 1, 2: 1, 3: 1, 4: 1}          # c == width: each once
    assert sorted(got[k] for k in (5, 6, 7, 8)) == [2, 2, 3, 3]                     # floor/ceil of 10/4
    mid = ds.lengths[(ds.lengths > 100) & (ds.lengths <= 1000)]
    assert mid.size == 3 and len(set(mid.tolist())) == 3                            # spread, not piled up
    assert got[1001] == 2
    assert np.array_equal(load_dataset(tmp_path / "b.csv").lengths, ds.lengths)      # deterministic


def test_expand_bins_stays_inside_bins_and_keeps_counts():
    rng = np.random.default_rng(3)
    lo = rng.integers(0, 1000, 50)
    hi = lo + rng.integers(1, 300, 50)
    counts = rng.integers(0, 700, 50)
    out = expand_bins(lo, hi, counts)
    start = 0
    for a, b, c in zip(lo, hi, counts):
        part = out[start:start + c]
        start += c
        assert part.size == c and np.all(part > a) and np.all(part <= b)
        if c:
            per_value = np.bincount(part - a - 1, minlength=b - a)
            assert per_value.max() - per_value.min() <= 1
    assert start == out.size


# ------------------------------------------------------------------------------------ token-id lists
def test_parquet_token_lists_give_lengths_and_tokens(tmp_path):
    ids = [[5, 6, 7], [8], [9, 10, 11, 12, 13]]
    pq.write_table(pa.table({"input_ids": ids, "text": ["a", "b", "c"]}), tmp_path / "t.parquet",
                   row_group_size=2)  # two row groups: the column arrives chunked
    ds = load_dataset(tmp_path / "t.parquet")
    assert ds.lengths.tolist() == [3, 1, 5] and ds.has_docs and ds.has_tokens
    assert [ds.tokens(d).tolist() for d in range(3)] == ids
    cut = load_dataset(tmp_path / "t.parquet", context_len=2)
    assert cut.lengths.tolist() == [2, 1, 2] and cut.truncated == 2
    assert cut.tokens(2).tolist() == [9, 10]


def test_jsonl_token_lists_any_single_list_column(tmp_path):
    ids = [[1, 2], [3, 4, 5, 6], [7, 8, 9]]
    (tmp_path / "t.jsonl").write_text("".join(json.dumps({"ids_of_doc": t, "n": 0}) + "\n" for t in ids))
    ds = load_dataset(tmp_path / "t.jsonl")
    assert ds.lengths.tolist() == [2, 4, 3]
    assert ds.tokens(1).tolist() == [3, 4, 5, 6]


def test_null_token_id_names_its_row(tmp_path):
    pq.write_table(pa.table({"input_ids": [[1, 2], [3], [4, None, 5]]}), tmp_path / "t.parquet")
    with pytest.raises(UserError, match=r"column 'input_ids' row 3: a null token id"):
        load_dataset(tmp_path / "t.parquet")


def test_reading_every_form_leaves_pandas_unimported(tmp_path):
    """pyarrow imports pandas on its first to_numpy (0.4 s of every command's start-up): columns go through
    DLPack instead, for the builtins and every columnar form."""
    import subprocess
    import sys

    pq.write_table(pa.table({"input_ids": [[1, 2], [3]]}), tmp_path / "t.parquet")
    (tmp_path / "h.csv").write_text("length,count\n5,3\n9.0,1\n")
    (tmp_path / "t.jsonl").write_text('{"tokens": [1, 2, 3]}\n')
    (tmp_path / "l.txt").write_text("4\n8\n")
    code = ("import sys; from hydraplan.store.datasets import load_dataset\n"
            f"for spec in ['builtin:wikipedia', 'builtin:prolong', *{[str(p) for p in sorted(tmp_path.iterdir())]}]:\n"
            "    load_dataset(spec).histogram()\n"
            "print('pandas' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


@pytest.mark.parametrize("longest", [50, 2**21 + 3])
def test_histogram_counts_every_length(longest):
    """Counted by bincount up to 2^20 (or the table's size), sorted beyond: both give np.unique's table."""
    rng = np.random.default_rng(longest)
    lengths = np.r_[rng.integers(1, 40, 5000), longest]
    values, counts = Dataset("x", lengths, has_docs=True).histogram()
    want_values, want_counts = np.unique(lengths, return_counts=True)
    assert values.tolist() == want_values.tolist() and counts.tolist() == want_counts.tolist()
    assert values.dtype == counts.dtype == np.int64


def test_length_only_dataset_has_no_tokens(tmp_path):
    np.save(tmp_path / "l.npy", np.array([3, 4]))
    with pytest.raises(UserError, match="no token ids"):
        load_dataset(tmp_path / "l.npy").tokens(0)


# ------------------------------------------------------------------------------------------- Megatron
def test_megatron_index_documents_and_tokens(tmp_path):
    docs = [[[1, 2, 3]], [[4, 5], [6, 7, 8, 9]], [[10]], [list(range(100, 120))]]
    write_megatron(tmp_path / "corpus_text_document", docs)
    for spec in (tmp_path / "corpus_text_document.idx", tmp_path / "corpus_text_document"):  # file or prefix
        ds = load_dataset(str(spec))
        assert ds.lengths.tolist() == [3, 6, 1, 20] and ds.has_docs
        assert ds.tokens(1).tolist() == [4, 5, 6, 7, 8, 9]
        assert ds.tokens(3).tolist() == list(range(100, 120))
    cut = load_dataset(tmp_path / "corpus_text_document.idx", context_len=4)
    assert cut.lengths.tolist() == [3, 4, 1, 4] and cut.tokens(3).tolist() == [100, 101, 102, 103]


def test_megatron_int32_tokens_and_missing_bin(tmp_path):
    write_megatron(tmp_path / "d", [[[70000, 2]], [[3, 4, 5]]], dtype=np.int32, code=4)
    assert load_dataset(tmp_path / "d.idx").tokens(0).tolist() == [70000, 2]
    (tmp_path / "d.bin").unlink()
    ds = load_dataset(tmp_path / "d.idx")
    assert ds.lengths.tolist() == [2, 3] and not ds.has_tokens


@pytest.mark.parametrize("problem, message", [
    ("magic", "not a Megatron MMIDIDX index"), ("version", "version 2"), ("code", "dtype code 9"),
    ("truncated", "truncated index"),
    ("short-bin", "does not match its index"),
])
def test_megatron_bad_index(tmp_path, problem, message):
    docs = [[[1, 2]], [[3]]]
    write_megatron(tmp_path / "d", docs, code=9 if problem == "code" else 8, version=2 if problem == "version" else 1)
    idx = tmp_path / "d.idx"
    if problem == "magic":
        idx.write_bytes(b"NOTMMIDX\x00" + idx.read_bytes()[9:])
    if problem == "truncated":
        idx.write_bytes(idx.read_bytes()[:-5])
    if problem == "short-bin":
        (tmp_path / "d.bin").write_bytes((tmp_path / "d.bin").read_bytes()[:-2])
    with pytest.raises(UserError, match=message):
        load_dataset(idx)


# ------------------------------------------------------------------------------------ empty documents
WITH_EMPTY = [0, 7, 3, 0, 0, 12, 0]  # rows 1, 2, 5 hold tokens


@pytest.mark.parametrize("form", ["txt", "npy", "json", "jsonl", "csv-hist", "tokens", "megatron"])
def test_empty_documents_are_skipped_counted_and_keep_their_rows(tmp_path, form):
    if form == "txt":
        (path := tmp_path / "l.txt").write_text("\n".join(map(str, WITH_EMPTY)) + "\n")
    elif form == "npy":
        np.save(path := tmp_path / "l.npy", np.array(WITH_EMPTY))
    elif form == "json":
        (path := tmp_path / "l.json").write_text(json.dumps(WITH_EMPTY))
    elif form == "jsonl":
        (path := tmp_path / "l.jsonl").write_text("".join(json.dumps({"length": v}) + "\n" for v in WITH_EMPTY))
    elif form == "csv-hist":
        (path := tmp_path / "h.csv").write_text("length,count\n0,4\n3,1\n7,1\n12,1\n")
    elif form == "tokens":
        pq.write_table(pa.table({"input_ids": [list(range(100 * r, 100 * r + n)) for r, n in enumerate(WITH_EMPTY)]}),
                       path := tmp_path / "t.parquet")
    else:
        write_megatron(tmp_path / "m", [[list(range(100 * r, 100 * r + n))] if n else [] for r, n in enumerate(WITH_EMPTY)])
        path = tmp_path / "m.idx"
    ds = load_dataset(path)
    assert ds.empty == 4 and ds.documents == 7
    if form == "csv-hist":
        assert sorted(ds.lengths.tolist()) == [3, 7, 12] and not ds.has_docs
        return
    assert ds.lengths.tolist() == [7, 3, 12]
    assert [ds.doc_length(r) for r in range(7)] == WITH_EMPTY
    # every sampled document is a non-empty file row, with that row's length
    for b in sample_iterations(ds, tokens_per_iter=10, iterations=6, seed=1):
        assert set(b.docs.tolist()) <= {1, 2, 5}
        assert b.lengths.tolist() == [WITH_EMPTY[d] for d in b.docs]
    if form in ("tokens", "megatron"):
        for r, n in enumerate(WITH_EMPTY):
            assert ds.tokens(r).tolist() == list(range(100 * r, 100 * r + n))
        cut = load_dataset(path, context_len=5)
        assert cut.lengths.tolist() == [5, 3, 5] and cut.tokens(5).tolist() == [500, 501, 502, 503, 504]


def test_negative_lengths_stay_errors_and_all_empty_is_an_error(tmp_path):
    (neg := tmp_path / "neg.json").write_text("[3, 0, -1]")
    with pytest.raises(UserError, match="item 2: -1 is not a non-negative length"):
        load_dataset(neg)
    (hist := tmp_path / "h.csv").write_text("length,count\n-2,1\n")
    with pytest.raises(UserError, match="column 'length' line 2: -2 is not a non-negative length"):
        load_dataset(hist)
    (zeros := tmp_path / "z.npy").unlink(missing_ok=True)
    np.save(zeros, np.zeros(3, dtype=np.int64))
    with pytest.raises(UserError, match="all 3 documents are empty"):
        load_dataset(zeros)


# ------------------------------------------------------------------------------------------- builtins
@pytest.mark.parametrize("name, count, tokens, longest", [
    ("wikipedia", 1_000_000, 1_013_648_780, 1_823_777),   # figures of data/README.md
    ("prolong", 77_932, 237_840_913, 340_149),
])
def test_builtin_histograms_are_lossless(name, count, tokens, longest):
    ds = load_dataset(f"builtin:{name}")
    assert ds.lengths.size == count and int(ds.lengths.sum()) == tokens and int(ds.lengths.max()) == longest
    assert not ds.has_docs and ds.name == f"builtin:{name}"


def test_builtin_wikipedia_long_tail_matches_readme():
    """README: documents over 4K are 4.4% of the count but 43% of the tokens."""
    s = share_above(load_dataset("builtin:wikipedia").lengths, (4096,))[0]
    assert round(s.docs, 3) == 0.044 and round(s.tokens, 2) == 0.43


def test_truncation_caps_lengths_and_counts_cut_documents():
    ds = Dataset(name="x", lengths=np.array([5, 50, 500, 5000]), has_docs=True).truncate(100)
    assert ds.lengths.tolist() == [5, 50, 100, 100] and ds.truncated == 2 and ds.context_len == 100


# ----------------------------------------------------------------------------------------- stats math
def test_summary_matches_independent_statistics():
    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 70_000, 501)
    s = summarize(lengths, dataset="r")
    data = lengths.tolist()
    q = statistics.quantiles(data, n=100, method="inclusive")
    assert (s.count, s.tokens, s.min, s.max) == (len(data), sum(data), min(data), max(data))
    assert s.median == pytest.approx(statistics.median(data)) and s.mean == pytest.approx(statistics.mean(data))
    assert s.p90 == pytest.approx(q[89]) and s.p99 == pytest.approx(q[98])
    for share in s.share_above:
        longer = [v for v in data if v > share.threshold]
        assert share.docs == pytest.approx(len(longer) / len(data))
        assert share.tokens == pytest.approx(sum(longer) / sum(data))


def test_log2_histogram_bins_by_bit_length():
    data = [1, 2, 3, 4, 5, 8, 9, 1024, 1025, 4096]
    bins = log2_histogram(np.array(data))
    assert [(b.lo, b.hi) for b in bins][:4] == [(0, 1), (1, 2), (2, 4), (4, 8)] and bins[-1].hi == 4096
    for b in bins:
        inside = [v for v in data if b.lo < v <= b.hi]
        assert (b.docs, b.tokens) == (len(inside), sum(inside))
    assert sum(b.docs for b in bins) == len(data)


# ------------------------------------------------------------------------------------------- sampling
def _docs_dataset(n=50, seed=1, has_docs=True) -> Dataset:
    return Dataset(name="t", lengths=np.random.default_rng(seed).integers(1, 400, n), has_docs=has_docs)


def test_every_document_exactly_once_per_epoch_and_ids_are_stream_positions():
    ds = _docs_dataset()
    batches = sample_iterations(ds, 1000, 60, seed=7)  # ~10k tokens per epoch: several epochs
    ids = np.concatenate([b.ids for b in batches])
    docs = np.concatenate([b.docs for b in batches])
    assert np.array_equal(ids, np.arange(ids.size))
    epochs = ids.size // ds.lengths.size
    assert epochs >= 3
    orders = [docs[e * 50:(e + 1) * 50] for e in range(epochs)]
    for order in orders:
        assert sorted(order.tolist()) == list(range(50))
    assert all(not np.array_equal(orders[0], o) for o in orders[1:])    # reshuffled every epoch
    for b in batches:
        assert np.array_equal(b.lengths, ds.lengths[b.docs])


def test_token_budget_includes_the_sequence_that_reaches_it():
    ds = _docs_dataset()
    for budget in (1, 350, 1000, int(ds.lengths.sum())):  # the whole dataset, the largest batch allowed
        for b in sample_iterations(ds, budget, 8, seed=2):
            assert b.tokens >= budget and b.tokens - int(b.lengths[-1]) < budget


def test_budget_hit_exactly_ends_the_iteration():
    ds = Dataset(name="eq", lengths=np.full(7, 10), has_docs=True)
    batches = sample_iterations(ds, 30, 9, seed=1)   # 63 sequences: crosses 8 epoch boundaries
    assert [b.ids.size for b in batches] == [3] * 9 and all(b.tokens == 30 for b in batches)


def test_sampling_is_deterministic_and_seed_dependent():
    a = sample_iterations(_docs_dataset(), 1000, 5, seed=3)
    b = sample_iterations(_docs_dataset(), 1000, 5, seed=3)
    c = sample_iterations(_docs_dataset(), 1000, 5, seed=4)
    assert all(np.array_equal(x.docs, y.docs) for x, y in zip(a, b))
    assert not all(np.array_equal(x.docs, y.docs) for x, y in zip(a, c))


@pytest.mark.parametrize("start, count", [(0, 3), (7, 5), (11, 1), (29, 4)])
def test_window_independence(start, count):
    """Iteration k is the same whatever window asks for it, on a fresh dataset or a cached stream."""
    full = sample_iterations(_docs_dataset(), 900, 40, seed=5)
    cached = _docs_dataset()
    sample_iterations(cached, 900, 2, seed=5, start=20)
    for ds in (_docs_dataset(), cached):
        window = sample_iterations(ds, 900, count, seed=5, start=start)
        assert [w.iteration for w in window] == list(range(start, start + count))
        for w in window:
            ref = full[w.iteration]
            assert np.array_equal(w.ids, ref.ids) and np.array_equal(w.docs, ref.docs)
            assert np.array_equal(w.lengths, ref.lengths)


def test_permutation_is_uniform_over_seeds():
    """Which document comes first in epoch 0 is uniform (4 documents, 800 seeds: 200 expected each)."""
    ds = Dataset(name="u", lengths=np.array([10, 10, 10, 10]), has_docs=True)
    first = Counter(int(sample_iterations(ds, 1, 1, seed=s)[0].docs[0]) for s in range(800))
    assert set(first) == {0, 1, 2, 3} and all(140 < c < 260 for c in first.values())


def test_histogram_datasets_sample_without_doc_indices():
    ds = _docs_dataset(has_docs=False)
    batch = sample_iterations(ds, 500, 1, seed=0)[0]
    assert batch.docs is None and batch.tokens >= 500 and batch.ids.tolist() == list(range(batch.ids.size))


@pytest.mark.parametrize("kwargs, message", [
    ({"tokens_per_iter": 0}, "^tokens_per_iter must be positive"), ({"seed": -1}, "^seed must be non-negative"),
    ({"start": -2}, "non-negative"),
])
def test_sampling_rejects_bad_arguments(kwargs, message):
    args = {"tokens_per_iter": 100, "iterations": 1, "seed": 0} | kwargs
    with pytest.raises(UserError, match=message):
        sample_iterations(_docs_dataset(), **args)
