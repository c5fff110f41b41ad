"""Serving engines' own call signatures over pykda's ops, so that a call site switches by its
import alone: `pykda.compat.sglang`, `pykda.compat.vllm` (KDA), `pykda.compat.flashinfer`
(FlashInfer's decode calls); and pykda as a backend of fla's own dispatch, so that code calling
fla switches with no change at all: `pykda.compat.fla`."""


def no_extra(name: str, kwargs: dict) -> None:
    """Refuse, by name, the arguments of an engine's call that pykda does not take."""
    if kwargs:
        raise ValueError(f"{name}: arguments pykda does not take: {', '.join(sorted(kwargs))}")
