"""posattn experiments: `python cmd/main.py --help`.

Defaults in cmd/config.yml (beside this file); -D<key>=<value> overrides, with
posattn's keys or the thesis'; modes train (default), test, sweep, sweep_agent,
local_sweep, shift_test and scaling. Sweep files are found by name in
experiments/sweeps/. The code lives in posattn.training.
"""

import sys
from pathlib import Path

from posattn.training.cli import main

HERE = Path(__file__).resolve().parent

if __name__ == "__main__":
    sys.exit(main(defaults_file=str(HERE / "config.yml"), sweep_dir=str(HERE.parent / "experiments" / "sweeps")))
