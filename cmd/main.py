"""posattn experiments: `python cmd/main.py --help`.

Defaults in cmd/config.yml; -D<key>=<value> overrides; modes train (default), test,
sweep, sweep_agent, local_sweep, shift_test and scaling. The code lives in posattn.experiment.
"""
import sys

from posattn.experiment.cli import main

if __name__ == "__main__":
    sys.exit(main())
