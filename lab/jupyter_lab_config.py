"""JupyterLab as `make lab` starts it: `jupyter lab --config=lab/jupyter_lab_config.py`.

Everything here is a default that the command line overrides: `make lab LAB_FLAGS=--ip=0.0.0.0`
(or `--ServerApp.ip=...`) serves on another address, `LAB_PORT=...` picks the port.
"""
import os
from pathlib import Path

HERE = Path(__file__).resolve().parent

c = get_config()  # noqa: F821 (provided by the traitlets config loader)

c.ServerApp.ip = "127.0.0.1"
c.ServerApp.root_dir = str(HERE.parent)
c.ServerApp.allow_root = hasattr(os, "geteuid") and os.geteuid() == 0

# The lab's default settings for this project: lab/settings/overrides.json (autosave off, no news).
# A reader's own settings (Settings menu, or ~/.jupyter/lab/user-settings) still take precedence.
c.LabApp.app_settings_dir = str(HERE / "settings")

# No announcements feed and no update check: no pop-up, no request leaves the machine.
c.LabApp.news_url = None
c.LabApp.check_for_updates_class = "jupyterlab.NeverCheckForUpdate"
