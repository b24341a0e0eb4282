"""Build the Dragon GRPO Studio app: a recipe picker over five tabs, each a module with ``build(shared)``.

The app never owns a training: it asks the Studio to start one and then only reads the run directory, so a page
reload or a second browser simply re-attaches (``demo.load``) to whatever is running.
"""

from __future__ import annotations

import argparse
import os

import gradio as gr

from ..studio import ASSETS_DIR, DEFAULT_RECIPE, Studio
from . import compare_tab, data_tab, model_tab, rewards_tab, train_tab
from .common import TAB_COMPARE, TAB_DATA, TAB_MODEL, TAB_REWARDS, TAB_TRAIN, Shared, message, shows_errors

TITLE = "Dragon GRPO Studio"
INTRO = ("Teach a small language model with rewards you can check: pick data, build rewards, choose a model and "
         "press **Start**, then watch it learn and compare it with where it began.")


def build_app(studio: Studio | None = None) -> gr.Blocks:
    studio = studio or Studio()
    with gr.Blocks(title=TITLE) as demo:
        with gr.Row(equal_height=True):
            gr.Markdown(f"# 🐉 {TITLE}\n{INTRO}", elem_id="intro")
            with gr.Column(scale=0, min_width=320):
                recipe = gr.Dropdown(studio.recipe_names(), value=DEFAULT_RECIPE, label="Recipe",
                                     info="Loads data, rewards and settings in one click.", elem_id="recipe")
                load_recipe = gr.Button("Load recipe", size="sm", elem_id="load-recipe")
        recipe_status = gr.Markdown(elem_id="recipe-status")
        if studio.public:
            gr.Markdown(message("This is a public demo: custom Python and command rewards are turned off here. "
                                "Run it on your own machine (`make run`) to use them.", "warn"))
        shared = Shared(studio=studio, draft=gr.State({}), config_loaded=gr.State(0), run_id=gr.State(""),
                        timer=gr.Timer(1.0, active=False), tabs=None)
        with gr.Tabs(elem_id="tabs") as tabs:
            shared.tabs = tabs
            with gr.Tab("1 · Data", id=TAB_DATA, elem_id="tab-data"):
                data_tab.build(shared)
            with gr.Tab("2 · Rewards", id=TAB_REWARDS, elem_id="tab-rewards"):
                rewards_tab.build(shared)
            with gr.Tab("3 · Model & Hardware", id=TAB_MODEL, elem_id="tab-model"):
                model_tab.build(shared)
            with gr.Tab("4 · Train", id=TAB_TRAIN, elem_id="tab-train"):
                train_tab.build(shared)
            with gr.Tab("5 · Compare", id=TAB_COMPARE, elem_id="tab-compare"):
                compare_tab.build(shared)

        @shows_errors
        def on_recipe(name: str, loaded: int):
            return studio.load_recipe(name), loaded + 1, message(f"Loaded the {name} recipe: data, rewards and settings.", "ok")

        load_recipe.click(on_recipe, [recipe, shared.config_loaded], [shared.draft, shared.config_loaded, recipe_status],
                          api_name="load_recipe")

        def on_page_load(loaded: int):
            """Fresh draft from the default recipe, and re-attach to a running (or the latest) run."""
            active = studio.active_run_id()
            runs = studio.runs()
            run_id = active or (runs[0]["id"] if runs else "")
            return studio.default_draft(), loaded + 1, run_id, gr.Timer(active=bool(active))

        demo.load(on_page_load, [shared.config_loaded], [shared.draft, shared.config_loaded, shared.run_id, shared.timer],
                  api_visibility="private")
    return demo


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python app.py", description=f"{TITLE}: point-and-click GRPO in the browser.")
    on_space = bool(os.environ.get("SPACE_ID"))
    parser.add_argument("--host", default=os.environ.get("GRADIO_SERVER_NAME", "0.0.0.0" if on_space else "127.0.0.1"))
    parser.add_argument("--port", type=int, default=int(os.environ.get("GRADIO_SERVER_PORT", 7860)))
    parser.add_argument("--share", action="store_true", help="also serve through a public gradio.live link")
    parser.add_argument("--no-browser", action="store_true", help="do not open a browser tab")
    parser.add_argument("--runs-dir", help="folder for runs (default: $DRAGON_UI_RUNS_DIR or ./runs)")
    args = parser.parse_args(argv)

    studio = Studio(runs_dir=args.runs_dir)
    demo = build_app(studio)
    demo.queue(default_concurrency_limit=4).launch(
        server_name=args.host, server_port=args.port, share=args.share, inbrowser=not (args.no_browser or on_space),
        theme=gr.themes.Soft(primary_hue="emerald"), css_paths=[str(ASSETS_DIR / "app.css")],
        allowed_paths=[str(studio.runs_dir)], show_error=True, footer_links=["api", "gradio"],
    )
    return 0
