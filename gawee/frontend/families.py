"""Model families beyond torchvision, built from configs with random weights (nothing is downloaded).

* ``hf:FAMILY`` — a Hugging Face ``transformers`` model from a small built-in config, called with
  token ids and an attention mask (the last quarter of the sequence is padding) and returning
  ``last_hidden_state``. Families: bert, gpt2, t5-encoder, llama (grouped-query attention, RoPE),
  vit, whisper-encoder. Overrides follow a colon: ``hf:llama:layers=4,hidden=128,seq=32``
  (keys: layers, hidden, heads, kv_heads, seq, vocab). Any other ``transformers`` model type works too
  (``hf:mistral``, ``hf:roberta``, ``hf:deit``): its default config with those sizes, its base model, called
  with token ids and a mask or with images.
* ``timm:NAME`` — ``timm.create_model(NAME, pretrained=False)`` on its configured input size.

``transformers`` and ``timm`` are optional: ``pip install 'gawee[transformers]'`` brings both.
"""

from __future__ import annotations

import contextlib
import difflib
import importlib
import inspect
import logging
from collections.abc import Callable

import torch

from gawee.errors import ModelSpecError, first_line

log = logging.getLogger("gawee.models")

INSTALL_HINT = "install them with: pip install 'gawee[transformers]' (transformers and timm)"

SIZES = {"layers": 2, "hidden": 64, "heads": 4, "kv_heads": 2, "seq": 16, "vocab": 1000}
"""The built-in config: small enough to capture and verify in seconds, every structural feature present."""


def require(module: str):
    """Import an optional dependency, or raise ModelSpecError saying how to install it."""
    try:
        return importlib.import_module(module)
    except ImportError:
        raise ModelSpecError(f"{module} is not installed", hint=INSTALL_HINT) from None


class HFTensors(torch.nn.Module):
    """A ``transformers`` model called with keyword tensors, returning ``last_hidden_state`` only
    (no cache objects, no ModelOutput): the shape torch.export and gawee want."""

    def __init__(self, model: torch.nn.Module, input_names: tuple[str, ...], **fixed):
        super().__init__()
        self.model = model
        self.input_names = input_names
        self.fixed = fixed

    def forward(self, *tensors: torch.Tensor) -> torch.Tensor:
        return self.model(**dict(zip(self.input_names, tensors)), **self.fixed).last_hidden_state


def _text_inputs(s: dict, batch: int, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.randint(0, s["vocab"], (batch, s["seq"]), device=device)
    mask = torch.ones(batch, s["seq"], dtype=torch.long, device=device)
    mask[:, s["seq"] - s["seq"] // 4 :] = 0  # right padding: the mask must change the result
    return ids, mask


def _bert(T, s, batch, device):
    cfg = T.BertConfig(
        vocab_size=s["vocab"],
        hidden_size=s["hidden"],
        num_hidden_layers=s["layers"],
        num_attention_heads=s["heads"],
        intermediate_size=4 * s["hidden"],
        max_position_embeddings=max(64, s["seq"]),
    )
    return HFTensors(T.BertModel(cfg), ("input_ids", "attention_mask")), _text_inputs(s, batch, device)


def _gpt2(T, s, batch, device):
    cfg = T.GPT2Config(
        vocab_size=s["vocab"],
        n_embd=s["hidden"],
        n_layer=s["layers"],
        n_head=s["heads"],
        n_positions=max(64, s["seq"]),
        bos_token_id=0,
        eos_token_id=0,
    )
    model = HFTensors(T.GPT2Model(cfg), ("input_ids", "attention_mask"), use_cache=False)
    return model, _text_inputs(s, batch, device)


def _t5_encoder(T, s, batch, device):
    cfg = T.T5Config(
        vocab_size=s["vocab"],
        d_model=s["hidden"],
        d_kv=s["hidden"] // s["heads"],
        d_ff=4 * s["hidden"],
        num_layers=s["layers"],
        num_heads=s["heads"],
        decoder_start_token_id=0,
    )
    return HFTensors(T.T5EncoderModel(cfg), ("input_ids", "attention_mask")), _text_inputs(s, batch, device)


def _llama(T, s, batch, device):
    cfg = T.LlamaConfig(
        vocab_size=s["vocab"],
        hidden_size=s["hidden"],
        intermediate_size=4 * s["hidden"],
        num_hidden_layers=s["layers"],
        num_attention_heads=s["heads"],
        num_key_value_heads=s["kv_heads"],
        max_position_embeddings=max(64, s["seq"]),
        bos_token_id=0,
        eos_token_id=0,
    )
    model = HFTensors(T.LlamaModel(cfg), ("input_ids", "attention_mask"), use_cache=False)
    return model, _text_inputs(s, batch, device)


def _vit(T, s, batch, device):
    cfg = T.ViTConfig(
        hidden_size=s["hidden"],
        num_hidden_layers=s["layers"],
        num_attention_heads=s["heads"],
        intermediate_size=4 * s["hidden"],
        image_size=32,
        patch_size=8,
    )
    return HFTensors(T.ViTModel(cfg), ("pixel_values",)), (torch.randn(batch, 3, 32, 32, device=device),)


def _whisper_encoder(T, s, batch, device):
    cfg = T.WhisperConfig(
        vocab_size=s["vocab"],
        d_model=s["hidden"],
        encoder_layers=s["layers"],
        decoder_layers=1,
        encoder_attention_heads=s["heads"],
        decoder_attention_heads=s["heads"],
        encoder_ffn_dim=4 * s["hidden"],
        decoder_ffn_dim=4 * s["hidden"],
        num_mel_bins=16,
        max_source_positions=s["seq"],
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        decoder_start_token_id=1,
    )
    encoder = T.WhisperModel(cfg).get_encoder()
    frames = torch.randn(batch, 16, 2 * s["seq"], device=device)  # the encoder wants 2 x max_source_positions
    return HFTensors(encoder, ("input_features",)), (frames,)


HF_FAMILIES: dict[str, Callable] = {
    "bert": _bert,
    "gpt2": _gpt2,
    "t5-encoder": _t5_encoder,
    "llama": _llama,
    "vit": _vit,
    "whisper-encoder": _whisper_encoder,
}


AUTO_SIZES = (
    ("vocab_size", "vocab"),
    ("hidden_size", "hidden"),
    ("embedding_size", "hidden"),
    ("num_hidden_layers", "layers"),
    ("encoder_layers", "layers"),
    ("decoder_layers", "layers"),
    ("num_attention_heads", "heads"),
    ("encoder_attention_heads", "heads"),
    ("decoder_attention_heads", "heads"),
    ("num_key_value_heads", "kv_heads"),
)
"""Config attributes (or their aliases, through a config's ``attribute_map``) the small sizes set on any family."""


DEFAULT_CONFIG_MAX_PARAMS = 500_000_000
"""A family's default config is built (where the small sizes do not fit it) only up to this many parameters (2 GB
in float32): hf:convnext's has 28 M, hf:xlnet's 360 M; a language model's default can be billions."""


def _auto(T, model_type: str, s: dict, batch: int, device: str, *, explicit: bool = False):
    """Any other ``transformers`` model type: its default config with the small sizes set where it has them as
    integers (head_dim and the MLP widths follow), its base model (``AutoModel``, in eval mode) called as its
    main input says: token ids and an attention mask, or a batch of 32x32 images. One call checks that the
    sizes fit the family. Where they do not (a hierarchical vision model's stage widths are lists the sizes leave
    as they are: hf:convnext, hf:swin) and none were asked for (``explicit``), the family's default config is
    built instead (up to :data:`DEFAULT_CONFIG_MAX_PARAMS`), on 64x64 images and then on its own image size; a
    warning says so."""
    try:
        return _auto_model(T, model_type, _small_config(T, model_type, s), s, batch, device, 32)
    except ModelSpecError:
        raise
    except Exception as e:
        if explicit:
            raise
        first = e
    cfg = T.AutoConfig.for_model(model_type)
    with torch.device("meta"):  # counted without memory: a language model's default config can be billions
        params = sum(p.numel() for p in T.AutoModel.from_config(cfg).parameters())
    if params > DEFAULT_CONFIG_MAX_PARAMS:
        raise first
    for image in (64, None):
        try:
            model = _auto_model(T, model_type, cfg, s, batch, device, image)
        except Exception:  # the next size; the small sizes' error is the one reported
            continue
        log.warning(
            "hf:%s: the small sizes do not fit it (%s: %s); built from its default config instead",
            model_type,
            type(first).__name__,
            first_line(first),
        )
        return model
    raise first


def _small_config(T, model_type: str, s: dict):
    cfg = T.AutoConfig.for_model(model_type)
    derived = {
        "head_dim": s["hidden"] // s["heads"],
        "rotary_dim": s["hidden"] // s["heads"],  # GPT-J's rotary part of each head: at most the head
        "intermediate_size": 4 * s["hidden"],
        "encoder_ffn_dim": 4 * s["hidden"],
        "decoder_ffn_dim": 4 * s["hidden"],
        "max_position_embeddings": max(64, s["seq"]),
        "image_size": 32,
        "patch_size": 8,
    }
    for attr, value in [*((a, s[k]) for a, k in AUTO_SIZES), *derived.items()]:
        if isinstance(getattr(cfg, attr, None), int) and not isinstance(getattr(cfg, attr), bool):
            with contextlib.suppress(AttributeError):  # a derived property without a setter (Falcon's head_dim)
                setattr(cfg, attr, value)
    for attr in ("pad_token_id", "bos_token_id", "eos_token_id", "decoder_start_token_id"):
        if isinstance(getattr(cfg, attr, None), int) and getattr(cfg, attr) >= s["vocab"]:
            setattr(cfg, attr, 0)
    return cfg


def _auto_model(T, model_type: str, cfg, s: dict, batch: int, device: str, image: int | None):
    """``cfg``'s base model and its example inputs, called once: token ids and an attention mask of the small
    sizes ``s``, or images of ``image`` pixels a side (None: the config's own image size)."""
    model = T.AutoModel.from_config(cfg).eval()
    params = inspect.signature(model.forward).parameters
    fixed = {"use_cache": False} if "use_cache" in params else {}
    if model.main_input_name == "input_ids":
        names = ("input_ids", "attention_mask") if "attention_mask" in params else ("input_ids",)
        inputs = _text_inputs(s, batch, device)[: len(names)]
    elif model.main_input_name == "pixel_values":
        size = image or getattr(cfg, "image_size", 224)
        size = size if isinstance(size, int) else 224
        names, inputs = ("pixel_values",), (torch.randn(batch, getattr(cfg, "num_channels", 3), size, size),)
    else:
        raise ModelSpecError(
            f"hf:{model_type} takes {model.main_input_name}, which gawee cannot make up",
            hint="build the model and its inputs in a file (MODEL as file.py:factory)",
        )
    wrapped = HFTensors(model, names, **fixed)
    with torch.no_grad():
        wrapped(*inputs)  # raises here, named as the spec's fault, when the sizes do not fit the family
    return wrapped, inputs


def _sizes(overrides: str) -> dict[str, int]:
    sizes = dict(SIZES)
    for item in filter(None, overrides.split(",")):
        key, _, value = item.partition("=")
        if key not in sizes or not value.isdigit() or int(value) < 1:
            raise ModelSpecError(
                f"bad override {item!r}",
                hint=f"KEY=N with N >= 1, KEY one of {', '.join(sizes)}; e.g. hf:bert:layers=4",
            )
        sizes[key] = int(value)
    if sizes["hidden"] % sizes["heads"] or sizes["heads"] % sizes["kv_heads"]:
        raise ModelSpecError(
            f"hidden={sizes['hidden']}, heads={sizes['heads']}, kv_heads={sizes['kv_heads']} do not divide",
            hint="heads must divide hidden, and kv_heads must divide heads",
        )
    return sizes


SUGGESTION_CUTOFF = 0.75
"""How alike (difflib's ratio, case folded) a name must be to be suggested: a misspelling (``gtp2``, ``lama``,
``robertta``) is, a name sharing a few letters with one of several hundred model types (``notamodel``) is not."""


def close_names(name: str, names: list[str], n: int = 2) -> list[str]:
    """The distinct ``names`` most like ``name`` (case folded), best first; none when nothing is close."""
    by_folded: dict[str, str] = {}
    for candidate in names:
        by_folded.setdefault(candidate.lower(), candidate)
    close = difflib.get_close_matches(name.lower(), list(by_folded), n=n, cutoff=SUGGESTION_CUTOFF)
    return [by_folded[c] for c in close]


def hugging_face(spec: str, batch: int, device: str) -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    """``hf:FAMILY[:k=v,...]`` → (module, example inputs)."""
    _, _, rest = spec.partition(":")
    family, _, overrides = rest.partition(":")
    sizes = _sizes(overrides)
    T = require("transformers")
    types = T.CONFIG_MAPPING.keys()
    if family not in HF_FAMILIES and family not in types:
        close = close_names(family, [*HF_FAMILIES, *types])
        raise ModelSpecError(
            f"no Hugging Face family {family!r}",
            hint=(f"did you mean hf:{close[0]}? " if close else "")
            + "built in: "
            + ", ".join(f"hf:{f}" for f in HF_FAMILIES)
            + "; any other transformers model type too (hf:mistral, hf:roberta...)",
        )
    T.logging.set_verbosity_error()  # config warnings about token ids outside the small vocabulary
    with torch.device(device):
        if family in HF_FAMILIES:
            return HF_FAMILIES[family](T, sizes, batch, device)
        try:
            return _auto(T, family, sizes, batch, device, explicit=bool(overrides))
        except ModelSpecError:
            raise
        except Exception as e:  # a config the small sizes do not fit, a model that needs more than ids or images
            raise ModelSpecError(
                f"hf:{family} could not be built from its default config with small sizes: {type(e).__name__}: {e}",
                hint="try other sizes (hf:FAMILY:hidden=128,heads=4), or build it in a file (MODEL as file.py:factory)",
            ) from None


def timm_model(spec: str, batch: int, device: str) -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    """``timm:NAME`` → (module with random weights, an input of its configured size)."""
    name = spec.partition(":")[2]
    timm = require("timm")
    if name not in timm.list_models():
        close = timm.list_models(f"*{name}*")[:3]
        raise ModelSpecError(
            f"{name!r} is not a timm model",
            hint=f"did you mean {' or '.join(close)}?" if close else "see timm.list_models() for the names",
        )
    with torch.device(device):
        model = timm.create_model(name, pretrained=False)
    size = tuple(getattr(model, "pretrained_cfg", {}).get("input_size", (3, 224, 224)))
    return model, (torch.randn(batch, *size, device=device),)
