"""Transformer families capture completely (no opaque op), run like eager PyTorch, and optimize verifiably;
capture failures are one-screen CaptureErrors with a hint for the cause and torch's output in a log file."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

import gawee
from gawee.errors import CaptureError, ModelSpecError
from gawee.frontend.models import resolve
from gawee.ops import OPAQUE

SMALL = "layers=2,hidden=32,heads=4,kv_heads=2,seq=12,vocab=128"


@pytest.mark.parametrize("family", ["mistral", "roberta", "bart", "bloom", "gemma2", "deit", "segformer"])
def test_any_transformers_model_type_captures_and_optimizes_with_no_opaque_op(family):
    """Families beyond the built-in ones, from their default configs with the small sizes: the decoders' RoPE,
    sliding windows and ALiBi (bloom's ``baddbmm``), gemma2's softmax in float32, an encoder-decoder, images."""
    pytest.importorskip("transformers")
    src = resolve(f"hf:{family}:{SMALL}", batch=2)
    stats = gawee.CaptureStats()
    g = gawee.capture(src.module, src.example_inputs, name=family, stats=stats)
    assert stats.opaque_ops == {}
    with torch.no_grad():
        ref = src.module(*src.example_inputs)
    (out,) = gawee.run(g, *src.example_inputs)
    assert (out - ref).abs().max().item() <= 1e-4 * max(1.0, ref.abs().max().item())
    opt, _ = gawee.rewrite(g)
    report = gawee.verify_equivalent(g, opt, list(src.example_inputs))
    assert report.ok, str(report)


@pytest.mark.parametrize("family", ["bert", "gpt2", "t5-encoder", "llama"])
def test_hugging_face_family_captures_runs_and_optimizes(family):
    pytest.importorskip("transformers")
    src = resolve(f"hf:{family}:{SMALL}", batch=2)
    ids, mask = src.example_inputs
    assert mask.dtype == torch.long and not mask.all(), "the example must exercise the attention mask"
    stats = gawee.CaptureStats()
    g = gawee.capture(src.module, src.example_inputs, name=family, stats=stats)
    gawee.verify(g)
    assert stats.opaque_ops == {} and not [n for n in g if n.op == OPAQUE]
    with torch.no_grad():
        ref = src.module(ids, mask)
        unmasked = src.module(ids, torch.ones_like(mask))
    assert (ref - unmasked).abs().max() > 1e-3, "the mask changes the result, so the graph must honour it"
    (out,) = gawee.run(g, ids, mask)
    assert out.shape == ref.shape and out.dtype == ref.dtype
    assert (out - ref).abs().max().item() <= 1e-4 * max(1.0, ref.abs().max().item())
    opt, _ = gawee.rewrite(g)
    gawee.verify(opt)
    report = gawee.verify_equivalent(g, opt, [ids, mask])
    assert report.ok, str(report)


def test_llama_uses_grouped_query_attention_and_rope():
    pytest.importorskip("transformers")
    src = resolve(f"hf:llama:{SMALL}")
    cfg = src.module.model.config
    assert cfg.num_key_value_heads < cfg.num_attention_heads
    g = gawee.capture(src.module, src.example_inputs)
    ops = {n.op for n in g}
    assert {"sin", "cos"} <= ops, "rotary embeddings are computed in the graph"
    assert "scaled_dot_product_attention" in ops
    opt, report = gawee.rewrite(g)
    assert report.firings["attention_grouped_query"] == cfg.num_hidden_layers
    attention = [n for n in opt if n.op == "scaled_dot_product_attention"]
    assert all(n.attrs["enable_gqa"] for n in attention)
    assert all(n.inputs[1].type.shape[1] == cfg.num_key_value_heads for n in attention), "keys not repeated"
    assert not any(n.op == "expand" for n in opt)
    assert gawee.verify_equivalent(g, opt, list(src.example_inputs)).ok


class MaskedScale(torch.nn.Module):
    def forward(self, x, mask):
        return x * mask.to(x.dtype)


def test_a_cast_for_a_mask_captures_without_its_runtime_check():
    x, mask = torch.randn(2, 5), torch.tensor([[1, 1, 0, 1, 0], [0, 1, 1, 1, 1]])
    stats = gawee.CaptureStats()
    g = gawee.capture(MaskedScale(), (x, mask), stats=stats)
    assert stats.dropped_checks == {"aten._assert_tensor_metadata.default": 1}
    assert sorted(n.op for n in g) == ["cast", "mul"]
    torch.testing.assert_close(gawee.run(g, x, mask)[0], MaskedScale()(x, mask))


class SizeOut(torch.nn.Module):
    """Returns a value computed from data (a symbolic int) through an op gawee has no OpDef for."""

    def forward(self, x):
        return torch.ops.aten._local_scalar_dense(x.sum())


def test_a_non_tensor_result_is_a_capture_error():
    with pytest.raises(CaptureError, match="returns a non-tensor result") as info:
        gawee.capture(SizeOut(), (torch.randn(3),))
    assert "test_transformers.py" in info.value.where and "data-dependent" in info.value.hint


def _log_of(err: CaptureError) -> Path:
    found = re.search(r"torch's output and full error: (\S+)", err.message)
    assert found, err.message
    return Path(found[1])


def test_a_cache_object_in_the_output_says_use_cache_false(capfd):
    T = pytest.importorskip("transformers")
    T.logging.set_verbosity_error()
    cfg = T.GPT2Config(vocab_size=64, n_embd=32, n_layer=1, n_head=4, n_positions=32, bos_token_id=0, eos_token_id=0)
    model = T.GPT2Model(cfg)  # use_cache defaults to True: forward returns a DynamicCache
    with pytest.raises(CaptureError) as info:
        gawee.capture(model, (torch.randint(0, 64, (1, 8)),))
    err = info.value
    assert "use_cache=False" in err.hint
    assert err.where and "modeling_gpt2.py" in err.where and "<string>" not in str(err)
    assert len(str(err).splitlines()) <= 6
    assert _log_of(err).is_file() and "DynamicCache" in _log_of(err).read_text()
    assert capfd.readouterr().err == ""
    _log_of(err).unlink()


class Detector(torch.nn.Module):
    """A detection head's post-processing in miniature: boxes above a score threshold, then per-box work
    whose trip count depends on the data."""

    def __init__(self):
        super().__init__()
        self.head = torch.nn.Linear(4, 5)

    def forward(self, x):
        out = self.head(x)
        boxes, scores = out[:, :4], out[:, 4]
        keep = boxes[scores > 0]  # data-dependent size
        if keep.shape[0] > 2:  # data-dependent branch: torch.export fails here
            keep = keep[:2]
        return keep


Detector.__module__ = "tests.frontend.detection_like"  # what torchvision.models.detection classes look like


def test_an_export_failure_is_one_screen_with_the_dump_in_a_file(capfd):
    with pytest.raises(CaptureError) as info:
        gawee.capture(Detector(), (torch.randn(16, 4),))
    err = info.value
    text = str(err)
    assert "torch.export could not capture the model" in text
    assert err.where and "test_transformers.py" in err.where  # the user's line, not torch's
    assert "capture the backbone" in err.hint
    assert len(text.splitlines()) <= 6 and len(text) < 1200
    log = _log_of(err)
    assert "Traceback" in log.read_text()
    captured = capfd.readouterr()
    assert captured.err == "" and captured.out == ""
    log.unlink()


def test_a_successful_capture_leaves_no_log_behind(tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)
    gawee.capture(MaskedScale(), (torch.randn(2, 3), torch.ones(2, 3)))
    assert list(tmp_path.iterdir()) == []


def test_hf_and_timm_specs_report_bad_names():
    pytest.importorskip("transformers")
    with pytest.raises(ModelSpecError, match="no Hugging Face family") as info:
        resolve("hf:bertt")
    assert "did you mean hf:bert" in info.value.hint
    with pytest.raises(ModelSpecError, match="no Hugging Face family") as info:
        resolve("hf:notamodel")  # shares a few letters with one of hundreds of model types: no suggestion
    assert "did you mean" not in info.value.hint
    with pytest.raises(ModelSpecError) as info:
        resolve("hf:GTP2")
    assert "did you mean hf:gpt2?" in info.value.hint
    with pytest.raises(ModelSpecError, match="takes input_features, which gawee cannot make up"):
        resolve("hf:whisper")  # hf:whisper-encoder is the built-in family for it
    with pytest.raises(ModelSpecError, match=r"could not be built .* with small sizes") as info:
        resolve("hf:convnext:hidden=64")  # asked for: its stages' widths are a list the sizes leave as they are
    assert "file.py:factory" in info.value.hint
    with pytest.raises(ModelSpecError, match="bad override"):
        resolve("hf:bert:depth=3")
    pytest.importorskip("timm")
    with pytest.raises(ModelSpecError, match="not a timm model"):
        resolve("timm:deit_tinny_patch16_224")


def test_a_missing_optional_dependency_says_how_to_install(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "transformers", None)  # what an absent package looks like to import
    with pytest.raises(ModelSpecError) as info:
        resolve("hf:bert")
    assert "pip install 'gawee[transformers]'" in info.value.hint


def test_a_torchvision_video_model_resolves_and_captures_without_opaque_ops():
    src = resolve("r3d_18", meta=True)  # structure only: fast
    assert src.example_inputs[0].shape == (1, 3, 16, 112, 112)
    stats = gawee.CaptureStats()
    g = gawee.capture(src.module, src.example_inputs, stats=stats)
    assert stats.opaque_ops == {}
    assert {"conv3d", "adaptive_avg_pool3d"} <= {n.op for n in g}


def test_a_family_the_small_sizes_do_not_fit_is_built_from_its_default_config(caplog):
    """hf:convnext's stage widths are a list the small sizes leave as they are: built as they were, it failed."""
    pytest.importorskip("transformers")
    with caplog.at_level("WARNING", logger="gawee.models"):
        src = resolve("hf:convnext")
    assert "hf:convnext: the small sizes do not fit it (RuntimeError: " in caplog.text
    assert "built from its default config instead" in caplog.text
    assert list(src.module.model.config.hidden_sizes) == [96, 192, 384, 768]  # transformers' default
    assert [tuple(x.shape) for x in src.example_inputs] == [(1, 3, 64, 64)]
    graph = gawee.capture(src.module, src.example_inputs)
    optimized, _ = gawee.rewrite(graph)
    assert gawee.verify_equivalent(graph, optimized, list(src.example_inputs)).ok


def test_a_default_config_too_large_to_build_is_not_built(monkeypatch):
    """A language model's default config can have billions of parameters: counted on the meta device first."""
    pytest.importorskip("transformers")
    from gawee.frontend import families

    monkeypatch.setattr(families, "DEFAULT_CONFIG_MAX_PARAMS", 1_000_000)  # hf:convnext's default has 28 M
    with pytest.raises(ModelSpecError, match=r"could not be built .* with small sizes"):
        resolve("hf:convnext")
