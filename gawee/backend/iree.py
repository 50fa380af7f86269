"""IREE: gawee's StableHLO (:mod:`gawee.backend.stablehlo`) compiled and run, the runtime ``backend="iree"``.

:func:`compile_iree` compiles the text with IREE for the host CPU (``llvm-cpu``) and
:class:`IreeModule` runs the result on torch tensors; :func:`write_artifacts` writes the text, the compiled
flatbuffer and, for a module with external weights, their ``.irpa`` parameter archive (:func:`write_parameters`,
through IREE's runtime). :class:`IreeRuntime` is the runtime registered as ``iree``. IREE is optional
(``pip install 'gawee[iree]'``): it is imported when first needed, so this module loads without it;
:func:`~gawee.backend.stablehlo.to_mlir` itself needs nothing beyond gawee.
"""

from __future__ import annotations

import functools
import os
import platform
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from gawee.backend.host import InputSignature, arrange, as_structure, numpy_inputs
from gawee.backend.runtime import Runtime
from gawee.backend.stablehlo import PARAMETER_SCOPE, LoweringError, MlirModule, lower_mlir
from gawee.ir.core import Graph
from gawee.ir.serialize import write_output
from gawee.ir.types import TensorType

__all__ = [
    "IreeModule",
    "compile_iree",
    "iree_unavailable",
    "write_artifacts",
    "write_parameters",
]

IREE_HINT = "install the IREE compiler and runtime: pip install 'gawee[iree]'"


def iree_unavailable() -> str | None:
    """Why IREE cannot run here (its compiler or runtime package is not importable), or None."""
    try:
        _import_iree()
    except ModuleNotFoundError as e:
        return str(e)
    return None


def _import_iree():
    try:
        import iree.compiler as compiler
        import iree.runtime as runtime
    except ModuleNotFoundError as e:
        raise ModuleNotFoundError(
            f"the IREE backend needs the iree-base-compiler and iree-base-runtime packages: {IREE_HINT}"
        ) from e
    return compiler, runtime


def compile_flags(target_cpu: str = "host", input_type: str = "stablehlo") -> list[str]:
    """iree-compile flags: ``input_type`` input (gawee's is StableHLO; ``torch`` for iree-turbine's
    export, which the benchmark compiles the same way), the local device, llvm-cpu code for
    ``target_cpu``, and convolutions as im2col + matmul.

    ``"host"`` is this machine as IREE's runtime sees it (:func:`host_cpu_features`), not
    ``--iree-llvmcpu-target-cpu=host``: that flag takes LLVM's CPU *name* and the features the name
    implies, so a virtual machine that hides AVX-512 from an AVX-512 CPU (its CPU name still the
    AVX-512 one) got code tuned for AVX-512 that ran several times slower than AVX2 code. Any other
    value is an LLVM CPU name (``"generic"``: portable). im2col
    (``--iree-global-opt-use-im2col-for-convs``) makes convolutions matmuls, IREE's fast path on
    CPU: resnet18 ran 7× faster with it (docs/mlir.md, "Compiling and running"). float64 stays float64
    (IREE demotes it to float32 by default: a float64 model's module then refused its own inputs)."""
    if target_cpu == "host":
        features = host_cpu_features()
        target = [f"--iree-llvmcpu-target-cpu-features={features}" if features else "--iree-llvmcpu-target-cpu=host"]
    else:
        target = [f"--iree-llvmcpu-target-cpu={target_cpu}"]
    return [
        f"--iree-input-type={input_type}",
        "--iree-hal-target-device=local",
        "--iree-hal-local-target-device-backends=llvm-cpu",
        *target,
        "--iree-global-opt-use-im2col-for-convs",
        "--iree-input-demote-f64-to-f32=false",
    ]


@functools.cache
def host_cpu_features() -> str | None:
    """The host's x86-64 features as LLVM feature flags (``+avx,+fma,+avx2,...``), read from
    ``iree-cpuinfo``, IREE's runtime CPUID probe (what hides from the VM is absent there); None
    on other architectures or when the tool is missing (then ``target-cpu=host`` is used)."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return None
    try:
        from iree import _runtime_libs

        tool = os.path.join(_runtime_libs.__path__[0], "iree-cpuinfo")
        out = subprocess.run([tool], capture_output=True, text=True, timeout=30, check=True).stdout
    except (ImportError, OSError, subprocess.SubprocessError):
        return None
    rows = (line.split() for line in out.splitlines())
    return ",".join(f"+{row[0]}" for row in rows if len(row) == 2 and row[1] == "1") or None


def compile_iree(
    mlir: str, *, target_cpu: str = "host", input_type: str = "stablehlo", extra_args: Sequence[str] = ()
) -> bytes:
    """Compile StableHLO text to an IREE VM flatbuffer (.vmfb) for the CPU; LoweringError if IREE rejects it."""
    compiler, _ = _import_iree()
    try:
        return compiler.compile_str(mlir, extra_args=[*compile_flags(target_cpu, input_type), *extra_args])
    except compiler.CompilerToolError as e:
        text = str(e)
        first = next((line for line in text.splitlines() if "error:" in line), text.strip().splitlines()[0])
        hint = "write the module with to_mlir and run iree-compile on it to see the whole diagnostic"
        if "undefined symbol" in first and "xf64>" in mlir:  # a libm call IREE's CPU runtime has in float32 only
            hint = "IREE's CPU code has no float64 form of that math function: run the model in float32 (model.float())"
        raise LoweringError(f"iree-compile rejected the module: {first.strip()}", hint=hint) from None


def _parameter_index(parameters: Mapping[str, torch.Tensor]):
    """An IREE parameter index over the tensors' own memory (kept alive by the caller), and those arrays."""
    _, rt = _import_iree()
    index = rt.ParameterIndex()
    arrays = []
    for name, data in parameters.items():
        t = data.detach().cpu().contiguous()
        arr = (t.view(torch.int16) if t.dtype == torch.bfloat16 else t).numpy()
        arr = arr.astype(arr.dtype.newbyteorder("<"), copy=False)
        arrays.append(arr)
        index.add_buffer(name, arr)
    return index, arrays


def write_parameters(path: str | os.PathLike, parameters: Mapping[str, torch.Tensor]) -> Path:
    """The parameters of a module with external weights as an IREE parameter archive (``.irpa``), written
    atomically: ``iree-run-module --module=X.vmfb --parameters=gawee=X.irpa``, or :class:`IreeModule`'s
    ``parameters=``."""
    index, _ = _parameter_index(parameters)
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        index.create_archive_file(tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


def write_artifacts(
    lowered: MlirModule,
    vmfb: bytes | None,
    mlir_path: str | os.PathLike | None,
    vmfb_path: str | os.PathLike | None,
    *,
    parameters: bool = True,
) -> list[Path]:
    """The module's text at ``mlir_path`` and its compiled flatbuffer at ``vmfb_path`` (each if asked for), and
    with external weights (unless ``parameters=False``) their parameters beside the flatbuffer (else the text)
    as ``.irpa``; each written atomically. Returns the paths written. (Callers write the text before compiling,
    so that a module IREE rejects can still be inspected.)"""
    written = []
    if mlir_path is not None:
        written.append(Path(mlir_path))
        write_output(written[-1], lowered.text.encode())
    if vmfb_path is not None and vmfb is not None:
        written.append(Path(vmfb_path))
        write_output(written[-1], vmfb)
    if lowered.parameters and parameters and written:
        written.append(write_parameters(written[-1].with_suffix(".irpa"), lowered.parameters))
    return written


class IreeModule:
    """A compiled module on IREE's CPU runtime: call it with torch tensors, get torch tensors back.

    Returns the outputs as a tuple, like :func:`gawee.run`, or arranged as ``output_structure``
    (a pytree spec: the model's own nesting, as :func:`gawee.compile` passes it). A module compiled with
    external weights (:func:`lower_mlir`) needs ``parameters``: the tensors by name, or the path of their
    ``.irpa`` archive (:func:`write_parameters`; mapped, not read into memory).
    """

    def __init__(
        self,
        vmfb: bytes,
        input_types: Sequence[TensorType],
        output_types: Sequence[TensorType],
        *,
        func_name: str = "main",
        output_structure: Any = None,
        driver: str = "local-task",
        parameters: Mapping[str, torch.Tensor] | str | os.PathLike | None = None,
        input_names: Sequence[str] | None = None,
    ):
        _, rt = _import_iree()
        self.vmfb = vmfb
        self.input_types = list(input_types)
        names = input_names if input_names is not None else [f"input{i}" for i in range(len(self.input_types))]
        self.signature = InputSignature(names, self.input_types)
        self.output_types = list(output_types)
        self.output_structure = None if output_structure is None else as_structure(output_structure)
        self._config = rt.Config(driver)
        self._context = rt.SystemContext(config=self._config)
        self._parameters = None  # the index and the memory it points into live as long as the module
        if parameters is not None:
            if isinstance(parameters, Mapping):
                self._parameters = _parameter_index(parameters)
            else:
                index = rt.ParameterIndex()
                index.load(os.fspath(parameters))
                self._parameters = (index, None)
            provider = self._parameters[0].create_provider(scope=PARAMETER_SCOPE)
            self._context.add_vm_module(rt.create_io_parameters_module(self._config.vm_instance, provider))
        vm_module = rt.VmModule.copy_buffer(self._config.vm_instance, vmfb)
        try:
            self._context.add_vm_module(vm_module)
        except ValueError as e:
            if "io_parameters" not in str(e):
                raise
            raise LoweringError(
                "the module was compiled with external weights (IREE parameters) and none were given",
                hint="pass parameters= (the tensors, or the .irpa archive written beside the .vmfb)",
            ) from None
        try:
            self._fn = self._context.modules[vm_module.name][func_name]
        except KeyError:
            raise LoweringError(f"the compiled module has no function {func_name!r}") from None
        self.gawee_report = None

    def __call__(self, *args: torch.Tensor, **kwargs: torch.Tensor):
        result = self._fn(*numpy_inputs(self.signature.inputs(args, kwargs), self.input_types, "the IREE runtime"))
        results = result if isinstance(result, (tuple, list)) else (result,)
        return arrange([torch.from_numpy(_host(r).copy()) for r in results], self.output_structure)


def _host(r):
    return r.to_host() if hasattr(r, "to_host") else r


class IreeRuntime(Runtime):
    """IREE on gawee's StableHLO (:func:`lower_mlir`, :func:`compile_iree`, :class:`IreeModule`); static shapes.
    Not measured by ``backend="auto"`` (compiling takes long beside the others). Tried apart first: the compiled
    module is native code."""

    name = "iree"
    title = "IREE"
    auto = False
    isolated = True
    options = ("mlir_path", "vmfb_path")
    mismatch_hint = "write the module with mlir_path= and report the model with it"

    def unavailable(self) -> str | None:
        return iree_unavailable()

    def cannot_run(self, graph: Graph) -> str | None:
        if any(v.type.symbolic for v in graph.inputs):
            return "symbolic shapes (IREE compiles static shapes only: compile with dynamic_shapes=None)"
        return None

    def unavailable_error(self, why: str) -> Exception:
        return ModuleNotFoundError(why)

    def build(
        self,
        graph: Graph,
        example_inputs: Sequence[torch.Tensor],
        *,
        output_structure: Any = None,
        mlir_path: str | os.PathLike | None = None,
        vmfb_path: str | os.PathLike | None = None,
    ) -> IreeModule:
        """The module compiled for the host CPU; the artifacts asked for are written atomically (with external
        weights, their parameter archive too: :func:`write_artifacts`)."""
        return self.builds(
            graph, example_inputs, output_structure=output_structure, mlir_path=mlir_path, vmfb_path=vmfb_path
        )[0]()

    def builds(
        self,
        graph: Graph,
        example_inputs: Sequence[torch.Tensor],
        *,
        output_structure: Any = None,
        mlir_path: str | os.PathLike | None = None,
        vmfb_path: str | os.PathLike | None = None,
        shared: dict | None = None,
    ):
        """The graph lowered and compiled once, here; the module is loaded on IREE's task driver here and on its
        synchronous driver in a trial process (a forked child cannot use the task driver once this process has:
        IREE keeps one per process, and its worker threads are not in the child; the dispatches are the same).
        ``shared`` is unused: IREE has one variant."""
        lowered = lower_mlir(graph)
        write_artifacts(lowered, None, mlir_path, None, parameters=vmfb_path is None)  # the text, even if rejected
        vmfb = compile_iree(lowered.text)
        write_artifacts(lowered, vmfb, None, vmfb_path)

        def build(driver: str = "local-task") -> IreeModule:
            return IreeModule(
                vmfb,
                [v.type for v in graph.inputs],
                [v.type for v in graph.outputs],
                output_structure=output_structure,
                driver=driver,
                parameters=lowered.parameters or None,
                input_names=[v.name for v in graph.inputs],
            )

        return build, functools.partial(build, "local-sync")


RUNTIME = IreeRuntime()
