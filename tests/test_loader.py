"""hydraplan.loader hands each rank exactly its pipeline's micro-batches; examples/fsdp2_train.py (FSDP2
over 3 gloo ranks, fed by Planner + loader) trains exactly like one process on the whole global batch."""

import re
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from helpers import cpu_env, free_port
from ranks import launch

from hydraplan import Planner
from hydraplan.core.errors import UserError
from hydraplan.loader import PlanLoader
from hydraplan.runtime.batches import IGNORE
from hydraplan.runtime.model import StageModule, get_config, init_full, load_full, param_specs
from hydraplan.schema import Candidate, PipelineSpec, Plan, Strategies
from hydraplan.store.datasets import load_dataset, sample_iterations
from hydraplan.store.fileio import load_model, write_model
from hydraplan.store.paths import ROOT
from hydraplan.store.profiles import load_profile

EXAMPLE = ROOT / "examples" / "fsdp2_train.py"
VOCAB = get_config("tiny").vocab


def test_import_needs_no_torch():
    """`import hydraplan.loader` stays torch-free (it is the public api, above the runtime); PackedBatch is the
    runtime's, loaded on first use."""
    code = ("import sys, hydraplan.loader as m; assert 'torch' not in sys.modules, 'torch imported'; "
            "from hydraplan.loader import PackedBatch; from hydraplan.runtime.batches import PackedBatch as P; "
            "assert PackedBatch is P")
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.fixture(scope="module")
def tokens_file(tmp_path_factory):
    """A tokenized corpus (token-id lists) with some empty documents, as real corpora have."""
    rng = np.random.default_rng(0)
    lengths = np.minimum(rng.lognormal(5.0, 1.0, 300).astype(np.int64), 900)
    lengths[::13] = 0
    path = tmp_path_factory.mktemp("data") / "tokens.parquet"
    pq.write_table(pa.table({"input_ids": [rng.integers(0, VOCAB, n).tolist() for n in lengths]}), path)
    return path


def dp_planner(world: int) -> Planner:
    return Planner("cpu-tiny", Strategies(candidates=[Candidate(name="dp", pipelines=[PipelineSpec(tp=1, pp=1, cp=1)] * world)]),
                   gpus=world, context_len=512, synthesize=False)


def test_each_rank_gets_its_pipelines_micro_batches_once(tokens_file):
    dataset = load_dataset(tokens_file)
    batch = sample_iterations(dataset.truncate(512), 2500, 1, seed=3)[0]
    plan = dp_planner(4).plan(batch)
    loader = PlanLoader(tokens_file, vocab=VOCAB)
    loader.check(plan)
    by_rank = {r: list(loader.micro_batches(plan, r)) for r in range(5)}  # rank 4 is in no pipeline
    assert by_rank[4] == []
    for p in plan.pipelines:
        (rank,) = p.ranks
        mbs = by_rank[rank]
        assert [mb.num_tokens for mb in mbs] == [sum(s.length for s in plan.batch if s.id in m.seqs) for m in p.micro_batches]
    # the ranks' micro-batches hold every planned document once, with the dataset's own tokens
    docs = {s.id: s.doc for s in plan.batch}
    seen = []
    for p in plan.pipelines:
        for m, mb in zip(p.micro_batches, by_rank[p.ranks[0]]):
            starts = mb.cu_seqlens.tolist()
            for sid, lo, hi in zip(m.seqs, starts, starts[1:]):
                assert mb.tokens[lo:hi].tolist() == dataset.tokens(docs[sid])[:hi - lo].tolist()
                assert mb.positions[lo:hi].tolist() == list(range(hi - lo))
                seen.append(sid)
    assert sorted(seen) == sorted(docs)
    labeled = sum(int((mb.labels != IGNORE).sum()) for mbs in by_rank.values() for mb in mbs)
    assert loader.labeled_tokens(plan) == labeled


def test_a_plan_naming_an_empty_document_is_rejected(tokens_file):
    dataset = load_dataset(tokens_file)
    plan = dp_planner(2).plan(sample_iterations(dataset, 600, 1, seed=0)[0])
    empty_row = next(r for r in range(dataset.documents) if dataset.doc_length(r) == 0)
    plan.batch[0].doc = empty_row
    with pytest.raises(UserError, match=f"batch.0.length: .* exceeds document {empty_row}'s 0 tokens"):
        PlanLoader(dataset, vocab=VOCAB).check(plan)


def single_process(plans: list[Plan], dataset, optimizer: str, lr: float) -> torch.Tensor:
    """The ground truth: one process trains every micro-batch of every pipeline, loss = summed token losses
    over the global batch's labeled tokens (counted here, from the labels)."""
    cfg = get_config("tiny")
    model = StageModule(cfg, dtype=torch.float64)
    load_full(model, [init_full(s, i, 0, torch.float64) for i, s in enumerate(param_specs(cfg))])
    opt = (torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.1) if optimizer == "adamw"
           else torch.optim.SGD(model.parameters(), lr=lr))
    loader = PlanLoader(dataset, vocab=cfg.vocab)
    for plan in plans:
        mbs = [mb for p in plan.pipelines for mb in loader.data.micro_batches(plan, p)]
        tokens = sum(int((mb.labels != IGNORE).sum()) for mb in mbs)
        for mb in mbs:
            (model(None, mb) / tokens).backward()
        opt.step()
        opt.zero_grad()
    return torch.cat([p.detach().reshape(-1) for p in model.ordered_params()])


@pytest.mark.slow
@pytest.mark.parametrize("optimizer, tokens_per_iter", [
    ("sgd", 1500),   # SGD: any error in the loss scale or the gradient sum shows in the parameters
    ("adamw", 400),  # a few documents per batch: some ranks have no micro-batch
])
def test_fsdp2_example_equals_single_process_training(tmp_path, tokens_file, optimizer, tokens_per_iter):
    """3 ranks: a rank's share of the summed gradients, unequal micro-batch counts and idle ranks as on any N, and
    the tiny model's parameters do not split evenly over 3 (FSDP2 pads the shards), one process less than 4."""
    lr = 0.5 if optimizer == "sgd" else 1e-2
    # cpu-tiny's <1,1,1> with MaxLen = the 512-token context: each rank's ~500 tokens need one or two
    # micro-batches whatever cpu-tiny's measured MaxLen is today
    prof = load_profile("cpu-tiny")
    one = prof.scheme(1, 1, 1).model_copy(update={"max_len": 512})
    write_model(tmp_path / "small.json", prof.model_copy(update={"name": "small", "schemes": [one]}))
    res = launch(3, ["--dataset", str(tokens_file), "--iterations", "2", "--tokens-per-iter", str(tokens_per_iter),
                     "--profile", str(tmp_path / "small.json"), "--dtype", "fp64", "--optimizer", optimizer,
                     "--lr", str(lr), "--save-plans", str(tmp_path / "plans"), "--out", str(tmp_path / "params.pt")],
                 module=str(EXAMPLE), timeout=600)  # its ranks as torchrun starts them (tests/ranks.py)
    assert res.returncode == 0, res.stderr[-2000:]
    plans = [load_model(Plan, f) for f in sorted((tmp_path / "plans").glob("iter_*.json"))]
    assert len(plans) == 2 and all(len(p.pipelines) == 3 for p in plans)
    counts = [len(p.micro_batches) for plan in plans for p in plan.pipelines]
    if optimizer == "sgd":
        assert max(counts) > 1 and len(set(counts)) > 1  # gradient accumulation over unequal micro-batch counts
    else:
        assert 0 in counts
    trained = torch.load(tmp_path / "params.pt")
    expected = single_process(plans, load_dataset(tokens_file), optimizer, lr)
    init = torch.cat([init_full(s, i, 0, torch.float64).reshape(-1) for i, s in enumerate(param_specs(get_config("tiny")))])
    assert float((expected - init).abs().max()) > 1e-3  # training moved the parameters
    assert float((trained - expected).abs().max()) <= 1e-9


@pytest.mark.slow
@pytest.mark.parametrize("args", [[], ["--dtype", "bf16"]])
def test_fsdp2_example_trains_with_its_defaults_on_gloo(args):
    """`torchrun --nproc-per-node 2 examples/fsdp2_train.py` as the README shows it (and with --dtype bf16): gloo has
    no PREMUL_SUM, so the gradients must be summed with ReduceOp.SUM; three iterations train."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", str(free_port()),
           str(EXAMPLE), *args]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=cpu_env())
    assert res.returncode == 0, res.stderr[-2000:]
    losses = [float(x) for x in re.findall(r"^iteration \d+ tokens=\d+ loss=(\S+)", res.stdout, re.M)]
    assert len(losses) == 3 and all(4.0 < x < 6.0 for x in losses)  # ~ln(128) for a fresh tiny model
