"""Callbacks that trace a framework's training loop with a `gradscape.Tracer`.

- `gradscape.integrations.lightning.GradscapeCallback`: Lightning's `Trainer` (`pip install 'gradscape[lightning]'`).
- `gradscape.integrations.huggingface.GradscapeCallback`: `transformers.Trainer`
  (`pip install 'gradscape[huggingface]'`).
- Accelerate needs no callback: a loop written with `accelerator.backward(loss)` is traced by a plain
  `gradscape.Tracer` around each optimizer step.

Each module imports its framework when it is imported itself; this package and `import gradscape`
import none of them. What the two callbacks share (checking their options, the optimizer-step span both
hold open) is in `_window.py`.
"""
