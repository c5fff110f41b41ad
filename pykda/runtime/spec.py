"""A kernel specialization: template name + compile-time parameters + target architecture."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping


@dataclass(frozen=True)
class KernelSpec:
    """Frozen and hashable; `params` are the template's compile-time constants."""

    template: str
    params: tuple[tuple[str, Any], ...]
    arch: str = "sm_90a"
    kernels: tuple[str, ...] = field(default=(), compare=False)

    @staticmethod
    def make(template: str, params: Mapping[str, Any], arch: str = "sm_90a",
             kernels: tuple[str, ...] = ()) -> "KernelSpec":
        return KernelSpec(template, tuple(sorted(params.items())), arch, tuple(kernels))

    @property
    def param_dict(self) -> dict[str, Any]:
        return dict(self.params)

    def describe(self) -> str:
        return " ".join(f"{k}={v}" for k, v in self.params)
