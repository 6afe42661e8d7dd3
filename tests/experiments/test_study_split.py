"""The study's held-out evaluation: training, dev and test split by file (no file in two), the test split the same
256 KiB for every run and read whole, every byte predicted once, and each run's summary measured on it."""

import math

import pytest
import torch
import torch.nn.functional as F

from addnorm.experiments.study import RunConfig, train_run
from addnorm.experiments.study.data import DEV_BYTES, TEST_BYTES, SplitError, load_split
from addnorm.experiments.study.heldout import heldout_loss
from addnorm.experiments.study.runner import build_model
from addnorm.harness.corpus import text_files

TINY = dict(depth=2, d_model=32, heads=2, seq_len=32, batch=4, steps=12, eval_every=6, eval_batches=2,
            checkpoint_every=6)


@pytest.fixture(scope="module")
def data():
    return load_split(max_bytes=1 << 20)


def test_no_file_is_in_two_splits_and_every_split_has_its_size(data):
    train, dev, test = set(data.train_files), set(data.dev_files), set(data.test_files)
    assert train and dev and test
    assert not (train & dev) and not (train & test) and not (dev & test)
    files, _ = text_files(None)
    assert train | dev | test == {f.name for f in files}  # every file in one split (training's capped at max_bytes)
    assert data.val_bytes == TEST_BYTES == 262_144 and len(data.test) == TEST_BYTES + 1
    assert data.dev_bytes == DEV_BYTES and len(data.dev) == DEV_BYTES + 1


def test_the_test_split_is_its_files_bytes_in_order(data):
    files = {f.name: f for f in text_files(None)[0]}
    test = b"".join(files[n].read_bytes() for n in data.test_files)[:TEST_BYTES + 1]
    dev = b"".join(files[n].read_bytes() for n in data.dev_files)[:DEV_BYTES + 1]
    assert bytes(data.test.tolist()) == test and bytes(data.dev.tolist()) == dev
    # the files of each held-out split are needed: without the last one it would be short
    assert sum(len(files[n].read_bytes()) for n in data.test_files[:-1]) < TEST_BYTES + 1


def test_the_test_split_is_the_same_bytes_whatever_the_training_cap(data):
    other = load_split(max_bytes=1 << 16)
    assert torch.equal(other.test, data.test) and torch.equal(other.dev, data.dev)
    assert other.digest != data.digest  # the training bytes differ, and the cache key with them
    assert load_split(max_bytes=1 << 20).digest == data.digest


def test_the_splits_plateaus_are_their_own(data):
    counts = torch.bincount(data.train.long(), minlength=256).double() + 1
    logp = (counts / counts.sum()).log()
    assert data.test_unigram_nats == pytest.approx(-logp[data.test[1:].long()].mean().item())
    assert data.unigram_nats == pytest.approx(-logp[data.dev[1:].long()].mean().item())
    assert data.unigram_nats != data.test_unigram_nats


def _folder(tmp_path, sizes):
    d = tmp_path / "corpus"
    d.mkdir()
    for i, n in enumerate(sizes):
        (d / f"f{i:02d}.txt").write_text(("the residual stream " * (n // 20 + 1))[:n])
    return d


def test_a_folder_too_small_for_the_test_split_says_what_it_has_and_needs(tmp_path):
    d = _folder(tmp_path, [20_000] * 12)  # held out: every 10th file, one of them -> 20,000 bytes
    with pytest.raises(SplitError, match=r"hold 20,000 bytes; a test split of 262,144 bytes needs 262,145") as e:
        load_split(d)
    assert e.value.argument == "test_bytes" and "--test-bytes" in str(e.value)


def test_the_command_line_names_the_option_that_fixes_a_small_folder(tmp_path, capsys):
    from addnorm.cli.main import main

    d = _folder(tmp_path, [20_000] * 12)
    assert main(["study", "--preset", "quick", "--data", str(d), "--out", str(tmp_path / "out")]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "--test-bytes: " in err and "hold 20,000 bytes; a test split of 262,144 bytes needs 262,145" in err


def test_a_smaller_test_split_is_allowed_and_recorded(tmp_path):
    d = _folder(tmp_path, [20_000] * 12)
    s = load_split(d, test_bytes=8192, dev_bytes=4096, held_out_every=5)  # held out: f04 and f09
    assert (s.val_bytes, s.dev_bytes, s.test_files, s.dev_files) == (8192, 4096, ("f04.txt",), ("f09.txt",))
    with pytest.raises(SplitError, match="the dev split needs 4,097") as e:
        load_split(d, test_bytes=8192, dev_bytes=4096)  # one held-out file: none left for dev
    assert e.value.argument == "dev_bytes"


@pytest.mark.parametrize("kw, name", [(dict(test_bytes=0), "test_bytes"), (dict(dev_bytes=10), "dev_bytes"),
                                      (dict(held_out_every=1), "held_out_every")])
def test_bad_split_sizes_are_refused_by_name(kw, name):
    with pytest.raises(SplitError, match=f"{name} must be an integer"):
        load_split(**kw)


class _Bigram(torch.nn.Module):
    """Logits from the input byte alone: the loss of each target is known without windows."""

    def __init__(self):
        super().__init__()
        self.table = torch.nn.Parameter(torch.randn(256, 256, generator=torch.Generator().manual_seed(0)))

    def forward(self, idx):
        return self.table[idx]


@pytest.mark.parametrize("seq_len, sequences", [(32, 64), (7, 5), (1000, 3)])
def test_every_byte_after_the_first_is_predicted_once(seq_len, sequences):
    data = torch.randint(0, 256, (1001,), generator=torch.Generator().manual_seed(1), dtype=torch.int64)
    data = data.to(torch.uint8)
    m = _Bigram()
    direct = F.cross_entropy(m.table[data[:-1].long()], data[1:].long(), reduction="mean").item()
    assert heldout_loss(m, data, seq_len, sequences) == pytest.approx(direct, rel=1e-6)


def test_a_models_loss_is_its_windows_and_does_not_depend_on_the_batching(data):
    torch.manual_seed(0)
    m = build_model(RunConfig(**TINY))
    part = data.test[:32 * 5 + 10 + 1]  # five whole windows of 32 and one of 10
    m.eval()
    with torch.no_grad():
        by_hand = sum(F.cross_entropy(m(part[i:i + n][None].long())[0], part[i + 1:i + n + 1].long(),
                                      reduction="sum")
                      for i, n in ((0, 32), (32, 32), (64, 32), (96, 32), (128, 32), (160, 10))) / 170
    m.train()
    assert heldout_loss(m, part, 32, sequences=2) == pytest.approx(by_hand.item(), rel=1e-5)
    assert m.training  # the mode is put back
    assert heldout_loss(m, part, 32, sequences=2) == pytest.approx(heldout_loss(m, part, 32, sequences=64), rel=1e-6)


def test_a_runs_final_loss_is_the_test_split_read_whole(data, tmp_path):
    s = train_run(RunConfig(**TINY), data, tmp_path)
    m = build_model(RunConfig(**TINY))
    m.load_state_dict(torch.load(tmp_path / "checkpoint.pt", weights_only=True)["model"])
    assert s["final_val_loss"] == heldout_loss(m, data.test, 32)
    assert s["final_dev_loss"] == heldout_loss(m, data.dev, 32)
    assert (s["val_bytes"], s["dev_bytes"]) == (TEST_BYTES, DEV_BYTES)
    assert s["test_eval_seconds"] > 0 and s["test_unigram_nats"] == data.test_unigram_nats
    # the curve during training reads the dev split's fixed batches, not the test split
    assert s["val_curve"][-1][1] != s["final_val_loss"] and math.isfinite(s["val_curve"][-1][1])
