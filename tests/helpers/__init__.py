"""What the tests share (importable as ``helpers``: pyproject.toml puts tests/ on
pytest's path): ``relpos`` (op inputs, the devices), ``nn``, ``cli`` (the training
CLI as cmd/main.py runs it), ``timm`` (timm, or a skip that says why)."""

import os

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository
