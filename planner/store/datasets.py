"""Length tables from every dataset form of docs/formats.md, and iteration sampling by token budget.

Readers turn a file into one positive length per document (int64) plus, for tokenized data, the token
ids; `load_dataset` truncates to the context length. Histograms lose document order, so their datasets
have `has_docs=False`: sampling a uniform random permutation of the expanded lengths draws exactly the
same length sequences as sampling the original documents, but the index of a drawn length names no
document. The bundled `builtin:` datasets are exact `length,count` histograms (see data/README.md).
"""

from __future__ import annotations

import gzip
import json
import math
import re
import warnings
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from os import PathLike
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from hydraplan.core.batch import Batch
from hydraplan.core.errors import UserError
from hydraplan.core.lengthstats import expand_bins, expand_exact
from hydraplan.store import paths

BUILTIN_PREFIX = "builtin:"
LOGNORMAL_PREFIX = "lognormal:"
LOGNORMAL_FIELDS = ("mean", "sigma", "min", "max", "seed", "size")
LOGNORMAL_SIZE = 1_000_000  # samples Megatron's mock dataset draws (MockSFTLowLevelDataset.size)
TOKEN_COLUMNS = ("input_ids", "tokens", "token_ids")
EXTENSIONS = (".csv", ".parquet", ".txt", ".npy", ".json", ".jsonl", ".idx")
COMPRESSIBLE = (".csv", ".txt", ".json", ".jsonl")
MEGATRON_MAGIC = b"MMIDIDX\x00\x00"
# Megatron-LM megatron/core/datasets/indexed_dataset.py, class DType.
MEGATRON_DTYPES = {1: np.uint8, 2: np.int8, 3: np.int16, 4: np.int32, 5: np.int64, 6: np.float64,
                   7: np.float32, 8: np.uint16}
_MEGATRON_HEADER = np.dtype([("version", "<u8"), ("code", "u1"), ("sequences", "<u8"), ("documents", "<u8")])
_INT_TEXT = re.compile(r"\s*[+-]?\d+\s*")
# Bounds that keep every token sum in int64 and the expanded length table in memory: Megatron stores
# lengths as int32, and 2**28 documents are 2 GiB of int64 lengths.
MAX_LENGTH = 2**31 - 1
MAX_DOCUMENTS = 2**28
# A context length that cuts more than this share of the documents is likely a mistake (a typo, a unit): warned.
# Fewer are reported by `pack` and `dataset stats` as a count (a 768-token test context cuts 27% of Wikipedia's).
TRUNCATION_WARN_SHARE = 1 / 3
# Only an empty field is missing: "NaN" or "inf" are values, reported as what they are (pyarrow.csv's
# ConvertOptions). pyarrow's compute, csv and json modules are imported where used: the builtins need none of them.
_CSV_NULLS = {"null_values": [""], "strings_can_be_null": True}

Locate = Callable[[int], str]


# ------------------------------------------------------------------------------------------- datasets
@dataclass(frozen=True)
class TokenStore:
    """Token ids of every document, flat: document d starts at values[offsets[d]].

    `values` may be a np.memmap (Megatron .bin), so ids are paged in only when a document is read.
    """

    values: np.ndarray
    offsets: np.ndarray


@dataclass(frozen=True, eq=False)
class Dataset:
    """The non-empty documents' lengths. Empty documents (0 tokens, common in tokenized corpora) hold nothing
    to train on: they are skipped and counted in `empty`; a document keeps its row in the file as its index
    (`rows` maps `lengths` to rows when some were skipped), so plans name the file's own documents."""

    name: str
    lengths: np.ndarray
    has_docs: bool
    context_len: int | None = None
    truncated: int = 0
    token_store: TokenStore | None = field(default=None, repr=False)
    empty: int = 0
    rows: np.ndarray | None = field(default=None, repr=False)

    @property
    def has_tokens(self) -> bool:
        return self.token_store is not None

    @property
    def documents(self) -> int:
        """Documents in the file, empty ones included (valid indices are 0..documents-1)."""
        return int(self.lengths.size) + self.empty

    def doc_rows(self, positions: np.ndarray) -> np.ndarray:
        """File rows (document indices) of positions in `lengths`."""
        return positions if self.rows is None else self.rows[positions]

    def doc_length(self, doc: int) -> int:
        """Tokens of document `doc` (its row in the file), truncated like `lengths`; 0 for an empty one."""
        if self.rows is None:
            return int(self.lengths[doc])
        i = int(np.searchsorted(self.rows, doc))
        return int(self.lengths[i]) if i < self.rows.size and self.rows[i] == doc else 0

    def histogram(self) -> tuple[np.ndarray, np.ndarray]:
        """(unique lengths, documents per length), both int64: counted in one pass when the longest length is
        within the table's size (or 2^20), else sorted (a million documents: 10 ms against 100 ms)."""
        longest = int(self.lengths.max())
        if longest > max(self.lengths.size, 2**20):
            values, counts = np.unique(self.lengths, return_counts=True)
            return values.astype(np.int64), counts.astype(np.int64)
        per_length = np.bincount(self.lengths, minlength=longest + 1)
        values = np.flatnonzero(per_length)
        return values.astype(np.int64), per_length[values].astype(np.int64)

    def tokens(self, doc: int) -> np.ndarray:
        """Token ids of document `doc`, truncated like its length (the first context_len tokens)."""
        if self.token_store is None:
            raise UserError(f"{self.name}: has no token ids (a length-only dataset)")
        start = int(self.token_store.offsets[doc])
        return np.asarray(self.token_store.values[start:start + self.doc_length(doc)])

    def truncate(self, context_len: int | None) -> Dataset:
        """Cut every document to context_len tokens (docs/formats.md: longer sequences are truncated)."""
        if context_len is None:
            return self
        if context_len < 1:
            raise UserError(f"context_len must be a positive number of tokens (got {context_len})", "context_len")
        cut = int(np.count_nonzero(self.lengths > context_len))
        if cut > TRUNCATION_WARN_SHARE * self.lengths.size:
            warnings.warn(f"{self.name}: {cut:,} of {self.lengths.size:,} documents ({cut / self.lengths.size:.0%}) are "
                          f"longer than the context length {context_len:,} and are truncated to it", stacklevel=2)
        return replace(self, lengths=np.minimum(self.lengths, context_len), context_len=context_len,
                       truncated=self.truncated + cut)


class BatchTooLarge(UserError):
    """One iteration's batch asks for more tokens than the dataset holds, so it would hold documents twice or
    more: refused rather than sampled across epochs (the app names the option that set it)."""


def check_batch(dataset: Dataset, tokens_per_iter: int) -> None:
    total = int(dataset.lengths.sum())
    if tokens_per_iter > total:
        raise BatchTooLarge(f"a batch of {tokens_per_iter:,} tokens is more than dataset {dataset.name} holds "
                            f"({total:,} tokens after truncation): its documents would repeat within an iteration")


def builtin_names() -> list[str]:
    return sorted(p.name.removesuffix(".parquet") for p in paths.DATA_DIR.glob("*.parquet"))


def lognormal_lengths(spec: str) -> np.ndarray:
    """The lengths of `lognormal:mean=M,sigma=S,min=A,max=B[,seed=0][,size=1000000]`: Megatron-LM's mock varlen
    dataset (MockSFTLowLevelDataset, dev at d48bd6b, what examples/dynamic_context_parallel trains): `size` draws
    of numpy's legacy lognormal seeded with `seed`, mu = ln(M) - S^2/2 (so M is the mean before clipping), clipped
    to [A, B] and truncated to integers; a sample of L drawn tokens trains on L - 1 (its tokens plus EOD, less the
    next-token shift), which is the length here."""
    fields: dict[str, float] = {}
    for part in spec[len(LOGNORMAL_PREFIX):].split(","):
        key, eq, value = part.partition("=")
        key = key.strip()
        if key not in LOGNORMAL_FIELDS or not eq:
            raise UserError(f"dataset {spec!r}: field {key or part!r} unknown (give {', '.join(LOGNORMAL_FIELDS)} as "
                            "name=value, comma-separated)", "dataset")
        try:
            fields[key] = float(value)
        except ValueError:
            raise UserError(f"dataset {spec!r}: field {key}: {value.strip()!r} is not a number", "dataset") from None
    missing = [k for k in ("mean", "sigma", "min", "max") if k not in fields]
    if missing:
        raise UserError(f"dataset {spec!r}: field {missing[0]} missing (give mean, sigma, min and max)", "dataset")
    for key in ("min", "max", "seed", "size"):
        if key in fields and (fields[key] != int(fields[key]) or fields[key] < (0 if key == "seed" else 2)):
            raise UserError(f"dataset {spec!r}: field {key}: {fields[key]:g} is not an integer of at least "
                            f"{0 if key == 'seed' else 2}", "dataset")
    if not 0 < fields["mean"] < 2**31 or not 0 < fields["sigma"] <= 10:
        bad = "mean" if not 0 < fields["mean"] < 2**31 else "sigma"
        raise UserError(f"dataset {spec!r}: field {bad}: {fields[bad]:g} is not a positive number"
                        + (" of at most 10" if bad == "sigma" else ""), "dataset")
    if not fields["min"] <= fields["max"] <= MAX_LENGTH:
        raise UserError(f"dataset {spec!r}: field max: {fields['max']:g} is below min {fields['min']:g} or above "
                        f"{MAX_LENGTH}", "dataset")
    size = int(fields.get("size", LOGNORMAL_SIZE))
    if size > MAX_DOCUMENTS:
        raise UserError(f"dataset {spec!r}: field size: {size} is more than {MAX_DOCUMENTS} documents", "dataset")
    mu = math.log(fields["mean"]) - fields["sigma"] ** 2 / 2
    drawn = np.random.RandomState(int(fields.get("seed", 0))).lognormal(mu, fields["sigma"], size)
    return np.clip(drawn, fields["min"], fields["max"]).astype(np.int64) - 1


def load_dataset(spec: str | PathLike[str], context_len: int | None = None) -> Dataset:
    """`builtin:NAME`, `lognormal:...` (lognormal_lengths), a file of a form in EXTENSIONS (optionally .gz), or a
    Megatron prefix (PATH.idx)."""
    spec = str(spec)
    if spec.startswith(LOGNORMAL_PREFIX):
        return Dataset(name=spec, lengths=lognormal_lengths(spec), has_docs=True).truncate(context_len)
    if spec.startswith(BUILTIN_PREFIX):
        name = spec[len(BUILTIN_PREFIX):]
        known = builtin_names()
        if name not in known:
            raise UserError(f"unknown builtin dataset {spec!r} (known: {', '.join(BUILTIN_PREFIX + k for k in known)})")
        path = paths.DATA_DIR / f"{name}.parquet"
    else:
        path = Path(spec)
        if not path.exists() and Path(spec + ".idx").is_file():
            path = Path(spec + ".idx")
    lengths, has_docs, store = read_lengths(path)
    keep = lengths > 0
    empty = int(lengths.size - np.count_nonzero(keep))
    if empty == lengths.size:
        raise UserError(f"{path}: all {empty:,} documents are empty (0 tokens)")
    if empty:
        rows = np.flatnonzero(keep) if has_docs else None
        return Dataset(name=spec, lengths=lengths[keep], has_docs=has_docs, token_store=store, empty=empty,
                       rows=rows).truncate(context_len)
    return Dataset(name=spec, lengths=lengths, has_docs=has_docs, token_store=store).truncate(context_len)


def read_lengths(path: Path) -> tuple[np.ndarray, bool, TokenStore | None]:
    """(lengths, has_docs, token ids or None) of one file, chosen by its extension."""
    if not path.exists():
        raise UserError(f"{path}: no such file")
    if path.is_dir():
        raise UserError(f"{path}: is a folder, expected a dataset file")
    if path.stat().st_size == 0:
        raise UserError(f"{path}: empty file")
    suffixes = [s.lower() for s in path.suffixes]
    ext = suffixes[-1] if suffixes else ""
    if ext == ".gz" and len(suffixes) >= 2 and suffixes[-2] in COMPRESSIBLE:
        ext = suffixes[-2]
    elif ext not in EXTENSIONS:
        raise UserError(f"{path}: unknown dataset extension {ext or '(none)'!r} (known: "
                        f"{', '.join(EXTENSIONS)}, .gz of {', '.join(COMPRESSIBLE)}, or builtin:NAME)")
    try:
        lengths, has_docs, store = _READERS[ext](path)
    except (pa.ArrowInvalid, pa.ArrowTypeError) as e:
        raise UserError(f"{path}: {_first_line(str(e))}") from None
    except (OSError, EOFError, UnicodeDecodeError) as e:
        raise UserError(f"{path}: cannot read: {_first_line(str(e))}") from None
    if lengths.size == 0:
        raise UserError(f"{path}: no documents")
    return lengths, has_docs, store


# ------------------------------------------------------------------------------------- validation
def _first_line(text: str) -> str:
    return text.strip().splitlines()[0] if text.strip() else "unreadable"


def _check_non_negative(values: np.ndarray, what: str, locate: Locate, noun: str = "length") -> None:
    """Lengths and counts may be 0 (an empty document is skipped by load_dataset), never negative."""
    bad = np.flatnonzero(values < 0)
    if bad.size:
        i = int(bad[0])
        raise UserError(f"{what} {locate(i)}: {int(values[i])} is not a non-negative {noun}")
    limit = MAX_DOCUMENTS if noun == "count" else MAX_LENGTH
    big = np.flatnonzero(values > limit)
    if big.size:
        i = int(big[0])
        unit = "documents" if noun == "count" else "tokens"
        raise UserError(f"{what} {locate(i)}: {int(values[i]):,} is too large (at most {limit:,} {unit})")


def _check_total(counts: np.ndarray, source: str) -> None:
    total = int(counts.sum())
    if total > MAX_DOCUMENTS:
        raise UserError(f"{source}: the histogram holds {total:,} documents, at most {MAX_DOCUMENTS:,} are supported")


def _first_non_integer(values: list[object]) -> int:
    for i, v in enumerate(values):
        if isinstance(v, bool) or not (isinstance(v, int) or (isinstance(v, str) and _INT_TEXT.fullmatch(v))):
            return i
    return 0


def _int_column(col: pa.ChunkedArray | pa.Array, what: str, locate: Locate) -> np.ndarray:
    """An integer column as int64; anything else names the first offending row and its value."""
    if col.null_count:
        import pyarrow.compute as pc

        i = int(np.flatnonzero(pc.is_null(col).to_numpy(zero_copy_only=False))[0])
        raise UserError(f"{what} {locate(i)}: empty, expected an integer")
    if pa.types.is_integer(col.type):
        return _numpy(col).astype(np.int64)
    if pa.types.is_floating(col.type):
        x = _numpy(col)
        bad = np.flatnonzero(~np.isfinite(x) | (x != np.round(x)) | (np.abs(x) > 2.0**62))
        if bad.size == 0:
            return x.astype(np.int64)
        i = int(bad[0])
        v = float(x[i])
        why = "is too large" if np.isfinite(v) and v == round(v) else "is not an integer"
        raise UserError(f"{what} {locate(i)}: {v!r} {why}")
    values = col.to_pylist()
    i = _first_non_integer(values)
    raise UserError(f"{what} {locate(i)}: {values[i]!r} is not an integer")


# ------------------------------------------------------------------------------------------- tables
def _numpy(values: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """A numeric column without nulls as numpy (read-only, zero copy for one chunk), through DLPack: pyarrow's
    to_numpy imports pandas on first use (0.4 s, a fifth of `propose`), in Cython code that loses a Ctrl-C."""
    return np.from_dlpack(values.combine_chunks() if isinstance(values, pa.ChunkedArray) else values)


def _from_table(table: pa.Table, source: str, locate: Locate) -> tuple[np.ndarray, bool, TokenStore | None]:
    """Pick the form by columns: `lo,hi,count` or `length,count` histogram, a token-id list column
    (input_ids/tokens/token_ids, or the only list-of-integer column), else a `length` column."""
    names = table.column_names
    if table.num_rows == 0:
        raise UserError(f"{source}: no documents (no data rows)")

    def col(name: str) -> np.ndarray:
        return _int_column(table.column(name), f"{source}: column {name!r}", locate)

    if {"lo", "hi", "count"} <= set(names):
        lo, hi, counts = col("lo"), col("hi"), col("count")
        _check_non_negative(counts, f"{source}: column 'count'", locate, "count")
        _check_total(counts, source)
        _check_non_negative(lo, f"{source}: column 'lo'", locate)
        _check_non_negative(hi, f"{source}: column 'hi'", locate)
        empty = np.flatnonzero(hi <= lo)
        if empty.size:
            i = int(empty[0])
            raise UserError(f"{source}: {locate(i)}: bin (lo, hi] = ({lo[i]}, {hi[i]}] holds no length (need lo < hi)")
        return expand_bins(lo, hi, counts), False, None
    if {"length", "count"} <= set(names):
        values, counts = col("length"), col("count")
        _check_non_negative(values, f"{source}: column 'length'", locate)
        _check_non_negative(counts, f"{source}: column 'count'", locate, "count")
        _check_total(counts, source)
        return expand_exact(values, counts), False, None
    token_col = _token_column(table, source)
    if token_col is not None:
        return _from_token_lists(table.column(token_col), f"{source}: column {token_col!r}", locate)
    if "length" in names:
        lengths = col("length")
        _check_non_negative(lengths, f"{source}: column 'length'", locate)
        return lengths, True, None
    raise UserError(f"{source}: no column 'length' (raw lengths), 'length,count' or 'lo,hi,count' (histogram), "
                    f"or token-id list column; found columns: {', '.join(names) or '(none)'}")


def _token_column(table: pa.Table, source: str) -> str | None:
    lists = [f.name for f in table.schema
             if (pa.types.is_list(f.type) or pa.types.is_large_list(f.type)) and pa.types.is_integer(f.type.value_type)]
    preferred = [n for n in TOKEN_COLUMNS if n in lists]
    if preferred:
        return preferred[0]
    if len(lists) > 1:
        raise UserError(f"{source}: several token-id list columns ({', '.join(lists)}); name one of them "
                        f"{', '.join(TOKEN_COLUMNS)}")
    return lists[0] if lists else None


def _from_token_lists(col: pa.ChunkedArray, what: str, locate: Locate) -> tuple[np.ndarray, bool, TokenStore]:
    import pyarrow.compute as pc

    arr = col.combine_chunks()
    if arr.null_count:
        i = int(np.flatnonzero(arr.is_null().to_numpy(zero_copy_only=False))[0])
        raise UserError(f"{what} {locate(i)}: null, expected a list of token ids")
    lengths = _numpy(pc.list_value_length(arr)).astype(np.int64)
    flat = arr.flatten()
    if flat.null_count:
        first = int(pc.index(flat.is_null(), True).as_py())
        i = int(np.searchsorted(np.cumsum(lengths), first, side="right"))
        raise UserError(f"{what} {locate(i)}: a null token id")
    values = _numpy(flat)
    offsets = np.concatenate(([0], np.cumsum(lengths)[:-1])).astype(np.int64)
    return lengths, True, TokenStore(values=values, offsets=offsets)


# ------------------------------------------------------------------------------------------ readers
def _read_csv(path: Path) -> tuple[np.ndarray, bool, TokenStore | None]:
    import pyarrow.csv as pacsv

    table = pacsv.read_csv(path, convert_options=pacsv.ConvertOptions(**_CSV_NULLS))
    return _from_table(table, str(path), lambda i: f"line {i + 2}")


def _read_txt(path: Path) -> tuple[np.ndarray, bool, None]:
    import pyarrow.csv as pacsv

    table = pacsv.read_csv(path, read_options=pacsv.ReadOptions(column_names=["length"]),
                           convert_options=pacsv.ConvertOptions(**_CSV_NULLS))
    if table.num_rows == 0:
        raise UserError(f"{path}: no documents (no lines)")
    locate: Locate = lambda i: f"line {i + 1}"  # noqa: E731
    lengths = _int_column(table.column("length"), f"{path}:", locate)
    _check_non_negative(lengths, f"{path}:", locate)
    return lengths, True, None


def _read_parquet(path: Path) -> tuple[np.ndarray, bool, TokenStore | None]:
    # ParquetFile, not read_table: the dataset layer read_table goes through imports pandas
    with pq.ParquetFile(path) as f:
        table = f.read()
    return _from_table(table, str(path), lambda i: f"row {i + 1}")


def _read_jsonl(path: Path) -> tuple[np.ndarray, bool, TokenStore | None]:
    import pyarrow.json as pajson

    return _from_table(pajson.read_json(path), str(path), lambda i: f"line {i + 1}")


def _read_json(path: Path) -> tuple[np.ndarray, bool, None]:
    opener = gzip.open if path.suffix.lower() == ".gz" else open
    with opener(path, "rt") as f:
        try:
            data = json.load(f)
        except json.JSONDecodeError as e:
            raise UserError(f"{path}: not valid JSON: {e.msg} at line {e.lineno} column {e.colno}") from None
    if not isinstance(data, list):
        raise UserError(f"{path}: expected a JSON list of lengths, got {type(data).__name__}")
    locate: Locate = lambda i: f"item {i}"  # noqa: E731
    if any(type(v) is not int for v in data):
        i = next(i for i, v in enumerate(data) if type(v) is not int)
        raise UserError(f"{path}: {locate(i)}: {data[i]!r} is not an integer")
    if any(abs(v) > MAX_LENGTH for v in data):
        i = next(i for i, v in enumerate(data) if abs(v) > MAX_LENGTH)
        raise UserError(f"{path}: {locate(i)}: {data[i]:,} is too large (at most {MAX_LENGTH:,} tokens)")
    lengths = np.asarray(data, dtype=np.int64)
    _check_non_negative(lengths, f"{path}:", locate)
    return lengths, True, None


def _read_npy(path: Path) -> tuple[np.ndarray, bool, None]:
    try:
        arr = np.load(path, allow_pickle=False)
    except ValueError as e:
        raise UserError(f"{path}: not a numeric .npy array: {_first_line(str(e))}") from None
    if arr.ndim != 1 or not np.issubdtype(arr.dtype, np.integer):
        raise UserError(f"{path}: expected a 1-D integer array, got shape {arr.shape} dtype {arr.dtype}")
    big = np.flatnonzero(arr > MAX_LENGTH)
    if big.size:
        i = int(big[0])
        raise UserError(f"{path}: index {i}: {int(arr[i]):,} is too large (at most {MAX_LENGTH:,} tokens)")
    lengths = arr.astype(np.int64)
    _check_non_negative(lengths, f"{path}:", lambda i: f"index {i}")
    return lengths, True, None


def _read_megatron(path: Path) -> tuple[np.ndarray, bool, TokenStore | None]:
    """Per-document lengths from a Megatron-LM MMIDIDX index; token ids from the .bin beside it.

    Layout (indexed_dataset.py, _IndexWriter): magic (9 bytes), version <u8 = 1, dtype code u1,
    sequence count <u8, document count <u8, then int32 sequence lengths, int64 byte pointers and int64
    document indices (document_count entries: 0, then the end sequence of each document).
    """
    raw = np.memmap(path, dtype=np.uint8, mode="r")
    head = 9 + _MEGATRON_HEADER.itemsize
    if raw.size < head or bytes(raw[:9]) != MEGATRON_MAGIC:
        raise UserError(f"{path}: not a Megatron MMIDIDX index (bad magic {bytes(raw[:9])!r})")
    h = np.frombuffer(raw, dtype=_MEGATRON_HEADER, count=1, offset=9)[0]
    if int(h["version"]) != 1:
        raise UserError(f"{path}: Megatron index version {int(h['version'])}, only version 1 is known")
    code = int(h["code"])
    if code not in MEGATRON_DTYPES:
        raise UserError(f"{path}: unknown Megatron dtype code {code} (known: {sorted(MEGATRON_DTYPES)})")
    n_seq, n_idx = int(h["sequences"]), int(h["documents"])
    need = head + 4 * n_seq + 8 * n_seq + 8 * n_idx
    if raw.size < need:
        raise UserError(f"{path}: truncated index: {raw.size} bytes, the header promises at least {need}")
    seq_len = np.frombuffer(raw, dtype="<i4", count=n_seq, offset=head).astype(np.int64)
    pointers = np.frombuffer(raw, dtype="<i8", count=n_seq, offset=head + 4 * n_seq)
    doc_idx = np.frombuffer(raw, dtype="<i8", count=n_idx, offset=head + 12 * n_seq)
    if n_idx < 1 or doc_idx[0] != 0 or doc_idx[-1] != n_seq or np.any(np.diff(doc_idx) < 0):
        raise UserError(f"{path}: document indices must rise from 0 to the sequence count {n_seq}")
    ends = np.concatenate(([0], np.cumsum(seq_len)))
    lengths = ends[doc_idx[1:]] - ends[doc_idx[:-1]]
    if lengths.size == 0:
        raise UserError(f"{path}: no documents")
    return lengths, True, _megatron_tokens(path.with_suffix(".bin"), MEGATRON_DTYPES[code], pointers,
                                           doc_idx, seq_len)


def _megatron_tokens(bin_path: Path, dtype: type, pointers: np.ndarray, doc_idx: np.ndarray,
                     seq_len: np.ndarray) -> TokenStore | None:
    if not bin_path.is_file():
        return None
    itemsize = np.dtype(dtype).itemsize
    size = bin_path.stat().st_size
    if np.any(pointers % itemsize) or (pointers.size and int(np.max(pointers + seq_len * itemsize)) > size):
        raise UserError(f"{bin_path}: does not match its index (pointers beyond its {size} bytes)")
    # An empty document's first sequence is the next document's (or none, at the end): its offset is unused.
    first = np.minimum(doc_idx[:-1], max(pointers.size - 1, 0))
    offsets = pointers[first] // itemsize if pointers.size else np.zeros(doc_idx.size - 1, dtype=np.int64)
    return TokenStore(values=np.memmap(bin_path, dtype=dtype, mode="r"), offsets=offsets)


_READERS: dict[str, Callable[[Path], tuple[np.ndarray, bool, TokenStore | None]]] = {
    ".csv": _read_csv, ".txt": _read_txt, ".parquet": _read_parquet, ".jsonl": _read_jsonl,
    ".json": _read_json, ".npy": _read_npy, ".idx": _read_megatron,
}


# ----------------------------------------------------------------------------------------- sampling
class _Stream:
    """The sampled stream of one (dataset, seed, budget): epoch e visits every document once, in the
    order of a permutation seeded by (seed, e). Iteration k covers stream positions
    [starts[k], starts[k+1]): it takes the next documents until their token sum reaches the budget,
    the document that reaches it included, so every iteration holds >= tokens_per_iter tokens.
    """

    EPOCH_CACHE = 4

    def __init__(self, lengths: np.ndarray, seed: int, budget: int) -> None:
        self.lengths, self.seed, self.budget = lengths, seed, budget
        self.n, self.total = lengths.size, int(lengths.sum())
        self.starts = [0]      # stream position where iteration k starts
        self.consumed = [0]    # tokens before iteration k
        self._epochs: dict[int, tuple[np.ndarray, np.ndarray]] = {}

    def epoch(self, e: int) -> tuple[np.ndarray, np.ndarray]:
        """(document order, cumulative tokens at each position's end) of epoch e."""
        if e not in self._epochs:
            if len(self._epochs) >= self.EPOCH_CACHE:
                del self._epochs[next(iter(self._epochs))]
            order = np.random.default_rng([self.seed, e]).permutation(self.n)
            self._epochs[e] = (order, np.cumsum(self.lengths[order]))
        return self._epochs[e]

    def extend(self, iterations: int) -> None:
        """Boundaries up to iteration `iterations`: each is the first document end at or after
        (tokens consumed so far + budget), found by searchsorted in that token's epoch."""
        while len(self.starts) <= iterations:
            target = self.consumed[-1] + self.budget
            e = (target - 1) // self.total
            _, ends = self.epoch(e)
            j = int(np.searchsorted(ends, target - e * self.total, side="left"))
            self.starts.append(e * self.n + j + 1)
            self.consumed.append(e * self.total + int(ends[j]))

    def docs(self, first: int, stop: int) -> np.ndarray:
        """Documents at stream positions [first, stop), across epoch boundaries."""
        parts = []
        for e in range(first // self.n, (stop - 1) // self.n + 1):
            lo, hi = max(first - e * self.n, 0), min(stop - e * self.n, self.n)
            parts.append(self.epoch(e)[0][lo:hi])
        return np.concatenate(parts).astype(np.int64)


# Resumed and chunked callers ask for consecutive windows; keeping the stream avoids recomputing
# every earlier boundary and permutation. Weak keys: a stream dies with its dataset.
_STREAMS: weakref.WeakKeyDictionary[Dataset, dict[tuple[int, int], _Stream]] = weakref.WeakKeyDictionary()


def sample_iterations(dataset: Dataset, tokens_per_iter: int, iterations: int, seed: int,
                      start: int = 0) -> list[Batch]:
    """Batches of iterations [start, start + iterations) of the stream of `_Stream`.

    Iteration k is the same whatever window is asked for, so a resumed run gets exactly its batches.
    """
    if tokens_per_iter < 1:
        raise UserError(f"tokens_per_iter must be positive (got {tokens_per_iter})", "tokens_per_iter")
    if iterations < 0 or start < 0:
        raise UserError(f"iterations and start must be non-negative (got {iterations}, {start})")
    if seed < 0:
        raise UserError(f"seed must be non-negative (got {seed})", "seed")
    check_batch(dataset, tokens_per_iter)
    streams = _STREAMS.setdefault(dataset, {})
    stream = streams.setdefault((seed, tokens_per_iter), _Stream(dataset.lengths, seed, tokens_per_iter))
    stream.extend(start + iterations)
    batches = []
    for k in range(start, start + iterations):
        first, stop = stream.starts[k], stream.starts[k + 1]
        docs = stream.docs(first, stop)
        batches.append(Batch(iteration=k, ids=np.arange(first, stop, dtype=np.int64),
                             docs=dataset.doc_rows(docs) if dataset.has_docs else None, lengths=dataset.lengths[docs]))
    return batches
