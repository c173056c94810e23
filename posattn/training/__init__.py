"""The experiment layer behind ``cmd/main.py``: configuration (``config``), data
(``data``), training and checkpoints (``train``), W&B logging (``tracking``),
sweeps (``sweep``), the shifted-image test (``shift``) and the CLI (``cli``)."""
