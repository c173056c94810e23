"""The experiment layer behind ``cmd/main.py``:

- ``cli``: the command line and its modes; ``cmd/main.py`` passes its defaults file and sweep folder;
- ``config``, ``values``, ``thesis``: configuration (YAML defaults, ``-D`` overrides, the thesis' key names);
- ``data``: the datasets; ``train``: model building, the trainer and checkpoints; ``runs``: one run;
- ``tracking``: W&B and metrics files; ``sweep``: local and W&B sweeps; ``shift``: the shifted-image test;
- ``scaling``: the scaling study; ``report``: tables, CSV files and plots; ``optional``: W&B imports.
"""
