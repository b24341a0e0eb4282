"""The Gradio UI: thin tabs over the engine. Only this package imports gradio."""

from .app import build_app

__all__ = ["build_app"]
