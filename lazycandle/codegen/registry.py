"""The code generator of each kernel spec class (ir.kernels.KernelSpec's build / compiled /
lanes): each codegen module registers its functions for its spec class on import, so a spec
builds and compiles through one protocol while ir never imports codegen."""
from __future__ import annotations

from dataclasses import dataclass

from ..ir.kernels import KernelSpec


@dataclass(frozen=True)
class Codegen:
    build: object       # spec -> LLVM module text
    compiled: object    # spec -> the compiled function (from the one kernel cache, codegen/jit.py)
    lanes: object       # spec -> vector width on this host


def register(spec_cls, build, compiled, lanes=lambda spec: 1) -> None:
    """Make `spec_cls` instances build with `build`, compile through `compiled`."""
    KernelSpec.codegen[spec_cls] = Codegen(build, compiled, lanes)


def registered() -> dict:
    """{spec class: Codegen} of every code generator imported so far."""
    return dict(KernelSpec.codegen)
