"""Resolve a MODEL argument: torchvision name, ``hf:FAMILY``, ``timm:NAME``, ``file.py:factory``, or ``.json`` graph."""

from __future__ import annotations

import contextlib
import difflib
import importlib.util
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from gawee.errors import ModelSpecError
from gawee.frontend.capture import CaptureStats, capture
from gawee.frontend.dynamic import dynamic_spec
from gawee.ir.core import Graph


@dataclass
class ModelSource:
    """What a MODEL spec resolved to: a module with example inputs, or a saved graph."""

    name: str
    module: torch.nn.Module | None = None
    example_inputs: tuple[torch.Tensor, ...] = ()
    graph: Graph | None = None


def torchvision_names() -> list[str]:
    import torchvision

    return sorted(torchvision.models.list_models(module=torchvision.models))


def torchvision_video_names() -> list[str]:
    """torchvision's video classifiers (r3d_18, mc3_18, s3d, ...): not in torchvision_names (the image zoo)."""
    import torchvision

    return sorted(torchvision.models.list_models(module=torchvision.models.video))


def default_input(name: str, batch: int = 1, device: str = "cpu") -> tuple[torch.Tensor, ...]:
    """The conventional input of a torchvision classifier: ImageNet 224 x 224 (299 x 299 for inception_v3),
    16 frames of 112 x 112 for a video model."""
    if name in torchvision_video_names():
        return (torch.randn(batch, 3, 16, 112, 112, device=device),)
    size = 299 if name == "inception_v3" else 224
    return (torch.randn(batch, 3, size, size, device=device),)


def resolve(
    spec: str, *, batch: int = 1, meta: bool = False, seed: int = 0, input_shapes: Sequence[Sequence[int]] | None = None
) -> ModelSource:
    """Turn ``spec`` into a ModelSource; raises ModelSpecError when it resolves to nothing.

    * ``resnet18`` — a torchvision classifier with random weights (``weights=None``);
    * ``path/to/file.py:factory`` — ``factory()`` returns a module, or ``(module, example_inputs)``;
    * ``path/to/graph.json`` — a graph saved by gawee;
    * ``hf:bert``, ``hf:gpt2``, ``hf:t5-encoder``, ``hf:llama``, ``hf:vit``, ``hf:whisper-encoder`` — a
      Hugging Face model from a small built-in config (``hf:llama:layers=4,hidden=128``), called with
      ids and an attention mask; ``hf:mistral``, ``hf:bart``... any other transformers model type, from its
      default config with the small sizes (or untouched, where they do not fit it);
      ``timm:deit_tiny_patch16_224`` — a timm model (see gawee.frontend.families; both need
      ``pip install 'gawee[transformers]'``).

    ``meta`` builds the module on the meta device (structure and cost only).
    ``input_shapes`` overrides the example inputs (float32 tensors of those shapes).
    """
    device = "meta" if meta else "cpu"
    torch.manual_seed(seed)
    if spec.endswith(".json"):
        from gawee.ir.serialize import load

        if not Path(spec).exists():
            raise ModelSpecError(f"no such file: {spec}", hint="give the path of a graph saved with -o/--output")
        return ModelSource(Path(spec).stem, graph=load(spec))
    if ":" in spec and spec.split(":", 1)[0].endswith(".py"):
        module, inputs = _from_factory(spec, device)
        path_s, factory_name = spec.split(":", 1)
        name = f"{Path(path_s).name}:{factory_name}"
    elif spec.startswith(("hf:", "timm:")):
        from gawee.frontend import families

        build = families.hugging_face if spec.startswith("hf:") else families.timm_model
        module, inputs = build(spec, batch, device)
        name = spec.split(":")[1] if spec.startswith("hf:") else spec.split(":", 1)[1]
    else:
        names = torchvision_names() + torchvision_video_names()
        if spec not in names:
            close = difflib.get_close_matches(spec, names, n=3)
            raise ModelSpecError(
                f"{spec!r} is not a torchvision model, hf:FAMILY, timm:NAME, a file.py:factory, or a .json graph",
                hint=f"did you mean {' or '.join(close)}?"
                if close
                else "e.g. resnet18, hf:bert, timm:deit_tiny_patch16_224, path/to/model.py:make_model, saved.json",
            )
        import torchvision

        with torch.device(device):
            module = torchvision.models.get_model(spec, weights=None)
        inputs = default_input(spec, batch, device)
        name = spec
    if input_shapes:
        inputs = tuple(torch.randn(*s, device=device) for s in input_shapes)
    return ModelSource(name, module=module.eval(), example_inputs=tuple(inputs))


@contextlib.contextmanager
def _importable_from(folder: Path):
    """Put ``folder`` first on ``sys.path`` while a model file is loaded and its factory runs, as ``python
    file.py`` would (a module next to the file imports), and take it off again afterwards."""
    entry = str(folder)
    sys.path.insert(0, entry)
    try:
        yield
    finally:
        if entry in sys.path:
            sys.path.remove(entry)


def _from_factory(spec: str, device: str) -> tuple[torch.nn.Module, tuple]:
    path_s, factory_name = spec.split(":", 1)
    path = Path(path_s)
    if not path.is_file():
        raise ModelSpecError(f"no such file: {path}", hint="MODEL may be path/to/file.py:factory")
    mod_name = f"gawee_user_model_{abs(hash(str(path.resolve())))}"
    loader_spec = importlib.util.spec_from_file_location(mod_name, path)
    module = importlib.util.module_from_spec(loader_spec)
    sys.modules[mod_name] = module
    with _importable_from(path.resolve().parent):
        try:
            loader_spec.loader.exec_module(module)
        except Exception as e:  # user code: any failure is a bad model spec
            raise ModelSpecError(f"importing {path} failed: {type(e).__name__}: {e}") from e
        factory = getattr(module, factory_name, None)
        if not callable(factory):
            found = [n for n in dir(module) if not n.startswith("_") and callable(getattr(module, n))]
            raise ModelSpecError(
                f"{path} has no callable {factory_name!r}", hint=f"callables there: {', '.join(found[:8]) or 'none'}"
            )
        try:
            with torch.device(device):
                made = factory()
        except Exception as e:  # user code
            raise ModelSpecError(f"{spec}() raised {type(e).__name__}: {e}") from e
    if isinstance(made, tuple) and len(made) == 2 and isinstance(made[0], torch.nn.Module):
        inputs = made[1] if isinstance(made[1], (tuple, list)) else (made[1],)
        return made[0], tuple(inputs)
    if isinstance(made, torch.nn.Module):
        return made, (torch.randn(1, 3, 224, 224, device=device),)
    raise ModelSpecError(
        f"{spec}() returned {type(made).__name__}", hint="return an nn.Module, or (module, example_inputs)"
    )


def load_graph(
    spec: str,
    *,
    batch: int = 1,
    meta: bool = False,
    stats: CaptureStats | None = None,
    input_shapes: Sequence[Sequence[int]] | None = None,
    dynamic: str | None = None,
) -> tuple[Graph, ModelSource]:
    """Resolve ``spec`` and capture it (a saved graph is returned as loaded). ``dynamic`` marks dynamic
    dimensions in the command line's short form (``batch``, ``seq``, ``x:0``; gawee.frontend.dynamic)."""
    src = resolve(spec, batch=batch, meta=meta, input_shapes=input_shapes)
    if src.graph is not None:
        if dynamic:
            raise ModelSpecError("--dynamic applies to a capture, not to a saved graph", hint="drop --dynamic")
        return src.graph, src
    if not dynamic:
        return capture(src.module, src.example_inputs, name=src.name, stats=stats), src
    shapes, src.example_inputs = dynamic_spec(dynamic, src.module, src.example_inputs)
    return capture(src.module, src.example_inputs, name=src.name, stats=stats, dynamic_shapes=shapes), src
