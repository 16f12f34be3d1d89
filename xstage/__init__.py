"""xstage: measure X-Stage (post-issue remote-store progress over NVLink), fit the Burst-Gap model, and
reproduce the paper's figures — on GPUs when present, from recorded measurements otherwise.

Importing xstage on a machine without CUDA turns on Triton's CPU interpreter (``TRITON_INTERPRET=1``) before
any kernel is defined, so the same kernels run on small shapes there. Set ``TRITON_INTERPRET`` yourself to
override.
"""
import os as _os

__version__ = "0.1.0"


def _choose_triton_mode() -> None:
    if "TRITON_INTERPRET" in _os.environ:
        return
    import torch

    if not torch.cuda.is_available():
        _os.environ["TRITON_INTERPRET"] = "1"


_choose_triton_mode()

# The public attention API, imported on first use (``import xstage`` stays light: the CLI's --help, the data side):
# xstage.attention (xstage.attention_api) and xstage.UlyssesAttention (xstage.ulysses_layer).
_PUBLIC = {"attention": "attention_api", "UlyssesAttention": "ulysses_layer"}


def __getattr__(name: str):
    if name in _PUBLIC:
        import importlib

        return getattr(importlib.import_module(f"{__name__}.{_PUBLIC[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(list(globals()) + list(_PUBLIC))
