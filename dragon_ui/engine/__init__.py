"""The training engine, which knows nothing of the app: where a run trains (hardware), the weights it starts from
(models, quantization), the training itself, the held-out evaluation, and what it leaves (weights: adapter zips and
merged models). It reads a validated RunConfig and writes a run directory (runstore)."""
