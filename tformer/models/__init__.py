"""The five source systems, one file each (see ``shared/seeds``); import from the submodules or from here."""
