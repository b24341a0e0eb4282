"""The app's gradio-free backend: the Studio the UI is given (backend: recipes, runs, previews, files), and what the
tabs compute and show — the data preview and reward playground, the form's drafts and messages, the memory and time
estimate, the model presets, watching a run, and the before/after comparison. Tests call all of it without a
browser."""
