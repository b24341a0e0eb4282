"""The Gradio UI: thin tabs over the studio (the app's backend). Only this package imports gradio."""

from .app import build_app

__all__ = ["build_app"]
